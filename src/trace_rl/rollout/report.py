"""The one report of methods x seeds at equal cost, on `stats`: what `simulate`, `rollout` and `compare` (and
`eval`'s table) summarise with. Built from the metrics records (`rollout.records`' schema), numpy only.

- Per-method summary of one run, or of runs averaged step-wise over seeds (`summarize`, `average_runs`); of
  runs without an update over seeds, each figure with its interval and its difference to the baseline paired
  by seed (`summarize_over_seeds`, `format_over_seeds`: `compare command=rollout`).
- Accuracy curves: held-out accuracy against a cost (rollouts, turns, generated tokens) from (0, accuracy
  before training), with the cost summed over steps or read from a running total (`accuracy_curve`).
- Equal cost: two curves read at the smaller of their two final costs, linear between evaluations
  (`at_equal_cost`), so a method that spent less is read at its end and the other where it had spent as much;
  paired over seeds with a bootstrap interval (`paired_at_equal_cost`).
- Intervals as dicts {mean, lo, hi} (t interval over seeds, paired bootstrap, cost to a target with the count
  of seeds that reached it) and their one text form (`format_interval`); one plain-text table (`format_table`),
  printed and written beside its rows (`write_summary`).

Limits: the statistics and their caveats are `stats`' (t intervals assume roughly normal per-seed values; the
bootstrap is coarse with few seeds; costs to a target average only the seeds that reached it). Reading between
evaluations is linear interpolation, an estimate between the points actually measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..stats import cost_to_target_ci, mean_ci, paired_bootstrap_ci
from ..strict_json import dumps

Curve = tuple[np.ndarray, np.ndarray]  # (cost spent at each evaluation, accuracy there), from (0, before)


# -- one run, or runs averaged over seeds -------------------------------------------------------------------
def average_runs(runs: list[dict[str, list[dict]]]) -> dict[str, list[dict]]:
    """Step-wise mean of every numeric field over runs with different seeds (same methods and steps)."""
    out: dict[str, list[dict]] = {}
    for name in runs[0]:
        out[name] = []
        for step, first in enumerate(runs[0][name]):
            recs = [run[name][step] for run in runs]
            avg = {}
            for k, v in first.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and all(k in r for r in recs):
                    v = float(np.mean([r[k] for r in recs]))
                avg[k] = v
            avg["step"] = step
            out[name].append(avg)
    return out


def mean_of(recs: Iterable[dict], key: str) -> float:
    """Mean of `key` over the records that hold it (nan when none does)."""
    vals = [r[key] for r in recs if key in r]
    return float(np.mean(vals)) if vals else float("nan")


def run_means(runs: Sequence[list[dict]], key: str) -> list[float]:
    """Per run (one seed's records), the mean of `key` over its steps."""
    return [float(np.mean([r[key] for r in recs if key in r] or [np.nan])) for recs in runs]


def summarize(results: dict[str, list[dict]], baseline: str | None = None) -> list[dict]:
    """One row per method: effective ratio (and vs the baseline, whole run and second half), contrast groups
    per 1k rollouts, flips per continuation, final held-out accuracy where evaluated, budget and time."""
    names = list(results)
    baseline = baseline if baseline in results else ("grpo" if "grpo" in results else names[0])
    rows = []
    for name, recs in results.items():

        def total(key: str, recs: list[dict] = recs) -> float:
            return float(sum(r.get(key, 0) for r in recs))

        rollouts, continuations = total("rollout/rollouts"), total("rollout/continuations")
        second = recs[len(recs) // 2 :]
        acc = [r["eval/accuracy"] for r in recs if "eval/accuracy" in r]
        row = {"method": name}
        if "eval/accuracy_before" in recs[0]:
            row["start_accuracy"] = recs[0]["eval/accuracy_before"]
        if acc:
            row["final_accuracy"] = acc[-1]
        row.update(
            {
                "effective_ratio": mean_of(recs, "rollout/effective_ratio"),
                "er_second_half": mean_of(second, "rollout/effective_ratio"),
                "groups_per_1k": 1000.0 * total("rollout/contrast_groups") / max(rollouts, 1),
                "flip_rate": total("rollout/flips") / continuations if continuations else float("nan"),
                "rollouts": int(rollouts),
                "turns": int(total("rollout/turns")),
                "tokens": int(total("rollout/generated_tokens")),
                "prefix_share": continuations / max(rollouts, 1),
                "overhead_pct": 100 * total("timing_s/overhead") / max(total("timing_s/total"), 1e-12),
                "wall_s": total("timing_s/total") + total("timing_s/update") + total("timing_s/eval"),
            }
        )
        rows.append(row)
    base = next(r for r in rows if r["method"] == baseline)
    for r in rows:
        for key, label in (("effective_ratio", ""), ("er_second_half", "_2nd_half")):
            r[f"vs_{baseline}{label}"] = r[key] / base[key] if base[key] else float("nan")
    return rows


# the figures of a run without an update that `summarize_over_seeds` gives intervals and paired differences of
OVER_SEEDS = ("effective_ratio", "er_second_half", "groups_per_1k", "flip_rate")


def summarize_over_seeds(runs: dict[str, list[dict]], baseline: str | None = None) -> list[dict]:
    """One row per method over its seeds' runs (`runs`: method -> one dict per seed with `seed`, `pair`, the
    pairing unit, and `records`): each figure of OVER_SEEDS as each seed's `summarize` row has it (`per_seed`),
    with the t interval over seeds, and its difference to the baseline's run of the same pair (`<figure>_diff`,
    paired bootstrap over the pairs both ran); `er_ratio`: the mean effective ratio over those pairs over the
    baseline's. Rollouts, turns, tokens and wall-clock: means over seeds. The baseline is GRPO when it ran, else
    the first method."""
    names = list(runs)
    baseline = baseline if baseline in runs else ("grpo" if "grpo" in runs else names[0])
    per_run = {m: [summarize({m: s["records"]})[0] for s in seeds] for m, seeds in runs.items()}
    base = {s["pair"]: row for s, row in zip(runs[baseline], per_run[baseline])}
    rows = []
    for name, seeds in runs.items():
        own = per_run[name]
        row: dict = {"method": name, "baseline": baseline, "seeds": [s["seed"] for s in seeds]}
        row["pairs"] = [s["pair"] for s in seeds]
        for key in OVER_SEEDS:
            values = [r[key] for r in own]
            row[key] = {**interval(values), "per_seed": values}
        paired = [(r, base[s["pair"]]) for s, r in zip(seeds, own) if s["pair"] in base]
        for key in OVER_SEEDS:
            ours, theirs = [a[key] for a, _ in paired], [b[key] for _, b in paired]
            row[f"{key}_diff"] = {**paired_interval(ours, theirs), "seeds": len(paired)}
        ours_er = float(np.mean([a["effective_ratio"] for a, _ in paired])) if paired else float("nan")
        base_er = float(np.mean([b["effective_ratio"] for _, b in paired])) if paired else float("nan")
        row["er_ratio"] = ours_er / base_er if base_er else float("nan")
        for key in ("rollouts", "turns", "tokens", "prefix_share", "wall_s"):
            row[key] = float(np.mean([r[key] for r in own]))
        rows.append(row)
    return rows


def format_over_seeds(rows: list[dict]) -> str:
    """`summarize_over_seeds`' rows as a text table: mean [95% interval] over seeds, differences to the baseline
    paired by seed."""
    base = rows[0]["baseline"] if rows else "grpo"
    cells = [
        {
            "method": r["method"],
            "seeds": str(len(r["pairs"])),
            "effective_ratio": format_interval(r["effective_ratio"]),
            f"er_vs_{base}": "-" if np.isnan(r["er_ratio"]) else f"{r['er_ratio']:.2f}",
            f"er_diff_vs_{base}": format_interval(r["effective_ratio_diff"], signed=True),
            "er_second_half": format_interval(r["er_second_half"]),
            "groups_per_1k": format_interval(r["groups_per_1k"], 1),
            f"groups_diff_vs_{base}": format_interval(r["groups_per_1k_diff"], 1, signed=True),
            "flip_rate": format_interval(r["flip_rate"]),
            "rollouts": f"{r['rollouts']:,.0f}",
            "tokens": f"{r['tokens']:,.0f}",
            "wall_s": f"{r['wall_s']:.0f}",
        }
        for r in rows
    ]
    note = (
        f"mean [95% interval] over seeds; *_diff_vs_{base}: paired bootstrap over the seeds both ran; "
        "groups_per_1k: contrast groups per 1k rollouts; flip_rate: flips per continuation"
    )
    return note + "\n" + format_table(cells)


# -- accuracy against cost ----------------------------------------------------------------------------------
def accuracy_curve(
    records: list[dict], start: float | None = None, cost: str = "rollout/rollouts", running_total: bool = False
) -> Curve:
    """(cost spent, held-out accuracy) at each evaluation (`eval/accuracy`), from (0, `start`). `start` None: the
    accuracy before training that the run's first record holds (`eval/accuracy_before`, as `simulate` records
    it). `cost` is a per-step record key summed over steps, or with `running_total` a key that already holds the
    total so far."""
    if start is None:
        start = records[0]["eval/accuracy_before"]
    xs, ys, spent = [0.0], [start], 0.0
    for r in records:
        spent = float(r[cost]) if running_total else spent + r[cost]
        if "eval/accuracy" in r:
            xs.append(spent)
            ys.append(r["eval/accuracy"])
    return np.array(xs), np.array(ys, dtype=float)


def accuracy_at(curve: Curve, spent: float) -> float:
    """The curve read at `spent` (linear between evaluations)."""
    return float(np.interp(spent, *curve))


def at_equal_cost(ours: Curve, theirs: Curve) -> tuple[float, float]:
    """Both curves' accuracy at the smaller of their two final costs (linear between evaluations): a method that
    spent less is read at its end, the other where it had spent as much."""
    cost = min(ours[0][-1], theirs[0][-1])
    return accuracy_at(ours, cost), accuracy_at(theirs, cost)


def paired_at_equal_cost(ours: Sequence[Curve], theirs: Sequence[Curve], level: float = 0.95) -> dict:
    """Ours minus theirs at equal cost, paired by seed (ours[i] and theirs[i] are one seed's curves): mean,
    percentile bootstrap interval, and the per-seed differences."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"a paired difference needs the same seeds on both sides, got {len(ours)} and {len(theirs)}")
    a, b = zip(*(at_equal_cost(x, y) for x, y in zip(ours, theirs)))
    row = paired_interval(list(a), list(b), level)
    row["per_seed"] = [x - y for x, y in zip(a, b)]
    return row


def cost_points(seed_curves: Sequence[Curve]) -> list[list[dict]]:
    """Per seed, its accuracy records placed at the mean cost over seeds of the same evaluation (the i-th
    evaluation of every seed comes after the same steps; token costs differ a little per seed), so a plot
    (`plots.plot_metric`) draws one mean curve with a seed band instead of a zig-zag through every seed's own x.
    The start is at 0."""
    longest = max(len(x) for x, _ in seed_curves)
    at = [np.mean([x[i] for x, _ in seed_curves if len(x) > i]) for i in range(longest)]
    return [
        [{"step": int(round(at[i])) - 1, "eval/accuracy": float(y[i])} for i in range(len(y))] for _, y in seed_curves
    ]


# -- intervals and their text -------------------------------------------------------------------------------
def interval(values: Sequence[float], level: float = 0.95) -> dict:
    """{mean, lo, hi}: the t interval over seeds (`stats.mean_ci`)."""
    m, lo, hi = mean_ci(values, level)
    return {"mean": m, "lo": lo, "hi": hi}


def paired_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict:
    """{mean, lo, hi} of a_i - b_i: the paired percentile bootstrap (`stats.paired_bootstrap_ci`)."""
    m, lo, hi = paired_bootstrap_ci(a, b, level)
    return {"mean": m, "lo": lo, "hi": hi}


def cost_to_target(curves: Sequence[Curve], targets: float | Sequence[float], level: float = 0.95) -> dict:
    """{mean, lo, hi, reached}: the cost at which each seed's curve first reaches its target
    (`stats.cost_to_target_ci`), averaged over the seeds that reached it, and how many did."""
    m, lo, hi, n = cost_to_target_ci(curves, targets, level)
    return {"mean": m, "lo": lo, "hi": hi, "reached": n}


def format_interval(v: dict | None, digits: int = 3, signed: bool = False, sep: str = "") -> str:
    """'mean [lo, hi]' ('-' when there is none; no bracket when one seed gave no interval); a cost to a target
    adds how many seeds reached it: '(reached/seeds)' when the dict says of how many, else '(n seeds)'. `sep`
    is the thousands separator (',' for token counts)."""
    if not v or np.isnan(v["mean"]):
        return "-"
    spec = f"{'+' if signed else ''}{sep}.{digits}f"
    text = f"{v['mean']:{spec}}"
    if not np.isnan(v["lo"]):
        text += f" [{v['lo']:{spec}}, {v['hi']:{spec}}]"
    if "reached" in v:
        text += f" ({v['reached']}/{v['seeds']})" if "seeds" in v else f" ({v['reached']} seeds)"
    return text


def format_table(rows: list[dict], right_align: bool = True, rule: bool = True) -> str:
    """A plain-text table of the rows' keys: floats to 3 decimals, the first column left-aligned and the others
    right-aligned (or all left with `right_align=False`), a dashed rule under the header unless `rule=False`."""
    cols = list(dict.fromkeys(c for r in rows for c in r))
    cells = [[f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]

    def line(vals):
        return "  ".join(
            v.ljust(w) if i == 0 or not right_align else v.rjust(w) for i, (v, w) in enumerate(zip(vals, widths))
        )

    return "\n".join([line(cols)] + ([line(["-" * w for w in widths])] if rule else []) + [line(r) for r in cells])


def write_summary(stem: Path, rows: list[dict], table: str) -> None:
    """A command's summary: the table printed, and written as <stem>.txt beside its rows as <stem>.json."""
    print(table)
    stem.with_suffix(".json").write_text(dumps(rows, indent=2))  # strict JSON: a NaN figure is null
    stem.with_suffix(".txt").write_text(table + "\n")
