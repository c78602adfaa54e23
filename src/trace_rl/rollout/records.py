"""One metrics record per method and step, one writer, one reader: every command logs the same schema.

A record is flat JSON with slash-namespaced keys (verl's and TRL's convention):
- `method`, `step`, `seed`
- `rollout/*`: what the trees hold: effective_ratio (share of active prompts with a success and a failure),
  contrast_groups and contrast_groups_per_1k (per 1,000 rollouts), success_rate, rollouts, bare_rollouts,
  continuations, flips (continuations that ended unlike their bare rollout), turns, prefix_turns,
  generated_tokens, prefix_generated_tokens, worker_retries (prompts started again after their Ray worker died)
- `alloc/*`: how the budget was placed: pool, active_prompts, prefix_share (continuations / rollouts),
  unspent_prefix_budget
- `predictor/*`: loss of the update and its examples (examples_root, examples_prefix); V~ against V^:
  spearman_root, spearman_depth_1, spearman_prefix, ece, brier; calibration against outcomes no choice biased
  (`predictors.calibration.step_calibration`): calib_root_{n,pred,real,ece}, calib_prefix_{n,pred,real,ece},
  calib_prefix_d1_{n,pred,real} .. d4plus_*, and the chosen prefixes' flips flip_{chosen,continuations,pred,
  raw,real,anchors_pred} (pred: the q stage 2 allocated on; raw: q from V~ alone), flip_d1_{continuations,pred,
  real} .. d4plus_*
- `timing_s/*`: generate, env, predictor, allocate, total, overhead, and what the command adds (update, eval)
- `eval/*` and `train/*`: added by the command when it evaluates or trains (e.g. eval/accuracy)
Summaries (`rollout.report`), plots and `diagnose` read these keys only.

The file is strict JSON, which jq and other readers take: a value that is not a finite number (a standard error
of one sample is NaN) is written as null, and `read_metrics` reads a null metric back as NaN, so the numbers in
memory are those that were logged (an infinity comes back as NaN). Files written before, with bare `NaN`, still
read.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import UserError
from ..metrics import continuation_flips, contrast_groups, effective_ratio, mean_reward, tree_budget
from ..predictors.calibration import step_calibration
from ..predictors.diagnostics import node_records, spearman_rho, step_diagnostics
from ..safe_read import BadFile, read_lines, read_raw_lines
from ..strict_json import dumps as finite_json  # strict JSON: NaN and infinities as null
from .engine import StepResult

GROUPS = ("rollout", "alloc", "predictor", "timing_s", "eval", "train")


@dataclass
class StepRecord:
    method: str
    step: int
    seed: int = 0
    rollout: dict = field(default_factory=dict)
    alloc: dict = field(default_factory=dict)
    predictor: dict = field(default_factory=dict)
    timing_s: dict = field(default_factory=dict)
    eval: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)

    def flat(self) -> dict:
        out: dict = {"method": self.method, "step": self.step, "seed": self.seed}
        for group in GROUPS:
            out.update({f"{group}/{k}": v for k, v in getattr(self, group).items()})
        return out


def _spearman_depth_1(records: list[dict]) -> dict:
    recs = [r for r in records if r["depth"] == 1]
    if len(recs) < 3:
        return {}
    rho = spearman_rho([r["predicted"] for r in recs], [r["target"] for r in recs])  # numpy only: no SciPy needed
    return {"spearman_depth_1": float(rho)} if rho == rho else {}


def step_record(result: StepResult, seed: int = 0) -> StepRecord:
    """The record of one step, from its trees and what the engine counted."""
    trees, active = result.trees, result.active
    budget = tree_budget(active)
    flips, _ = continuation_flips(active)
    rollouts = result.rollouts
    nodes = node_records(active)
    diag = {k.removeprefix("diag_"): v for k, v in step_diagnostics(active).items()}
    diag.update(_spearman_depth_1(nodes))
    diag.update(step_calibration(nodes))
    if result.predictor_loss is not None:
        diag["loss"] = result.predictor_loss
        diag["examples_root"], diag["examples_prefix"] = result.predictor_examples
    groups = contrast_groups(active)
    return StepRecord(
        method=result.method,
        step=result.step,
        seed=seed,
        rollout={
            "effective_ratio": effective_ratio(trees),
            "contrast_groups": groups,
            "contrast_groups_per_1k": 1000.0 * groups / max(rollouts, 1),
            "success_rate": mean_reward(active),
            "rollouts": rollouts,
            "bare_rollouts": result.bare_rollouts,
            "continuations": result.continuations,
            "flips": flips,
            "turns": budget.turns,
            "prefix_turns": budget.prefix_turns,
            "generated_tokens": result.generated_tokens,
            "prefix_generated_tokens": result.prefix_generated_tokens,
            "worker_retries": result.worker_retries,
        },
        alloc={
            "pool": len(trees),
            "active_prompts": len(active),
            "prefix_share": result.continuations / max(rollouts, 1),
            "unspent_prefix_budget": result.unspent_prefix_budget,
        },
        predictor=diag,
        timing_s={**result.time, "overhead": result.overhead},
    )


class MetricsWriter:
    """Appends flat records to `path` as JSON-lines. A run from the start empties the file, so a rerun into the
    same directory never mixes with an earlier run's records; a run resumed at step `start` keeps the records of
    the steps before it and drops the rest, which it redoes (`keep_records_before`; `warn` hears of a dropped
    line that is no record), so the file ends as an uninterrupted run's would."""

    def __init__(self, path: str | Path, start: int = 0, warn: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if start:
            keep_records_before(self.path, start, warn)
        if not start or not self.path.exists():
            self.path.write_text("")

    def write(self, record: StepRecord | dict) -> None:
        flat = record.flat() if isinstance(record, StepRecord) else record
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(finite_json(flat) + "\n")


def _metric_nulls_as_nan(rec: dict) -> dict:
    """A metric (a slash-namespaced key) logged as null was a NaN or an infinity: read back as NaN."""
    return {k: (math.nan if v is None and "/" in k else v) for k, v in rec.items()}


def read_metrics(path: str | Path) -> dict[str, list[dict]]:
    """Records of a metrics.jsonl by method, in step order (null metrics as NaN; old files with NaN read too).
    Each line within 16 MiB and the file within 4 GiB (safe_read.BOUNDS["records"]: TooLarge past them);
    NotRegularFile for a FIFO or a device."""
    out: dict[str, list[dict]] = {}
    for lineno, line in read_lines(path, "records"):  # bounded: safe_read.BOUNDS["records"]
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise ValueError(f"{path}:{lineno}: not JSON") from None
        if not isinstance(rec, dict) or "method" not in rec:
            raise ValueError(f"{path}:{lineno}: not a metrics record")
        out.setdefault(rec["method"], []).append(_metric_nulls_as_nan(rec))
    return out


def keep_records_before(path: str | Path, step: int, warn: Callable[[str], None] | None = None) -> None:
    """Rewrite a JSON-lines file of step records (metrics.jsonl, predictions.jsonl) keeping those of steps before
    `step`, for a resumed run that redoes the later ones. A line that is no record (one torn by a kill, garbage
    appended) is dropped with one line to `warn` naming the first; the file is replaced whole (write, rename),
    so a kill here leaves the old file or the new one. Read line by line within safe_read.BOUNDS["records"] (a
    line 16 MiB, the file 4 GiB): past them, or for a path that is not a regular file, one line (UserError) and
    the file is left as it was."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    bad: list[int] = []
    try:
        with open(tmp, "w", encoding="utf-8") as out:  # kept records go straight out: one line in memory at a time
            for lineno, raw in read_raw_lines(path, "records"):  # bounded: safe_read.BOUNDS["records"]
                rec = _step_record(raw)
                if rec is None and raw.strip():
                    bad.append(lineno)
                elif rec is not None and rec["step"] < step:
                    out.write(finite_json(rec) + "\n")  # a record from before strict JSON is rewritten as strict JSON
    except (BadFile, OSError) as err:  # past a bound, not a regular file (NotRegularFile), unreadable
        tmp.unlink(missing_ok=True)
        raise UserError(f"out: cannot rewrite {path} on resume ({err})") from None
    if bad and warn:
        warn(f"{path}: dropped {len(bad)} line(s) that are not records (first: line {bad[0]}), e.g. one torn by a kill")
    os.replace(tmp, path)


def _step_record(raw: bytes) -> dict | None:
    """The record on a line (a JSON object with an integer `step`), or None for one that is not (torn by a kill:
    cut mid-character or mid-object)."""
    try:
        rec = json.loads(raw.decode("utf-8", "replace"))
        rec_step = rec["step"]
    except (ValueError, RecursionError, KeyError, TypeError):
        return None
    return rec if isinstance(rec_step, int) and not isinstance(rec_step, bool) else None
