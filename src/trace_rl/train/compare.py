"""`trace-rl compare`: train with several methods from the same start, same seeds, same rollout budget per
step, and compare what the budget bought: held-out accuracy before and after (mean +- std over seeds),
effective ratio, contrast groups per 1k rollouts, rollouts and tokens spent, wall-clock; PNG plots of held-out
accuracy against rollouts spent and of the effective ratio per step, with seed bands; and, against GRPO, the
share of GRPO's rollouts each method needed to reach GRPO's final accuracy (read off the mean accuracy curve,
linearly interpolated between evaluations; '-' when it never got there).
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..methods import METHODS
from ..rollout.records import format_table, read_metrics
from ..stack.config import check_methods, check_seed
from .trainer import TrainConfig, train

DEFAULT_METHODS = ("grpo", "pcl", "knapsack_rl", "tree_grpo", "treepo", "trace")


@dataclass
class CompareConfig:
    """`trace-rl compare`: methods trained from one start at equal rollout budget, over several seeds."""

    out: str = "runs/compare"  # directory: one training run per method and seed, the table and the plots
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))  # each trained from the same start
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # one run per method and seed
    train: TrainConfig = field(default_factory=TrainConfig)  # the settings every run shares (its method is replaced)

    def __post_init__(self):
        check_methods(self.methods, [m for m in METHODS if METHODS[m].predictor != "oracle"])
        if not self.seeds:
            raise ValueError("seeds: give at least one seed")
        for seed in self.seeds:
            check_seed(seed, "seeds")
        if len(set(self.seeds)) < len(self.seeds):
            raise ValueError(f"seeds: each seed once, got {self.seeds}")
        if not self.out:
            raise ValueError("out must be a directory path, got an empty string")


def _curve(records: list[dict], before: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rollouts spent, held-out accuracy) at each evaluation, starting from (0, accuracy before)."""
    xs, ys = ([0.0], [before]) if before is not None else ([], [])
    for r in records:
        if "eval/accuracy" in r:
            xs.append(r["train/rollouts_total"])
            ys.append(r["eval/accuracy"])
    return np.array(xs, dtype=float), np.array(ys, dtype=float)


def rollouts_to_reach(xs: np.ndarray, ys: np.ndarray, target: float) -> float | None:
    """First rollout count at which the linearly interpolated curve reaches `target`, or None."""
    for i in range(len(xs)):
        if ys[i] >= target:
            if i == 0:
                return float(xs[0])
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return float(x0 + (target - y0) / (y1 - y0) * (x1 - x0)) if y1 > y0 else float(x1)
    return None


def load_runs(out: Path, methods: list[str], seeds: list[int]) -> dict[str, list[dict]]:
    """The finished runs of a comparison directory: each run's summary with its records."""
    runs: dict[str, list[dict]] = {}
    for method in methods:
        for seed in seeds:
            run = out / method / f"seed{seed}"
            summary = json.loads((run / "train_summary.json").read_text())
            summary["records"] = read_metrics(run / "metrics.jsonl")[method]
            runs.setdefault(method, []).append(summary)
    return runs


def run_compare(cfg: CompareConfig, config_yaml: str = "") -> list[dict]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if config_yaml:
        (out / "config.yaml").write_text(config_yaml)
    runs: dict[str, list[dict]] = {}
    for method in cfg.methods:
        for seed in cfg.seeds:
            run_cfg = copy.deepcopy(cfg.train)
            run_cfg.method, run_cfg.seed, run_cfg.out = method, seed, str(out / method / f"seed{seed}")
            print(f"== {method}, seed {seed}", file=sys.stderr)
            summary = train(run_cfg)
            summary["records"] = read_metrics(Path(run_cfg.out) / "metrics.jsonl")[method]
            runs.setdefault(method, []).append(summary)
    rows = summarize_compare(runs)
    table = format_table(rows)
    print(table)
    (out / "compare_summary.json").write_text(json.dumps(rows, indent=2))
    (out / "compare_summary.txt").write_text(table + "\n")
    plot_compare(runs, out)
    print(f"\nwrote {out}/compare_summary.json, accuracy_vs_rollouts.png, effective_ratio.png")
    return rows


def _pm(values: list[float]) -> str:
    v = np.array([x for x in values if x is not None], dtype=float)
    return f"{v.mean():.3f} +- {v.std(ddof=1) if len(v) > 1 else 0.0:.3f}" if len(v) else "-"


def summarize_compare(runs: dict[str, list[dict]]) -> list[dict]:
    rows = []
    grpo_target = grpo_rollouts = None
    if "grpo" in runs:
        xs, ys = zip(*(_curve(r["records"], r["accuracy_before"]) for r in runs["grpo"]))
        grpo_target = float(np.mean([y[-1] for y in ys]))
        grpo_rollouts = float(np.mean([x[-1] for x in xs]))
    for method, seeds in runs.items():
        recs = [s["records"] for s in seeds]
        er = [np.mean([r["rollout/effective_ratio"] for r in rs]) for rs in recs]
        rollouts = [sum(r["rollout/rollouts"] for r in rs) for rs in recs]
        groups = [1000 * sum(r["rollout/contrast_groups"] for r in rs) / max(n, 1) for rs, n in zip(recs, rollouts)]
        row = {
            "method": method,
            "acc_before": _pm([s["accuracy_before"] for s in seeds]),
            "acc_after": _pm([s["accuracy_after"] for s in seeds]),
            "effective_ratio": _pm(er),
            "groups_per_1k": _pm(groups),
            "rollouts": int(np.mean(rollouts)),
            "tokens": int(np.mean([sum(r["rollout/generated_tokens"] for r in rs) for rs in recs])),
            "wall_s": float(
                np.mean(
                    [
                        sum(
                            r.get("timing_s/total", 0) + r.get("timing_s/update", 0) + r.get("timing_s/eval", 0)
                            for r in rs
                        )
                        for rs in recs
                    ]
                )
            ),
        }
        if grpo_target is not None:
            curves = [_curve(s["records"], s["accuracy_before"]) for s in seeds]
            xs = curves[0][0]
            mean_acc = np.mean([c[1] for c in curves], axis=0) if all(len(c[1]) == len(xs) for c in curves) else None
            reach = rollouts_to_reach(xs, mean_acc, grpo_target) if mean_acc is not None else None
            row["share_of_grpo_rollouts_to_grpo_final"] = f"{reach / grpo_rollouts:.2f}" if reach else "-"
        rows.append(row)
    return rows


def plot_compare(runs: dict[str, list[dict]], out: Path) -> None:
    from ..plots import plot_metric

    per_seed = {m: [s["records"] for s in seeds] for m, seeds in runs.items()}
    plot_metric(
        per_seed,
        "rollout/effective_ratio",
        out / "effective_ratio.png",
        "Effective ratio per step (mean and seed band)",
        smooth=3,
    )
    # accuracy against rollouts spent: the x of each evaluation record is the running rollout count
    acc = {
        m: [[{**r, "step": r["train/rollouts_total"] - 1} for r in rs if "eval/accuracy" in r] for rs in seeds]
        for m, seeds in per_seed.items()
    }
    plot_metric(
        acc,
        "eval/accuracy",
        out / "accuracy_vs_rollouts.png",
        "Held-out accuracy against rollouts spent",
        xlabel="rollouts spent",
    )
