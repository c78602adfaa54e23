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
+-0.8 standard deviations of the per-seed values.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..stats import cost_to_target_ci, mean_ci, paired_bootstrap_ci

Runs = list[dict[str, list[dict]]]  # one {method: records} per seed


def curve(records: list[dict], cost: str = "rollout/rollouts") -> tuple[np.ndarray, np.ndarray]:
    """(cumulative cost, exact held-out accuracy) at each evaluation, from (0, accuracy before training)."""
    xs, ys, spent = [0.0], [records[0]["eval/accuracy_before"]], 0.0
    for r in records:
        spent += r[cost]
        if "eval/accuracy" in r:
            xs.append(spent)
            ys.append(r["eval/accuracy"])
    return np.array(xs), np.array(ys)


def accuracy_at(records: list[dict], spent: float, cost: str = "rollout/rollouts") -> float:
    """Accuracy read off the curve against `cost` at `spent` (linear between evaluations)."""
    xs, ys = curve(records, cost)
    return float(np.interp(spent, xs, ys))


def paired_difference(a: list[list[dict]], b: list[list[dict]], cost: str = "rollouts", level: float = 0.95) -> dict:
    """Method a minus method b, paired by seed (a[i] and b[i] are one seed's records), each seed read at the
    smaller of the two runs' final `cost` ("rollouts" or "turns"): mean, percentile bootstrap interval, and the
    per-seed differences."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_difference needs the same seeds on both sides, got {len(a)} and {len(b)}")
    key = f"rollout/{cost}"
    diffs = []
    for ra, rb in zip(a, b):
        at = min(curve(ra, key)[0][-1], curve(rb, key)[0][-1])
        diffs.append(accuracy_at(ra, at, key) - accuracy_at(rb, at, key))
    row = _ci(paired_bootstrap_ci(diffs, np.zeros(len(diffs)), level))
    row["per_seed"] = diffs
    return row


def _ci(triple: tuple[float, float, float]) -> dict:
    m, lo, hi = triple
    return {"mean": m, "lo": lo, "hi": hi}


def seed_statistics(runs: Runs, focus: str = "trace", baseline: str = "grpo", level: float = 0.95) -> list[dict]:
    """One row per method with the figures named in the module docstring, as numbers (for summary.json)."""
    methods = list(runs[0])
    rows = []
    for name in methods:
        recs = [run[name] for run in runs]
        start = [r[0]["eval/accuracy_before"] for r in recs]
        final = [curve(r)[1][-1] for r in recs]
        row = {
            "method": name,
            "seeds": len(runs),
            "start_accuracy": _ci(mean_ci(start, level)),
            "final_accuracy": _ci(mean_ci(final, level)),
            "gain": _ci(mean_ci(np.subtract(final, start), level)),
            "rollouts": float(np.mean([curve(r)[0][-1] for r in recs])),
            "turns": float(np.mean([curve(r, "rollout/turns")[0][-1] for r in recs])),
        }
        if baseline in runs[0]:
            targets = [curve(run[baseline])[1][-1] for run in runs]
            for cost in ("rollouts", "turns"):
                m, lo, hi, n = cost_to_target_ci([curve(r, f"rollout/{cost}") for r in recs], targets, level)
                row[f"{cost}_to_{baseline}_final"] = {"mean": m, "lo": lo, "hi": hi, "reached": n}
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


def _fmt(ci: dict | None, digits: int = 3, signed: bool = False) -> str:
    if not ci or math.isnan(ci["mean"]):
        return "-"
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    text = f.format(ci["mean"])
    if not math.isnan(ci["lo"]):
        text += f" [{f.format(ci['lo'])}, {f.format(ci['hi'])}]"
    if "reached" in ci:
        text += f" ({ci['reached']} seeds)"
    return text


def format_seed_table(rows: list[dict], focus: str = "trace", baseline: str = "grpo") -> str:
    """The rows as a plain-text table, every figure with its 95% interval."""
    cols = [
        ("method", lambda r: r["method"]),
        ("start acc", lambda r: _fmt(r["start_accuracy"])),
        ("final acc", lambda r: _fmt(r["final_accuracy"])),
        ("gain", lambda r: _fmt(r["gain"], signed=True)),
        (f"this - {baseline} @ equal rollouts", lambda r: _fmt(r.get(f"minus_{baseline}"), signed=True)),
        (f"{focus} - this @ equal rollouts", lambda r: _fmt(r.get(f"{focus}_minus"), signed=True)),
        (f"{focus} - this @ equal turns", lambda r: _fmt(r.get(f"{focus}_minus_turns"), signed=True)),
        (f"rollouts to {baseline} final", lambda r: _fmt(r.get(f"rollouts_to_{baseline}_final"), 0)),
        (f"turns to {baseline} final", lambda r: _fmt(r.get(f"turns_to_{baseline}_final"), 0)),
        ("rollouts", lambda r: f"{r['rollouts']:.0f}"),
        ("turns", lambda r: f"{r['turns']:.0f}"),
    ]
    cells = [[get(r) for _, get in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _) in enumerate(cols)]
    lines = ["  ".join(h.ljust(w) for (h, _), w in zip(cols, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def plot_accuracy_vs_cost(runs: Runs, path: Path, cost: str = "rollouts", level: float = 0.95) -> None:
    """Mean exact held-out accuracy against rollouts (or turns) spent, one line per method from 0, with the
    seeds' t interval as a band (x: the seeds' mean cost at each evaluation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in runs[0]:
        curves = [curve(run[name], f"rollout/{cost}") for run in runs]
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
