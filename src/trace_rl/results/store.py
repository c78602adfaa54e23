"""The compact results store: what the published tables need of a study's runs, one gzip JSON-lines file a study.

A study is a `trace-rl compare` output directory (LM runs: OUT/<method>/<pair>/) or a `trace-rl simulate` output
directory (testbed runs: OUT/seed<k>/metrics.jsonl). A run directory holds about 1 MB (per-node predictions, every
metric of every step, checkpoints); the store keeps, per run, the figures `trace-rl report` reads:

- the summary (seed, steps, accuracy before and after with its standard error, rollouts, the warm start's digest,
  the held-out and pool digests the pairing check reads);
- per step, the metrics named in `STEP_KEYS` (accuracy curves against rollouts, tokens and turns; effective ratio;
  flips and continuations; contrast groups; prompts given a rollout; the update's KL);
- for tree methods, the prefixes stage 2 chose (`ANCHOR_COLUMNS`: the ones with continuations), which is all the
  flip calibration's predicted share, realised share and interval read (`predictors.calibration.flip_share_interval`).

Floats are kept to 6 significant digits (a table prints 3); a run is about 3-15 KB compressed. What it does not
keep: the scores of prefixes stage 2 did not choose (so the recalibrated and raw q of all anchors, and the V~
reliability at roots and prefixes, are `trace-rl diagnose`'s on the run directory, not the store's), trees and
checkpoints. Reading is bounded (`MAX_STORE_BYTES` compressed, `MAX_LINE_BYTES` a run) and every line is checked.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path

from ..rollout.records import read_metrics
from ..safe_read import read_json, read_lines

STORE_SUFFIX = ".jsonl.gz"
FORMAT = 1
MAX_STORE_BYTES = 64 << 20
MAX_LINE_BYTES = 4 << 20
STEP_KEYS = (
    "step",
    "eval/accuracy",
    "eval/accuracy_before",
    "train/rollouts_total",
    "rollout/rollouts",
    "rollout/turns",
    "rollout/generated_tokens",
    "rollout/effective_ratio",
    "rollout/contrast_groups",
    "rollout/flips",
    "rollout/continuations",
    "alloc/active_prompts",
    "train/update_kl",
)
SUMMARY_KEYS = (
    "seed",
    "steps",
    "accuracy_before",
    "accuracy_after",
    "accuracy_se",
    "rollouts",
    "held_out_digest",
    "pools_digest",
)
ANCHOR_COLUMNS = ("step", "depth", "predicted", "bare_reward", "continuations", "flips", "flip_pred")
_PAIR = re.compile(r"(?:ws(\d+)-)?seed(\d+)")


class StoreError(ValueError):
    """A store file that cannot be read as one (named, with the line)."""


def _num(x):
    """6 significant digits for a float; NaN and infinities as None (the store is strict JSON)."""
    if isinstance(x, bool) or not isinstance(x, float):
        return x
    return float(f"{x:.6g}") if math.isfinite(x) else None


def _jsonl(path: Path) -> list[dict]:
    """A run's records (metrics.jsonl, predictions.jsonl), within safe_read.BOUNDS["records"]."""
    rows = []
    for lineno, line in read_lines(path, "records"):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except (json.JSONDecodeError, RecursionError):
                raise StoreError(f"{path}:{lineno}: not JSON") from None
    return rows


def compact_records(records: list[dict]) -> list[dict]:
    """The step records with only `STEP_KEYS`, floats to 6 significant digits."""
    return [{k: _num(r[k]) for k in STEP_KEYS if k in r} for r in records]


def compact_anchors(predictions: list[dict]) -> list[list]:
    """The chosen prefixes of a run's prediction records, as rows of `ANCHOR_COLUMNS` (flip_pred None where the
    record has none: stage 2 then allocated on q of V~)."""
    rows = []
    for r in predictions:
        if r.get("depth", 0) >= 1 and "bare_reward" in r and r.get("continuations", 0) > 0:
            rows.append([_num(r.get(c)) for c in ANCHOR_COLUMNS])
    return rows


