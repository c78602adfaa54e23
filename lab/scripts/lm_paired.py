"""Paired differences between any two methods of `trace-rl compare` runs (the LM task), where `compare`'s own table
pairs every method with GRPO only: an ablation reads each variant against another (root-only against uniform).

    python lab/scripts/lm_paired.py runs/eval --pair trace_root_only trace_uniform --pair trace trace_prefix_only

OUT is a compare output directory (OUT/<method>/<pair>/train_summary.json, a pair being `seed<k>` or
`ws<W>-seed<k>`); methods are named as compare names them (`trace:grpo` or its directory name `trace_adv-grpo`).
Only the pairs every listed method finished are used (so the per-method lines are paired too; the left-out pairs
are named), and only evaluation seeds (100 and up) unless --tuning is given.

Prints one line per method (pairs, accuracy before and after, gain, the mean of the evaluations after the start,
effective ratio, each with a t interval over pairs; mixed prompts a step, flips per continuation and contrast
groups per 1k rollouts over all steps; generated tokens per run) and one per pair of methods a - b: the paired
difference of final accuracy, of the mean of evaluations, and at equal tokens (both curves read at the smaller
token total), each with a paired percentile-bootstrap 95% interval over the pairs, the ratio of the mean
effective ratios and their paired difference (with its interval), and the per-warm-start means of the final
difference (a sign shared by every warm start is what the protocol asks for).
With --runs NAME=DIR, the method directory DIR of another compare output (a variant of a method run with
other settings, so under its own `out`) is read as one more method, NAME, paired with the others by pair name.
Several OUT directories, or NAME=DIR,DIR,..., pool studies of the same settings run on other seeds (a pair found
twice for one method is refused). --seeds 108-111,115 reads only those seeds, so a study's reading stays the same
after later seeds join its directory.
With --plot FILE.png, the accuracy curves against rollouts (the mean over pairs and their min-max band).
With --drivers, which per-run statistic tracks the accuracy gain across the listed methods: each statistic and the
gain are centred within each pair (so warm start and seed drop out and only the method's effect is left), then
their Pearson correlation over the runs, with a 95% bootstrap interval over pairs, and the slope of gain on it.
The figures come from `trace_rl.train.compare` and `trace_rl.rollout.report`, the functions compare's table uses.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from trace_rl.rollout.report import (
    at_equal_cost,
    format_interval,
    format_table,
    interval,
    mean_of,
    paired_interval,
    run_means,
)
from trace_rl.train.compare import (
    FIRST_EVALUATION_SEED,
    curves,
    load_runs,
    mean_trained_accuracy,
    method_of_dir,
    run_dir_name,
)


def load(
    out: Path | list[Path],
    methods: list[str],
    tuning: bool,
    extra: dict[str, Path | list[Path]] | None = None,
    seeds: set[int] | None = None,
) -> dict[str, dict[str, dict]]:
    """{method: {pair: summary with records}} of the finished runs under `out` (one compare output directory, or
    several pooled: studies of the same settings on other seeds); `extra` maps a name to a method directory
    elsewhere, or several pooled (their <pair>/ folders), read as a method of that name (a variant compare wrote to
    its own output directory, e.g. the same method under other settings). A pair a method holds in two of the
    pooled directories is refused: which run it means would be a guess. `seeds`, when given, keeps only runs of
    those seeds (so a study's reading stays the same after later seeds join its directory)."""
    outs, extra = ([out] if isinstance(out, Path) else list(out)), extra or {}
    found: dict[str, list[tuple[Path, dict]]] = {}
    for where_out in outs:
        for spec, summaries in load_runs(where_out, [m for m in methods if m not in extra]).items():
            found.setdefault(spec, []).extend((where_out / run_dir_name(spec), s) for s in summaries)
    for name, wheres in extra.items():
        for where in [wheres] if isinstance(wheres, Path) else wheres:
            if not where.is_dir():
                raise SystemExit(
                    f"--runs {name}={where}: not a directory (give a method directory of a compare output)"
                )
            runs_there = load_runs(where.parent, [method_of_dir(where.name)])
            found.setdefault(name, []).extend((where, s) for s in next(iter(runs_there.values()), []))
    by_pair = {}
    for spec in methods:
        kept: dict[str, dict] = {}
        for where, summary in found.get(spec, []):
            if not tuning and summary["seed"] < FIRST_EVALUATION_SEED:
                continue
            if seeds is not None and summary["seed"] not in seeds:
                continue
            if summary["pair"] in kept:
                raise SystemExit(f"{spec}: pair {summary['pair']} is in two of the pooled directories (one is {where})")
            kept[summary["pair"]] = summary
        if not kept:
            where = ", ".join(str(o) for o in outs)
            which = " on evaluation seeds" if not tuning else ""
            which += f" of --seeds {sorted(seeds)}" if seeds is not None else ""
            raise SystemExit(f"{where}: no finished run of {spec!r}{which}")
        by_pair[spec] = kept
    return by_pair


def common_pairs(runs: dict[str, dict[str, dict]]) -> tuple[dict[str, dict[str, dict]], list[str]]:
    """The runs of the pairs every method holds, and the pairs left out (held by some methods only)."""
    every = set.intersection(*(set(r) for r in runs.values()))
    if not every:
        raise SystemExit(f"the methods {', '.join(runs)} share no finished pair")
    dropped = sorted(set.union(*(set(r) for r in runs.values())) - every)
    return {m: {p: r[p] for p in sorted(every)} for m, r in runs.items()}, dropped


def method_row(spec: str, runs: dict[str, dict]) -> dict:
    seeds = list(runs.values())
    er = run_means([s["records"] for s in seeds], "rollout/effective_ratio")
    return {
        "method": spec,
        "pairs": str(len(seeds)),
        "acc_before": format_interval(interval([s["accuracy_before"] for s in seeds])),
        "acc_after": format_interval(interval([s["accuracy_after"] for s in seeds])),
        "gain": format_interval(interval([s["accuracy_after"] - s["accuracy_before"] for s in seeds]), signed=True),
        "acc_mean": format_interval(interval([mean_trained_accuracy(s) for s in seeds])),
        "effective_ratio": format_interval(interval(er)),
        "mixed prompts/step": f"{_mixed_per_step(seeds):.2f}",
        "flips/continuation": f"{_ratio(seeds, 'rollout/flips', 'rollout/continuations'):.3f}",
        "groups/1k rollouts": f"{1000 * _ratio(seeds, 'rollout/contrast_groups', 'rollout/rollouts'):.0f}",
        "tokens": f"{np.mean([sum(r['rollout/generated_tokens'] for r in s['records']) for s in seeds]):,.0f}",
    }


def _mixed_per_step(seeds: list[dict]) -> float:
    """Mixed prompts a step (effective ratio x prompts given a rollout): an allocator that spreads a budget over
    more prompts can find more mixed ones at a lower share."""
    vals = [
        r["rollout/effective_ratio"] * r["alloc/active_prompts"]
        for s in seeds
        for r in s["records"]
        if "alloc/active_prompts" in r
    ]
    return float(np.mean(vals)) if vals else float("nan")


def _ratio(seeds: list[dict], num: str, den: str) -> float:
    """sum of `num` over sum of `den`, over every step of every run (nan when `den` is never positive)."""
    n = sum(r.get(num, 0) for s in seeds for r in s["records"])
    d = sum(r.get(den, 0) for s in seeds for r in s["records"])
    return n / d if d else float("nan")


def pair_row(a: str, b: str, runs: dict[str, dict[str, dict]]) -> dict:
    """a - b over the pairs both hold (the module docstring lists the columns)."""
    common = sorted(set(runs[a]) & set(runs[b]))
    if not common:
        raise SystemExit(f"{a} and {b} share no finished pair")
    ra, rb = [runs[a][p] for p in common], [runs[b][p] for p in common]
    final = paired_interval([s["accuracy_after"] for s in ra], [s["accuracy_after"] for s in rb])
    mean = paired_interval([mean_trained_accuracy(s) for s in ra], [mean_trained_accuracy(s) for s in rb])
    tokens = paired_interval(*zip(*[at_equal_cost(curves(x)["tokens"], curves(y)["tokens"]) for x, y in zip(ra, rb)]))
    er_a = run_means([s["records"] for s in ra], "rollout/effective_ratio")
    er_b = run_means([s["records"] for s in rb], "rollout/effective_ratio")
    by_warm: dict[int, list[float]] = {}
    for x, y in zip(ra, rb):
        by_warm.setdefault(x.get("warm", 0), []).append(x["accuracy_after"] - y["accuracy_after"])
    return {
        "a - b": f"{a} - {b}",
        "pairs": str(len(common)),
        "final": format_interval(final, signed=True),
        "mean_of_evals": format_interval(mean, signed=True),
        "equal_tokens": format_interval(tokens, signed=True),
        "er_a/er_b": f"{np.mean(er_a) / np.mean(er_b):.2f}" if np.mean(er_b) else "-",
        "er_a - er_b": format_interval(paired_interval(er_a, er_b), signed=True),
        "final by warm start": ", ".join(f"tiny@{w}: {np.mean(d):+.3f}" for w, d in sorted(by_warm.items())),
    }


# per-run statistics --drivers sets against the accuracy gain: name -> function of a run's step records
DRIVERS = {
    "effective ratio": lambda recs: mean_of(recs, "rollout/effective_ratio"),
    "mixed prompts a step": lambda recs: _mixed_per_step([{"records": recs}]),
    "prompts a step": lambda recs: mean_of(recs, "alloc/active_prompts"),
    "contrast groups a step": lambda recs: np.mean([r.get("rollout/contrast_groups", 0) for r in recs]),
    "success rate of the rollouts": lambda recs: mean_of(recs, "rollout/success_rate"),
    "tokens (k)": lambda recs: sum(r["rollout/generated_tokens"] for r in recs) / 1000,
    # how far each update moved the policy, and how often update.max_update_kl had to scale a step back
    "update KL a step (x1e3)": lambda recs: 1000 * mean_of(recs, "train/update_kl"),
    "steps the KL bound scaled": lambda recs: mean_of(
        [{"s": float(r["train/update_scale"] < 1)} for r in recs if "train/update_scale" in r], "s"
    ),
}


def drivers(runs: dict[str, dict[str, dict]], resamples: int = 2000, seed: int = 0) -> list[dict]:
    """One row per statistic of DRIVERS: within-pair Pearson r with the gain over every run of `runs` (the
    methods' runs on their common pairs), its percentile-bootstrap interval over pairs, and the slope."""
    pairs = sorted(next(iter(runs.values())))
    gain = np.array([[runs[m][p]["accuracy_after"] - runs[m][p]["accuracy_before"] for m in runs] for p in pairs])
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(pairs), size=(resamples, len(pairs)))
    rows = []
    for name, stat in DRIVERS.items():
        x = np.array([[stat(runs[m][p]["records"]) for m in runs] for p in pairs], dtype=float)

        def fit(idx: np.ndarray, x: np.ndarray = x) -> tuple[float, float]:
            xc = (x[idx] - x[idx].mean(axis=1, keepdims=True)).ravel()
            yc = (gain[idx] - gain[idx].mean(axis=1, keepdims=True)).ravel()
            sx, sy = np.sqrt((xc * xc).sum()), np.sqrt((yc * yc).sum())
            if sx == 0 or sy == 0:
                return float("nan"), float("nan")
            return float((xc * yc).sum() / (sx * sy)), float((xc * yc).sum() / (sx * sx))

        r, slope = fit(np.arange(len(pairs)))
        boot = np.array([fit(d)[0] for d in draws])
        boot = boot[np.isfinite(boot)]
        lo, hi = np.percentile(boot, [2.5, 97.5]) if boot.size else (float("nan"),) * 2
        rows.append(
            {
                "statistic": name,
                "within-pair r with gain": f"{r:+.2f} [{lo:+.2f}, {hi:+.2f}]",
                "gain points per unit": f"{100 * slope:+.3f}",
                "mean by method": ", ".join(f"{m} {x[:, j].mean():.2f}" for j, m in enumerate(runs)),
            }
        )
    return rows


