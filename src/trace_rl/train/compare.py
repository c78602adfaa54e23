"""`trace-rl compare` over `train` (`commands.compare`, command=train): a paired experiment. Every method trains
from the same start on each seed, with the same held-out set and the same candidate pools (both drawn from the
seed alone; the runs' digests are checked), at the same rollout budget per step; the table reads what the budget
bought. This module holds what is train's own: a run's config and its shared evaluation of the start
(`run_one`), finished runs and their settings (`load_runs`), the pairing check, the table and the plots
(`report`); `commands.compare` runs the jobs (warm starts, pairs, workers), each through `train`'s runner.

Per method (a method name, or `method:advantage` to train an allocation with another advantage estimator, so
allocation and update can be told apart): held-out accuracy before and after and the gain, each with a 95% t
interval over seeds; the paired difference to GRPO's final accuracy on the same seeds with a bootstrap 95%
interval; the same two for the accuracy averaged over the evaluations after the start (less at the mercy of the
last step's swing); the paired difference at equal tokens (both curves read at the smaller token total, linear
between evaluations); rollouts and generated tokens needed to reach GRPO's final accuracy of the same seed (first
crossing of the curve, 0 rollouts = the accuracy before), with a t interval over the seeds that reached it and
their count; effective ratio (and its ratio to GRPO's), contrast groups per 1k rollouts; the chain per step
(share of trained tokens with a non-zero advantage, gradient norm, KL of the update); rollouts, tokens and
wall-clock. PNG plots: accuracy against rollouts and against tokens (from 0, seed bands), effective ratio per
step, and the chain.

Resuming: a run whose train_summary.json says it finished is read, not rerun; an unfinished one resumes from
its newest checkpoint. Each run directory keeps the settings it was trained with (run_settings.json), and a
run trained with other settings is refused rather than mixed in. The table covers every finished run of the
listed methods found under `out`, seeds beyond those listed included, so a study grown over several
invocations (5 seeds of some methods, 3 of others) is summarised whole; each row says how many seeds it holds.
The evaluation before training, the same for every method of a seed, is computed once per seed (twice at most
with workers: two runs of a seed that start together both compute it). A run's figures depend on its seed and
on the torch thread count (the last bits of a matmul's sums), not on the number of workers: keep one thread
count per study.

Limits: with 3-5 seeds the intervals are wide and the bootstrap one is coarse (see `stats`); costs-to-target
average the seeds that got there, so read them with the count. Wall-clock sums the logged step, update and
evaluation times (not model loading) and depends on what else shared the machine.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from ..methods import METHODS
from ..rollout.records import read_metrics
from ..rollout.report import (
    accuracy_curve,
    at_equal_cost,
    cost_points,
    cost_to_target,
    format_interval,
    format_table,
    interval,
    paired_interval,
    run_means,
    summarize,
    write_summary,
)
from ..safe_read import read_json
from ..stack.env_config import upgrade_run_settings
from ..strict_json import dumps
from ..trace_config import method_spec
from .checkpoint import checkpoints
from .run_settings import RUN_SETTINGS, finished, run_settings, start_settings
from .trainer import TrainConfig

BASELINE = "grpo"
DEFAULT_METHODS = ("grpo", "pcl", "knapsack_rl", "tree_grpo", "treepo", "trace")
# The protocol: defaults are chosen on tuning seeds (below 100; every default so far was chosen on seeds 0-9), and
# results are reported on evaluation seeds (100 and up), on which no choice is ever made.
FIRST_EVALUATION_SEED = 100


def parse_method(spec: str) -> tuple[str, str]:
    """'trace' -> ('trace', ''); 'trace:grpo' -> ('trace', 'grpo'): allocation and advantage estimator; a method of
    one's own as module:attr[:advantage] (`trace_config.method_spec`)."""
    return method_spec(spec)


def run_dir_name(spec: str) -> str:
    name, advantage = parse_method(spec)
    return f"{name}_adv-{advantage}" if advantage else name


def method_of_dir(name: str) -> str:
    """The method a run directory is named for (`run_dir_name` backwards): 'trace_adv-grpo' -> 'trace:grpo'."""
    method, sep, advantage = name.partition("_adv-")
    return f"{method}:{advantage}" if sep else name