def compact_lm_run(run_dir: Path, method: str) -> dict:
    """One finished `train` run of a compare study as a store line."""
    try:
        summary = read_json(run_dir / "train_summary.json", strict=False)  # bounded (64 MiB); NaN from older runs
    except ValueError as err:
        raise StoreError(f"{run_dir / 'train_summary.json'}: {err}") from None
    m = _PAIR.fullmatch(run_dir.name)
    if m is None:
        raise StoreError(f"{run_dir}: not a compare run directory (seed<k> or ws<W>-seed<k>)")
    line = {
        "kind": "lm",
        "method": method,
        "pair": run_dir.name,
        "warm": int(m.group(1) or 0),
        "summary": {k: _num(summary[k]) for k in SUMMARY_KEYS if k in summary},
        "warm_start": (summary.get("warm_start") or {}).get("weights_digest"),
        "records": compact_records(_jsonl(run_dir / "metrics.jsonl")),
    }
    if (run_dir / "predictions.jsonl").is_file():
        line["anchors"] = compact_anchors(_jsonl(run_dir / "predictions.jsonl"))
    return line


def compact_testbed_seed(seed_dir: Path) -> list[dict]:
    """One seed of a `simulate` study (every method's records) as store lines, one per method."""
    seed = int(seed_dir.name.removeprefix("seed"))
    by_method = read_metrics(seed_dir / "metrics.jsonl")  # bounded, checked, grouped by method (NaN: null again)
    return [
        {
            "kind": "testbed",
            "method": m,
            "pair": seed_dir.name,
            "warm": 0,
            "summary": {"seed": seed},
            "records": compact_records(recs),
        }
        for m, recs in by_method.items()
    ]


def compact_study(
    out: Path, methods: tuple[str, ...] | None = None, anchors: tuple[str, ...] | None = None
) -> list[dict]:
    """Every finished run of a compare or simulate output directory as store lines (in a stable order): of
    `methods` only when given, with stage 2's chosen prefixes of the `anchors` methods only when given."""
    out = Path(out)
    lines: list[dict] = []
    for seed_dir in sorted(p for p in out.glob("seed*") if (p / "metrics.jsonl").is_file()):
        lines += compact_testbed_seed(seed_dir)
    for summary in sorted(out.glob("*/*seed*/train_summary.json")):
        run = summary.parent
        if _PAIR.fullmatch(run.name):
            lines.append(compact_lm_run(run, run.parent.name))
    if methods is not None:
        lines = [line for line in lines if line["method"] in methods]
    if anchors is not None:
        for line in lines:
            if line["method"] not in anchors:
                line.pop("anchors", None)
    if not lines:
        raise StoreError(f"{out}: no finished run (a compare output <method>/<pair>/ or a simulate one seed<k>/)")
    return lines


def write_store(path: Path, lines: list[dict]) -> Path:
    """Write a store (strict JSON, a header line first, then one run a line) byte for byte the same for the same
    runs: gzip's name and time are left out."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"store": FORMAT, "runs": len(lines)}) + "\n"
    text += "".join(json.dumps(line, allow_nan=False, sort_keys=True) + "\n" for line in lines)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(text.encode())
    tmp.replace(path)
    return path


def read_store(path: Path) -> list[dict]:
    """The run lines of a store, each checked for the fields every reader needs."""
    path = Path(path)
    if not path.is_file():
        raise StoreError(f"{path}: no such store")
    if path.stat().st_size > MAX_STORE_BYTES:
        raise StoreError(f"{path}: over {MAX_STORE_BYTES >> 20} MiB compressed, not a results store")
    lines: list[dict] = []
    try:
        with gzip.open(path, "rb") as gz:
            head = json.loads(gz.readline(MAX_LINE_BYTES))
            if not isinstance(head, dict) or head.get("store") != FORMAT:
                raise StoreError(f"{path}: not a results store of format {FORMAT}")
            for lineno, raw in enumerate(iter(lambda: gz.readline(MAX_LINE_BYTES + 1), b""), 2):
                if len(raw) > MAX_LINE_BYTES:
                    raise StoreError(f"{path}:{lineno}: a run line over {MAX_LINE_BYTES:,} bytes")
                line = json.loads(raw)
                if not isinstance(line, dict) or not {"kind", "method", "pair", "summary", "records"} <= set(line):
                    raise StoreError(f"{path}:{lineno}: not a run line")
                lines.append(line)
    except (OSError, EOFError, json.JSONDecodeError, RecursionError) as err:
        raise StoreError(f"{path}: not a readable results store ({type(err).__name__})") from None
    if len(lines) != head.get("runs"):
        raise StoreError(f"{path}: {len(lines)} runs where its header says {head.get('runs')} (cut short?)")
    return lines


def records_as_nan(records: list[dict]) -> list[dict]:
    """Records with the store's nulls read back as NaN (as `rollout.records.read_metrics` reads a run's)."""
    return [{k: math.nan if v is None else v for k, v in r.items()} for r in records]
