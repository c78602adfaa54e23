"""How a method's chosen prompts came out: per method directory of a `compare` output, over every run and step.

    python bench/root_outcomes.py runs/eval/grpo runs/eval_root/trace [...]

Read from each run's predictions.jsonl (root records with at least two bare rollouts): roots, mean bare rollouts
a root, the bare rollouts' success share, and the shares of roots whose bare rollouts all failed, all succeeded
or disagreed, then the share whose tree (continuations included) holds both outcomes, the effective ratio's
numerator. It tells whether a low effective ratio comes from where the roots lie (all-fail and all-succeed
prompts) or from how few rollouts each gets. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def root_rows(method_dir: Path) -> np.ndarray:
    """(bare rollouts, bare successes, target) of every root with at least two bare rollouts."""
    rows = []
    for path in sorted(method_dir.glob("*/predictions.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line) if line.strip() else {}
            if rec.get("depth") == 0 and rec.get("bare_rollouts", 0) >= 2:
                rows.append((rec["bare_rollouts"], rec["bare_successes"], rec["target"]))
    return np.array(rows, dtype=np.float64).reshape(-1, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="method directories of compare outputs (holding seed*/ runs)")
    args = parser.parse_args()
    print(
        f"{'method dir':32s} {'roots':>6s} {'bare/root':>9s} {'success':>7s} {'all fail':>8s} {'all succ':>8s}"
        f" {'bare mixed':>10s} {'tree mixed':>10s}"
    )
    for d in args.dirs:
        a = root_rows(Path(d))
        if not len(a):
            raise SystemExit(f"root_outcomes: no root records with bare rollouts under {d}")
        k, s, target = a.T
        fail, succ = float(np.mean(s == 0)), float(np.mean(s == k))
        mixed_tree = float(np.mean((target > 0) & (target < 1)))
        print(
            f"{d:32s} {len(a):6d} {k.mean():9.2f} {s.sum() / k.sum():7.3f} {fail:8.3f} {succ:8.3f}"
            f" {1 - fail - succ:10.3f} {mixed_tree:10.3f}"
        )


if __name__ == "__main__":
    main()