class Study(Protocol):
    """What this module reads of a compare config of command train (`commands.compare.CompareConfig`)."""

    out: str
    methods: list[str]
    warm_starts: list[int]
    train: TrainConfig


def pair_name(warm: int, seed: int) -> str:
    """A pair's directory name: seed{S} on the first warm start (as studies before warm starts were laid out),
    ws{W}-seed{S} on another."""
    return f"seed{seed}" if warm == 0 else f"ws{warm}-seed{seed}"


def parse_pair(name: str) -> tuple[int, int] | None:
    """pair_name's inverse: (warm start, seed), or None for another name."""
    m = re.fullmatch(r"(?:ws(\d+)-)?seed(\d+)", name)
    return None if m is None else (int(m.group(1) or 0), int(m.group(2)))


def _run_config(cfg: Study, spec: str, seed: int, warm: int = 0) -> TrainConfig:
    name, advantage = parse_method(spec)
    run_cfg = copy.deepcopy(cfg.train)
    run_cfg.method, run_cfg.advantage, run_cfg.seed = name, advantage or cfg.train.advantage, seed
    if warm:
        run_cfg.policy.model = f"tiny@{warm}"
    run_cfg.out, run_cfg.resume = str(Path(cfg.out) / run_dir_name(spec) / pair_name(warm, seed)), True
    return run_cfg


def open_run(run: Path, spec: str, seed: int, warm: int, done: bool, settings: dict, position: str = "") -> bool:
    """Whether a study's run is to be run: a finished one (`done`) is said to be read and is not; else its
    settings are written beside it (run_settings.json) and its start is said, with its `position` in the study
    ('run 3 of 12') when given."""
    label = f"{spec}, {'warm start ' + str(warm) + ', ' if warm else ''}seed {seed}"
    if done:
        print(f"== {label}: finished, read from {run}", file=sys.stderr)
        return False
    run.mkdir(parents=True, exist_ok=True)
    (run / RUN_SETTINGS).write_text(dumps(settings, indent=2))
    sys.stdout.flush()  # the previous run's last lines (stdout) before this header (stderr)
    print(f"== {label}" + (f" ({position}, in {run})" if position else ""), file=sys.stderr, flush=True)
    return True


def is_finished(cfg: Study, spec: str, seed: int, warm: int) -> bool:
    """Whether the study's run of `spec` on the pair is finished under cfg.train; ConfigError (one line) if its
    folder holds a run of other settings. Reads only: what `compare` checks before it writes anything."""
    run_cfg = _run_config(cfg, spec, seed, warm)
    return finished(Path(run_cfg.out), run_cfg)


def run_one(cfg: Study, spec: str, seed: int, warm: int, runner: Callable[..., dict], position: str = "") -> Path:
    """Train (or resume, or just find) one method's run on one pair with `runner` (`train`'s, which takes the
    trainer's `before` and `on_before`); returns its directory. The evaluation before training is computed once
    per pair, by the first run that needs it, under a lock that the pair's other runs wait on, and handed to
    them (`before_{pair}.json`)."""
    run_cfg = _run_config(cfg, spec, seed, warm)
    run = Path(run_cfg.out)
    if not open_run(run, spec, seed, warm, finished(run, run_cfg), run_settings(run_cfg), position):
        return run
    from omegaconf import OmegaConf

    from ..lm.warm_start import file_lock
    from ..rollout.run_lock import run_lock

    shared = Path(cfg.out) / f"before_{pair_name(warm, seed)}.json"
    key = start_settings(run_cfg)
    with contextlib.ExitStack() as held:
        if not checkpoints(run):  # a resumed run never evaluates its start; one from step 0 waits for the pair's
            held.enter_context(file_lock(shared))  # released once this run has the evaluation, or has failed
        cached = read_json(shared, strict=False) if shared.exists() else {}
        before = cached.get("before") if upgrade_run_settings(cached.get("settings")) == key else None
        if before is not None:
            held.close()

        def share(evaluated: dict) -> None:  # written, then the pair's waiting runs are let go
            tmp = shared.with_name(f".{shared.name}.{os.getpid()}")
            tmp.write_text(dumps({"settings": key, "before": evaluated}, indent=2))
            tmp.replace(shared)
            held.close()

        with run_lock(run, "a run of trace-rl compare"):  # one writer: a `train out=` this run's folder is refused
            runner(run_cfg, OmegaConf.to_yaml(OmegaConf.structured(run_cfg)), before=before, on_before=share)
    return run


