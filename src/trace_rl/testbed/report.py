"""What several seeds of `trace-rl simulate` say about accuracy: start and end accuracy per method with t
intervals, the rollouts (and turns) each method needs to reach GRPO's final accuracy on the same seed, and
paired per-seed differences at equal rollouts and at equal turns with bootstrap intervals; plus the
accuracy-vs-rollouts plot with seed bands.

Choices, stated: "equal rollouts" compares two methods on one seed at the smaller of their two final rollout
counts (tree methods may leave prefix budget unspent), reading each accuracy curve by linear interpolation
between evaluations; a curve starts at (0 rollouts, accuracy before training). "Equal turns" does the same on
the curves against turns (the testbed's generation cost: a continuation replays its prefix and generates only
the rest), so it reads the cheaper run at its end and the dearer one part-way. The target of "rollouts to
GRPO's final accuracy" is GRPO's final accuracy on that seed, so a method that never reaches it on a seed
counts in `reached` but not in the mean. Intervals are 95% (stats.py); with 8 seeds a t interval is about
+-0.8 standard deviations of the per-seed values. The curves, the reading at equal cost, the intervals and the
table are the one report's (`rollout.report`, shared with `compare`); what is testbed-specific here is where a
run's accuracy before training is recorded (its first step) and which figures a row holds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..rollout.report import (
    accuracy_curve,
    cost_to_target,
    format_interval,
    format_table,
    interval,
    paired_at_equal_cost,
)
from ..stats import mean_ci

Runs = list[dict[str, list[dict]]]  # one {method: records} per seed


def paired_difference(a: list[list[dict]], b: list[list[dict]], cost: str = "rollouts", level: float = 0.95) -> dict:
    """Method a minus method b, paired by seed (a[i] and b[i] are one seed's records), each seed read at the
    smaller of the two runs' final `cost` ("rollouts" or "turns"): mean, percentile bootstrap interval, and the
    per-seed differences."""
    key = f"rollout/{cost}"
    return paired_at_equal_cost(
        [accuracy_curve(r, cost=key) for r in a], [accuracy_curve(r, cost=key) for r in b], level
    )


def seed_statistics(runs: Runs, focus: str = "trace", baseline: str = "grpo", level: float = 0.95) -> list[dict]:
    """One row per method with the figures named in the module docstring, as numbers (for summary.json)."""
    methods = list(runs[0])
    rows = []
    for name in methods:
        recs = [run[name] for run in runs]
        start = [r[0]["eval/accuracy_before"] for r in recs]
        final = [accuracy_curve(r)[1][-1] for r in recs]
        row = {
            "method": name,
            "seeds": len(runs),
            "start_accuracy": interval(start, level),
            "final_accuracy": interval(final, level),
            "gain": interval(np.subtract(final, start), level),
            "rollouts": float(np.mean([accuracy_curve(r)[0][-1] for r in recs])),
            "turns": float(np.mean([accuracy_curve(r, cost="rollout/turns")[0][-1] for r in recs])),
        }
        if baseline in runs[0]:
            targets = [accuracy_curve(run[baseline])[1][-1] for run in runs]
            for cost in ("rollouts", "turns"):
                curves = [accuracy_curve(r, cost=f"rollout/{cost}") for r in recs]
                row[f"{cost}_to_{baseline}_final"] = cost_to_target(curves, targets, level)
        for other, sign, key in ((baseline, 1, f"minus_{baseline}"), (focus, -1, f"{focus}_minus")):
            if other not in runs[0] or other == name:
                continue
            theirs = [run[other] for run in runs]
            a, b = (recs, theirs) if sign > 0 else (theirs, recs)
            for cost, suffix in (("rollouts", ""), ("turns", "_turns")):
                pair = paired_difference(a, b, cost, level)
                row[key + suffix] = {k: pair[k] for k in ("mean", "lo", "hi")}
        rows.append(row)
    return rows


def format_seed_table(rows: list[dict], focus: str = "trace", baseline: str = "grpo") -> str:
    """The rows as a plain-text table, every figure with its 95% interval."""
    cols = [
        ("method", lambda r: r["method"]),
        ("start acc", lambda r: format_interval(r["start_accuracy"])),
        ("final acc", lambda r: format_interval(r["final_accuracy"])),
        ("gain", lambda r: format_interval(r["gain"], signed=True)),
        (f"this - {baseline} @ equal rollouts", lambda r: format_interval(r.get(f"minus_{baseline}"), signed=True)),
        (f"{focus} - this @ equal rollouts", lambda r: format_interval(r.get(f"{focus}_minus"), signed=True)),
        (f"{focus} - this @ equal turns", lambda r: format_interval(r.get(f"{focus}_minus_turns"), signed=True)),
        (f"rollouts to {baseline} final", lambda r: format_interval(r.get(f"rollouts_to_{baseline}_final"), 0)),
        (f"turns to {baseline} final", lambda r: format_interval(r.get(f"turns_to_{baseline}_final"), 0)),
        ("rollouts", lambda r: f"{r['rollouts']:.0f}"),
        ("turns", lambda r: f"{r['turns']:.0f}"),
    ]
    return format_table([{h: get(r) for h, get in cols} for r in rows], right_align=False, rule=False)


def plot_accuracy_vs_cost(runs: Runs, path: Path, cost: str = "rollouts", level: float = 0.95) -> None:
    """Mean exact held-out accuracy against rollouts (or turns) spent, one line per method from 0, with the
    seeds' t interval as a band (x: the seeds' mean cost at each evaluation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in runs[0]:
        curves = [accuracy_curve(run[name], cost=f"rollout/{cost}") for run in runs]
        n = min(len(x) for x, _ in curves)
        xs = np.mean([x[:n] for x, _ in curves], axis=0)
        ys = np.array([y[:n] for _, y in curves])
        stats = [mean_ci(ys[:, i], level) for i in range(n)]
        mean = np.array([s[0] for s in stats])
        (line,) = ax.plot(xs, mean, marker="o", markersize=3, label=name)
        if len(runs) > 1:
            ax.fill_between(xs, [s[1] for s in stats], [s[2] for s in stats], color=line.get_color(), alpha=0.15)
    ax.set_xlabel(f"{cost} spent")
    ax.set_ylabel("exact held-out accuracy")
    ax.set_title(f"Accuracy vs {cost}, mean and {level:.0%} interval over {len(runs)} seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
