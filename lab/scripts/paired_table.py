"""Paired differences between any two methods of `trace-rl simulate` runs, at equal rollouts and at equal turns,
across run directories (one study split over several commands, or a method run with other settings).

    python lab/scripts/paired_table.py runs/rootobj/eval runs/rootobj/eval_m16@m16 \\
        --pair trace_grad pcl --pair trace_grad@m16 pcl --seeds 100-107

Each RUN is a `simulate` output directory (seed<k>/metrics.jsonl with several seeds, metrics.jsonl with one);
`RUN@TAG` appends "@TAG" to the names of its methods, so the same method run with other settings (another
budget.max_per_prompt, another learning rate) gets a name of its own. Only seeds every run holds are used.

Prints one line per method (final accuracy with its t interval over seeds; the allocation and update chain per
step: effective ratio, prompts trained, rows with a non-zero advantage, update norm; rollouts and turns) and one
per pair (a - b paired by seed at equal rollouts and at equal turns, percentile bootstrap 95% intervals, and the
per-seed differences at equal rollouts), from `trace_rl.testbed.report`; with --curve, also a - b at each of a's
evaluations (b's curve read at a's rollouts), to see where along training a difference opens.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

from trace_rl.rollout.records import read_metrics
from trace_rl.rollout.report import accuracy_at, accuracy_curve
from trace_rl.stats import mean_ci, paired_bootstrap_ci
from trace_rl.testbed.report import paired_difference


def load(spec: str) -> dict[int, dict[str, list[dict]]]:
    """{seed: {method[@tag]: records}} of one RUN[@TAG]."""
    where, _, tag = spec.partition("@")
    root = Path(where)
    files = sorted(root.glob("seed*/metrics.jsonl")) or (
        [root / "metrics.jsonl"] if (root / "metrics.jsonl").exists() else []
    )
    if not files:
        raise SystemExit(f"{where}: no seed*/metrics.jsonl or metrics.jsonl (give a simulate output directory)")
    out: dict[int, dict[str, list[dict]]] = {}
    for path in files:
        for name, recs in read_metrics(path).items():
            seed = int(recs[0]["seed"])
            out.setdefault(seed, {})[f"{name}@{tag}" if tag else name] = recs
    return out


def parse_seeds(text: str) -> set[int]:
    seeds: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise SystemExit(f"--seeds: give seeds as 100-107 or 0,1,2, got {text!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        seeds.update(range(lo, hi + 1))
    return seeds


def per_step(recs: list[list[dict]], key: str) -> float:
    """Mean over seeds of the per-step mean of `key`."""
    return float(np.mean([np.mean([x.get(key, np.nan) for x in r]) for r in recs]))


def fmt(mean: float, lo: float, hi: float, scale: float = 100.0) -> str:
    return f"{mean * scale:+.1f} [{lo * scale:+.1f}, {hi * scale:+.1f}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="simulate output directories, each optionally RUN@TAG")
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"), help="report A - B")
    ap.add_argument("--seeds", help="only these seeds (100-107 or 0,1,2)")
    ap.add_argument("--curve", action="store_true", help="also a - b at each evaluation of a, at equal rollouts")
    args = ap.parse_args(argv)
    merged: dict[int, dict[str, list[dict]]] = {}
    seed_sets = []
    for spec in args.runs:
        one = load(spec)
        seed_sets.append(set(one))
        for seed, methods in one.items():
            merged.setdefault(seed, {}).update(methods)
    seeds = sorted(set.intersection(*seed_sets) & (parse_seeds(args.seeds) if args.seeds else set(merged)))
    if not seeds:
        raise SystemExit("no seed is held by every run (and --seeds)")
    methods = [m for m in merged[seeds[0]] if all(m in merged[s] for s in seeds)]
    print(f"seeds {seeds}")
    print(
        f"{'method':<24} {'final accuracy':<22} {'eff. ratio':>10} {'prompts':>8} {'rows A!=0':>9} "
        f"{'update norm':>11} {'rollouts':>9} {'turns':>7}"
    )
    for m in methods:
        recs = [merged[s][m] for s in seeds]
        final = mean_ci([accuracy_curve(r)[1][-1] for r in recs])
        step = {k: per_step(recs, k) for k in ("rollout/effective_ratio", "alloc/active_prompts", "train/update_norm")}
        nonzero = float(np.mean([[x["train/rows"] * x["train/nonzero_advantage_share"] for x in r] for r in recs]))
        rollouts = np.mean([accuracy_curve(r)[0][-1] for r in recs])
        turns = np.mean([accuracy_curve(r, cost="rollout/turns")[0][-1] for r in recs])
        print(
            f"{m:<24} {final[0]:.3f} [{final[1]:.3f}, {final[2]:.3f}]  {step['rollout/effective_ratio']:>10.3f} "
            f"{step['alloc/active_prompts']:>8.1f} {nonzero:>9.0f} {step['train/update_norm']:>11.3f} "
            f"{rollouts:>9.0f} {turns:>7.0f}"
        )
    if args.pair:
        print(f"\n{'a - b (points)':<40} {'equal rollouts':<22} {'equal turns':<22} per seed at equal rollouts")
    for a, b in args.pair:
        missing = [x for x in (a, b) if x not in methods]
        if missing:
            raise SystemExit(f"--pair: {', '.join(missing)} not in the runs on every seed; have {', '.join(methods)}")
        ra, rb = [merged[s][a] for s in seeds], [merged[s][b] for s in seeds]
        r = paired_difference(ra, rb, "rollouts")
        t = paired_difference(ra, rb, "turns")
        seeds_txt = " ".join(f"{100 * d:+.1f}" for d in r["per_seed"])
        at_rollouts, at_turns = fmt(r["mean"], r["lo"], r["hi"]), fmt(t["mean"], t["lo"], t["hi"])
        print(f"{a + ' - ' + b:<40} {at_rollouts:<22} {at_turns:<22} {seeds_txt}")
        if args.curve:
            xs = np.mean([accuracy_curve(x)[0] for x in ra], axis=0)
            for i, x in enumerate(xs[1:], 1):
                at = [accuracy_curve(p)[0][i] for p in ra]
                d = [
                    accuracy_at(accuracy_curve(p), c) - accuracy_at(accuracy_curve(q), c) for p, q, c in zip(ra, rb, at)
                ]
                lo_hi = paired_bootstrap_ci(d, np.zeros(len(d)))
                print(f"    at {x:>6.0f} rollouts: {fmt(*lo_hi)}")


if __name__ == "__main__":
    main(sys.argv[1:])