def load_runs(out: Path, methods: list[str], cfg: Study | None = None) -> dict[str, list[dict]]:
    """Every finished run of `methods` under `out`, in seed order: its summary with its records. With `cfg`,
    a run trained with other settings than `cfg.train` is refused (not mixed into the table)."""
    runs: dict[str, list[dict]] = {}
    for spec in methods:
        found = []
        for summary_path in (out / run_dir_name(spec)).glob("*seed*/train_summary.json"):
            pair = parse_pair(summary_path.parent.name)
            if pair is None or (cfg is not None and pair[0] not in cfg.warm_starts):
                continue
            summary = read_json(summary_path, strict=False)  # bounded (safe_read); NaN from runs before strict JSON
            if cfg is not None and not finished(summary_path.parent, _run_config(cfg, spec, pair[1], pair[0])):
                continue  # fewer steps than asked: not finished under these settings
            recs = read_metrics(summary_path.parent / "metrics.jsonl")
            summary["records"] = next(iter(recs.values()), [])
            summary["warm"], summary["pair"] = pair[0], pair_name(*pair)
            found.append(summary)
        if found:
            runs[spec] = sorted(found, key=lambda s: (s["warm"], s["seed"]))
    return runs


def report(cfg: Study) -> list[dict]:
    """The study's table over every finished run under cfg.out (warnings for unpaired runs), printed and written
    as compare_summary.json / .txt, with the plots; returns the rows."""
    out = Path(cfg.out)
    runs = load_runs(out, cfg.methods, cfg)
    for problem in check_pairing(runs):
        print(f"warning: {problem}", file=sys.stderr)
    rows = summarize_compare(runs)
    write_summary(out / "compare_summary", rows, format_compare(rows))
    from ..plots import plots_available

    files = "compare_summary.json, compare_summary.txt"
    if plots_available():  # else one line says they were skipped
        plot_compare(runs, out)
        files += ", accuracy_vs_rollouts.png, accuracy_vs_tokens.png, effective_ratio.png, chain.png"
    print(f"\nwrote {out}/{files}; each run's folder holds its run.log")
    return rows


def check_pairing(runs: dict[str, list[dict]]) -> list[str]:
    """Problems with the pairing: per seed, every method must have the same held-out set, the same pools and
    (from one start, with one evaluation seed) the same accuracy before training. Empty when paired."""
    by_seed: dict[int, list[tuple[str, dict]]] = {}
    for spec, seeds in runs.items():
        for s in seeds:
            by_seed.setdefault(_pair(s), []).append((spec, s))
    problems = []
    for pair, entries in sorted(by_seed.items()):
        for key in ("held_out_digest", "pools_digest", "accuracy_before"):
            values = {spec: s.get(key) for spec, s in entries}
            if len(set(values.values())) > 1:
                problems.append(f"{pair}: {key} differs between methods ({values})")
    return problems


