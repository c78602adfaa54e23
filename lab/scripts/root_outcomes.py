"""How a method's chosen prompts came out: per method directory of a `compare` output, over every run and step.

    python lab/scripts/root_outcomes.py runs/eval/grpo runs/eval_root/trace [...]

Read from each run's predictions.jsonl (root records with at least two bare rollouts): roots, mean bare rollouts
a root, the bare rollouts' success share, and the shares of roots whose bare rollouts all failed, all succeeded
or disagreed, then the share whose tree (continuations included) holds both outcomes, the effective ratio's
numerator. It tells whether a low effective ratio comes from where the roots lie (all-fail and all-succeed
prompts) or from how few rollouts each gets.

A second table says what stage 2 does to the ratio, from the same records read tree by tree (a tree's records
are written root first, and its continuations must add up to its leaves less its bare rollouts, which is
checked): of the trees whose bare rollouts agree, how many continuations each got, how often one flipped its
rollout's outcome and the share made mixed; the same for trees already mixed; and an estimate of the ratio had
every continuation gone to the agreeing trees: each flipping at the rate measured for its kind (all failed, all
succeeded), independently, the units placed exactly for the expected number made mixed (`allocate_prefixes`),
pooled over all the runs' trees. It is a model, not a bound: the allocator already took the likeliest prefixes
(further units flip less), flips under one tree go together (fewer trees made mixed), while rates per tree
rather than per kind would place the units better. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from trace_rl.allocation import allocate_prefixes, prefix_value


def _tree_row(tree: list[float], path: Path, where: str) -> tuple[float, ...]:
    """A finished tree's row, once its continuations add up to its leaves less its bare rollouts."""
    bare, succ, target, leaves, cont, flips = tree
    if cont != leaves - bare:
        raise SystemExit(
            f"root_outcomes: {path}, the tree ending {where}: {cont:.0f} continuations under {leaves:.0f} "
            f"leaves and {bare:.0f} bare rollouts; the records are not one tree after another"
        )
    return bare, succ, target, cont, flips


def tree_rows(method_dir: Path) -> np.ndarray:
    """(bare rollouts, bare successes, target, continuations, flips) of every tree with a root record."""
    rows = []
    for path in sorted(method_dir.glob("*/predictions.jsonl")):
        tree: list[float] | None = None  # bare, successes, target, leaves, continuations, flips of the open tree
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("depth") == 0:
                if "bare_rollouts" not in rec:
                    raise SystemExit(f"root_outcomes: {path} line {n}: a root record without bare_rollouts (older run)")
                if tree is not None:
                    rows.append(_tree_row(tree, path, f"before line {n}"))
                tree = [rec["bare_rollouts"], rec["bare_successes"], rec["target"], rec["leaves"], 0, 0]
            elif tree is not None:
                tree[4] += rec.get("continuations", 0)
                tree[5] += rec.get("flips", 0)
        if tree is not None:
            rows.append(_tree_row(tree, path, "at the end of the file"))
    return np.array(rows, dtype=np.float64).reshape(-1, 5)


def root_rows(trees: np.ndarray) -> np.ndarray:
    """(bare rollouts, bare successes, target) of every root with at least two bare rollouts, from `tree_rows`."""
    return trees[trees[:, 0] >= 2, :3]


def stage2_figures(rows: np.ndarray) -> dict[str, float]:
    """What stage 2 spent where, and an estimate of the ratio with every continuation in the agreeing trees."""
    k, s, target, cont, flips = rows.T
    agree = (s == 0) | (s == k)
    mixed_tree = (target > 0) & (target < 1)  # binary rewards: a tree whose bare rollouts disagree is mixed
    c_agree, c_mixed = cont[agree].sum(), cont[~agree].sum()
    # the estimate: each agreeing tree flips at its kind's measured rate (all failed / all succeeded), every
    # continuation independent, and the units placed exactly for the expected trees made mixed
    rates = np.zeros(len(rows))
    for kind in (agree & (s == 0), agree & (s == k) & (s > 0)):
        c = cont[kind].sum()
        rates[kind] = flips[kind].sum() / c if c else 0.0
    units = allocate_prefixes(rates[agree], int(cont.sum())) if agree.any() else np.zeros(0, dtype=np.int64)
    made = prefix_value(rates[agree], units)
    return {
        "trees": float(len(rows)),
        "agreeing": float(agree.mean()),
        "cont_agree": float(c_agree / max(agree.sum(), 1)),
        "flip_agree": float(flips[agree].sum() / c_agree) if c_agree else 0.0,
        "made_mixed": float(mixed_tree[agree].mean()) if agree.any() else 0.0,
        "cont_mixed": float(c_mixed / max((~agree).sum(), 1)),
        "flip_mixed": float(flips[~agree].sum() / c_mixed) if c_mixed else 0.0,
        "ratio": float(mixed_tree.mean()),
        "estimate": float(((~agree).sum() + made) / len(rows)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="method directories of compare outputs (holding seed*/ runs)")
    args = parser.parse_args()
    print(
        f"{'method dir':32s} {'roots':>6s} {'bare/root':>9s} {'success':>7s} {'all fail':>8s} {'all succ':>8s}"
        f" {'bare mixed':>10s} {'tree mixed':>10s}"
    )
    trees = {d: tree_rows(Path(d)) for d in args.dirs}  # each directory read once, for both tables
    for d in args.dirs:
        a = root_rows(trees[d])
        if not len(a):
            raise SystemExit(f"root_outcomes: no root records with bare rollouts under {d}")
        k, s, target = a.T
        fail, succ = float(np.mean(s == 0)), float(np.mean(s == k))
        mixed_tree = float(np.mean((target > 0) & (target < 1)))
        print(
            f"{d:32s} {len(a):6d} {k.mean():9.2f} {s.sum() / k.sum():7.3f} {fail:8.3f} {succ:8.3f}"
            f" {1 - fail - succ:10.3f} {mixed_tree:10.3f}"
        )
    print(
        f"\nstage 2, by whether a tree's bare rollouts agree\n{'method dir':32s} {'trees':>6s} {'agreeing':>8s}"
        f" {'cont/tree':>9s} {'flips/cont':>10s} {'made mixed':>10s} {'| mixed: cont/tree':>18s} {'flips/cont':>10s}"
        f" {'ratio':>6s} {'estimate':>8s}"
    )
    for d in args.dirs:
        f = stage2_figures(trees[d])
        print(
            f"{d:32s} {f['trees']:6.0f} {f['agreeing']:8.3f} {f['cont_agree']:9.2f} {f['flip_agree']:10.3f}"
            f" {f['made_mixed']:10.3f} {f['cont_mixed']:18.2f} {f['flip_mixed']:10.3f} {f['ratio']:6.3f}"
            f" {f['estimate']:8.3f}"
        )


if __name__ == "__main__":
    main()