def parse_seeds(text: str) -> set[int]:
    """The seeds of `--seeds`: comma-separated seeds and inclusive ranges (108-111,115); one line when malformed."""
    seeds: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise SystemExit(f"--seeds {text!r}: give seeds and ranges, e.g. 108-111,115") from None
        if last < first:
            raise SystemExit(f"--seeds {text!r}: the range {part.strip()} runs backwards")
        seeds.update(range(first, last + 1))
    return seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, nargs="+", help="a trace-rl compare output directory (several: pooled)")
    parser.add_argument("--pair", nargs=2, action="append", metavar=("A", "B"), required=True, help="print A - B")
    parser.add_argument("--tuning", action="store_true", help="also use tuning seeds (below 100)")
    parser.add_argument("--plot", type=Path, help="also draw held-out accuracy against rollouts (PNG), seed bands")
    parser.add_argument("--drivers", action="store_true", help="also: which per-run statistic tracks the gain")
    parser.add_argument(
        "--runs",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="read the method directory DIR (OUT2/<method>; DIR,DIR,...: pooled) as a method named NAME",
    )
    parser.add_argument("--seeds", help="read only these seeds: a list of seeds and ranges, e.g. 108-111,115")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds) if args.seeds else None
    extra = {}
    for item in args.runs:
        name, sep, where = item.partition("=")
        if not sep or not name or not where:
            raise SystemExit(f"--runs {item!r}: give NAME=DIR, e.g. trace_flipcal=runs/eval_flip/trace")
        extra[name] = [Path(w) for w in where.split(",")]
    for out in args.out:
        if not out.is_dir():
            raise SystemExit(f"{out}: not a directory (give a trace-rl compare output directory)")
    pairs = [tuple(m if m in extra else method_of_dir(m) for m in p) for p in args.pair]
    methods = list(dict.fromkeys(m for p in pairs for m in p))
    runs, dropped = common_pairs(load(args.out, methods, args.tuning, extra, seeds))
    if dropped:
        print(f"left out (not finished by every method): {', '.join(dropped)}\n")
    print(format_table([method_row(m, runs[m]) for m in methods]))
    print()
    print(format_table([pair_row(a, b, runs) for a, b in pairs], right_align=False))
    print("\nmean [95% interval]: t over pairs per method, paired percentile bootstrap per difference")
    if args.drivers:
        n_pairs = len(next(iter(runs.values())))
        print(f"\nwhat tracks the gain over {len(methods)} methods x {n_pairs} pairs (centred within pairs):")
        print(format_table(drivers(runs), right_align=False))
    if args.plot:
        from trace_rl.plots import plot_metric
        from trace_rl.rollout.report import cost_points

        acc = {m: cost_points([curves(s)["rollouts"] for s in r.values()]) for m, r in runs.items()}
        title = f"Held-out accuracy against rollouts ({len(next(iter(runs.values())))} pairs)"
        print(f"wrote {plot_metric(acc, 'eval/accuracy', args.plot, title, xlabel='rollouts spent')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