def curves(summary: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Held-out accuracy against rollouts (the trainer's running total) and against generated tokens spent,
    from (0, accuracy before)."""
    recs, start = summary["records"], summary["accuracy_before"]
    return {
        "rollouts": accuracy_curve(recs, start, "train/rollouts_total", running_total=True),
        "tokens": accuracy_curve(recs, start, "rollout/generated_tokens"),
    }


def mean_trained_accuracy(summary: dict) -> float:
    """Held-out accuracy averaged over the evaluations after training began. A policy trained with small steps
    swings from one evaluation to the next by more than the sampling error; the mean over the run's evaluations
    is less at the mercy of where the last step happened to land than the final accuracy alone."""
    return float(np.mean(curves(summary)["rollouts"][1][1:]))


def start_name(summary: dict) -> str:
    """The policy a run started from, as a table names it: tiny@W for a warm start (and for a summary that does
    not say), else the model it names (random-tiny, a path)."""
    start = summary.get("warm_start") or {}
    if not start or start.get("key"):
        return f"tiny@{summary.get('warm', 0)}"
    return str(start.get("path"))


def _pair(summary: dict) -> str:
    """The pairing unit of a run: its warm start and seed (runs of one pair share the start and the tasks)."""
    return summary.get("pair") or pair_name(summary.get("warm", 0), summary["seed"])


def summarize_compare(runs: dict[str, list[dict]]) -> list[dict]:
    """One row per method: the figures the module docstring lists, as numbers (mean, lo, hi per interval)."""
    base = {_pair(s): s for s in runs.get(BASELINE, [])}
    rows = []
    for spec, seeds in runs.items():
        name, advantage = parse_method(spec)
        recs = [s["records"] for s in seeds]
        own = [summarize({spec: rs})[0] for rs in recs]  # each seed's run as the one report shapes a run's row
        er = [r["effective_ratio"] for r in own]
        row = {
            "method": spec,
            "allocation": name,
            "advantage": advantage or METHODS[name].advantage,
            "seeds": [s["seed"] for s in seeds],
            "pairs": [_pair(s) for s in seeds],
            "warm_starts": sorted({s.get("warm", 0) for s in seeds}),
            "starts": sorted({start_name(s) for s in seeds}),
            "acc_before": interval([s["accuracy_before"] for s in seeds]),
            "acc_after": interval([s["accuracy_after"] for s in seeds]),
            "gain": interval([s["accuracy_after"] - s["accuracy_before"] for s in seeds]),
            "acc_mean": interval([mean_trained_accuracy(s) for s in seeds]),
            "eval_se": float(np.mean([s.get("accuracy_se") or math.nan for s in seeds])),
            "eval_se_sampling": float(np.mean([s.get("accuracy_se_sampling") or math.nan for s in seeds])),
            "effective_ratio": interval(er),
            "groups_per_1k": interval([r["groups_per_1k"] for r in own]),
            "adv_nonzero_token_share": interval(run_means(recs, "train/adv_nonzero_token_share")),
            "grad_norm": interval(run_means(recs, "train/grad_norm")),
            "update_kl": interval(run_means(recs, "train/update_kl")),
            **{key: float(np.mean([r[key] for r in own])) for key in ("rollouts", "tokens", "wall_s")},
        }
        paired = [s for s in seeds if _pair(s) in base]
        if paired:
            ours, theirs = [s["accuracy_after"] for s in paired], [base[_pair(s)]["accuracy_after"] for s in paired]
            row["diff_vs_grpo"] = {**paired_interval(ours, theirs), "seeds": len(paired)}
            trained = (
                [mean_trained_accuracy(s) for s in paired],
                [mean_trained_accuracy(base[_pair(s)]) for s in paired],
            )
            row["mean_diff_vs_grpo"] = {**paired_interval(*trained), "seeds": len(paired)}
            ours_t, theirs_t = zip(
                *[at_equal_cost(curves(s)["tokens"], curves(base[_pair(s)])["tokens"]) for s in paired]
            )
            row["tokens_diff_vs_grpo"] = {**paired_interval(list(ours_t), list(theirs_t)), "seeds": len(paired)}
            base_er = float(np.mean(run_means([base[_pair(s)]["records"] for s in paired], "rollout/effective_ratio")))
            ours_er = float(np.mean([e for e, s in zip(er, seeds) if _pair(s) in base]))
            row["er_vs_grpo"] = ours_er / base_er if base_er else math.nan
            for cost in ("rollouts", "tokens"):
                reach = cost_to_target([curves(s)[cost] for s in paired], theirs)
                row[f"{cost}_to_grpo_final"] = {**reach, "seeds": len(paired)}
        rows.append(row)
    return rows


def format_compare(rows: list[dict]) -> str:
    """The rows as a text table: mean [95% interval]; costs to GRPO's final accuracy with (seeds reached/seeds)."""
    cells = []
    for r in rows:
        reach = r.get("rollouts_to_grpo_final")
        cells.append(
            {
                "method": r["method"],
                "advantage": r["advantage"],
                "seeds": str(len(r["pairs"])),
                "acc_before": format_interval(r["acc_before"]),
                "acc_after": format_interval(r["acc_after"]),
                "gain": format_interval(r["gain"], signed=True),
                "after_vs_grpo": format_interval(r.get("diff_vs_grpo"), signed=True),
                "acc_mean": format_interval(r["acc_mean"]),
                "mean_vs_grpo": format_interval(r.get("mean_diff_vs_grpo"), signed=True),
                "equal_tokens_vs_grpo": format_interval(r.get("tokens_diff_vs_grpo"), signed=True),
                "rollouts_to_grpo_final": format_interval(reach, 0, sep=",") if reach and reach["reached"] else "-",
                "tokens_to_grpo_final": format_interval(r.get("tokens_to_grpo_final"), 0, sep=",") if reach else "-",
                "effective_ratio": format_interval(r["effective_ratio"]),
                "er_vs_grpo": f"{r['er_vs_grpo']:.2f}" if not math.isnan(r.get("er_vs_grpo", math.nan)) else "-",
                "groups_per_1k": f"{r['groups_per_1k']['mean']:.0f}",
                "nonzero_adv_tokens": f"{r['adv_nonzero_token_share']['mean']:.3f}",
                "grad_norm": f"{r['grad_norm']['mean']:.3f}",
                "update_kl": f"{r['update_kl']['mean']:.2e}",
                "rollouts": f"{r['rollouts']:,.0f}",
                "tokens": f"{r['tokens']:,.0f}",
                "wall_s": f"{r['wall_s']:.0f}",
            }
        )
    note = (
        "mean [95% interval] over seeds; after_vs_grpo: paired bootstrap over common seeds; acc_mean: accuracy "
        "averaged over the evaluations after the start (mean_vs_grpo: its paired difference); equal_tokens_vs_grpo: "
        "both curves read at the smaller of the two runs' token totals, paired; "
        "*_to_grpo_final: first crossing of GRPO's final accuracy on the same seed (seeds reached/seeds)"
    )
    seeds = sorted({seed for r in rows for seed in r["seeds"]})
    tuning = [seed for seed in seeds if seed < FIRST_EVALUATION_SEED]
    warm = sorted({w for r in rows for w in r.get("warm_starts", [0])})
    starts = sorted({m for r in rows for m in r.get("starts", [f"tiny@{w}" for w in warm])})
    tiny = all(m.startswith("tiny@") for m in starts)
    note += f"\n{'warm starts' if tiny else 'start policies'}: {', '.join(starts)}; " + (
        f"TUNING seeds {tuning} (below {FIRST_EVALUATION_SEED}: defaults were chosen on them, so this is not an "
        "evaluation result)"
        if tuning
        else f"evaluation seeds only ({FIRST_EVALUATION_SEED} and up: no default was chosen on them)"
    )
    for key, what in (("eval_se", "over tasks"), ("eval_se_sampling", "of the sampling on the held-out set")):
        se = [r[key] for r in rows if not math.isnan(r.get(key, math.nan))]
        if se:
            note += f"\nstandard error of one final evaluation, {what}: {np.mean(se):.3f}"
    return note + "\n" + format_table(cells)


def plot_compare(runs: dict[str, list[dict]], out: Path) -> None:
    from ..plots import plot_chain, plot_metric

    per_seed = {m: [s["records"] for s in seeds] for m, seeds in runs.items()}
    plot_metric(
        per_seed,
        "rollout/effective_ratio",
        out / "effective_ratio.png",
        "Effective ratio per step (mean and seed band)",
        smooth=3,
    )
    plot_chain(per_seed, out / "chain.png", "Effective ratio -> signal -> update size -> accuracy (seed bands)")
    for cost, label in (("rollouts", "rollouts spent"), ("tokens", "generated tokens spent")):
        acc = {m: cost_points([curves(s)[cost] for s in seeds]) for m, seeds in runs.items()}
        plot_metric(
            acc, "eval/accuracy", out / f"accuracy_vs_{cost}.png", f"Held-out accuracy against {label}", xlabel=label
        )
