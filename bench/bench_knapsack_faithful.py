"""Knapsack RL as upstream runs it (`knapsack_rl`) against its repair (`knapsack_rl_repaired`) on the bench's
random batches: the objective gap of upstream's DP alone (its cost fallback off) and of the full faithful
allocation (fallback on), and the share of the budget that lands on prompts with p = 0 or 1.

Prints figures, asserts nothing: `PYTHONPATH=src python bench/bench_knapsack_faithful.py`.
"""

from __future__ import annotations

import time

import numpy as np

from trace_rl.knapsack import allocate_knapsack_rl, allocate_knapsack_rl_repaired, knapsack_rl_dp, knapsack_rl_value


def main() -> None:
    rng = np.random.default_rng(0)
    print("objective gap = (repaired - other) / other; 'on p=0/1' = budget share on prompts without contrast")
    for prompts, per in [(256, 3), (256, 8), (256, 16)]:
        # reward-history success rates: 16-sample means, as in bench_allocation.py
        p = rng.binomial(16, rng.beta(0.6, 0.6, size=prompts)) / 16
        budget = prompts * per
        live = (p > 0) & (p < 1)
        dp_only = np.full(prompts, 2, dtype=np.int64)
        t0 = time.perf_counter()
        dp_only[live] += knapsack_rl_dp(p[live], 2, 126, budget - 2 * prompts)
        dp_s = time.perf_counter() - t0
        rep, faithful = allocate_knapsack_rl_repaired(p, budget), allocate_knapsack_rl(p, budget)
        v_rep = knapsack_rl_value(p, rep)
        gap_dp = (v_rep - knapsack_rl_value(p, dp_only)) / v_rep
        gap_faithful = (v_rep - knapsack_rl_value(p, faithful)) / v_rep
        print(
            f"P={prompts} M={budget} live={int(live.sum())}: DP only {gap_dp:+.2e} "
            f"({int((rep != dp_only).sum())} prompts moved); faithful {gap_faithful:+.2%}, "
            f"on p=0/1 {faithful[~live].sum() / budget:.0%} (repaired {rep[~live].sum() / budget:.0%}); DP {dp_s:.1f} s"
        )


if __name__ == "__main__":
    main()
