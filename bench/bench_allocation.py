"""Allocator speed and value: TRACE's exact allocators, and Knapsack RL's objective solved by
trace_rl.knapsack against Knapsack RL's own DP (its authors' file, which the repository does not ship).

Prints figures, asserts nothing. Run on one core: `PYTHONPATH=src python bench/bench_allocation.py`.
The last table needs upstream's verl/trainer/ppo/exploration_utils.py (github.com/liziniu/KnapsackRL @ ca5d5f5):
name it in TRACE_RL_KNAPSACK_REFERENCE (docs/baselines.md); without it the bench says so in one line and skips the
table. Knapsack RL's DP runs under numba when it is importable, as upstream's does (the pure-Python path is
skipped above a size where it would take minutes); pass a PYTHONPATH holding numba to time that path.
Goals (issue 2): B=1,024, M=2,048, m_max=16 in <= 1 ms; B=100,000, M=200,000 in <= 200 ms.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import sys
import time
from types import ModuleType

import numpy as np
import upstream_code  # bench/, on the path when the bench runs as a script

from trace_rl.allocation import allocate_prefixes, allocate_roots, root_value
from trace_rl.knapsack import allocate_knapsack_rl_repaired, knapsack_rl_value

KNAPSACK = "TRACE_RL_KNAPSACK_REFERENCE"


def knapsack_dp(v: np.ndarray, budget: int, max_per_prompt: int) -> float:
    """Plain exact DP: best[b] = max value with exactly b rollouts spent over the prompts so far."""
    best = np.full(budget + 1, -np.inf)
    best[0] = 0.0
    choices = [0] + list(range(2, max_per_prompt + 1))
    for vi in v:
        nxt = best.copy()  # m = 0
        for m in choices[1:]:
            if m > budget:
                break
            np.maximum(nxt[m:], best[: budget + 1 - m] + root_value(vi, m), out=nxt[m:])
        best = nxt
    return float(best[budget])


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), float(np.median(times))


def main() -> None:
    try:
        upstream = upstream_code.load(KNAPSACK)  # before the timings: a wrong path fails at once
    except ValueError as exc:
        sys.exit(f"bench_allocation: {exc}")
    rng = np.random.default_rng(0)
    print(f"{'case':<28}{'best ms':>10}{'median ms':>11}{'goal ms':>9}   knapsack DP")
    for B, M, goal in [(1024, 2048, 1.0), (100_000, 200_000, 200.0)]:
        v = rng.beta(0.5, 0.5, size=B)
        best, med = best_of(lambda v=v, M=M: allocate_roots(v, M, 16), 30 if B < 10_000 else 7)
        m = allocate_roots(v, M, 16)
        if B <= 2048:
            t0 = time.perf_counter()
            dp_value = knapsack_dp(v, M, 16)
            dp_s = time.perf_counter() - t0
            gap = dp_value - float(root_value(v, m).sum())
            dp = f"{dp_s * 1e3:.0f} ms measured ({dp_s / best:.0f}x slower); value gap {gap:.1e}"
        else:
            # O(B*M*m_max): extrapolate from a measured slice (B'=256 prompts, same M) instead of hours of DP
            t0 = time.perf_counter()
            knapsack_dp(v[:256], M, 16)
            dp_s = (time.perf_counter() - t0) * B / 256
            dp = f"~{dp_s:.0f} s extrapolated from 256 prompts ({dp_s / best:.0f}x slower)"
        print(f"B={B:<7} M={M:<8} m_max=16{best * 1e3:>10.2f}{med * 1e3:>11.2f}{goal:>9.0f}   {dp}")
    q = rng.random(96)
    best, med = best_of(lambda: allocate_prefixes(q, 8 * 16), 50)
    print(f"prefixes: 96 anchors, K=128  {best * 1e3:>6.3f} ms best, {med * 1e3:.3f} ms median")
    best, med = best_of(lambda: allocate_prefixes(q, 10**9), 5)
    print(f"prefixes: 96 anchors, K=1e9  {best * 1e3:>6.3f} ms best, {med * 1e3:.3f} ms median")
    print()
    if upstream is None:
        print(f"Knapsack RL table skipped: {upstream_code.unset_line(KNAPSACK)}")
    else:
        knapsack_rl_table(rng, upstream)


def knapsack_rl_table(rng: np.random.Generator, upstream: ModuleType) -> None:
    """Knapsack RL's objective (bounds 2..128, p = 0 or 1 fixed at 2), our exact solver vs upstream's DP."""
    print(f"Knapsack RL, max_n=128; upstream DP: {'numba' if upstream.NUMBA_AVAILABLE else 'pure Python'}")
    print(
        f"{'case':<29}{'ours ms':>8}{'upstream ms':>13}{'x':>7}   objective: ours - upstream (relative), prompts moved"
    )
    # numba compiles on the first call for each argument type: warm up through the same entry point
    warm = np.array([[1, x, 16] for x in rng.random(64)], dtype=object)
    upstream.sampling_budget_by_knapsack(warm, n=16, max_n=128, allow_fallback=False)
    for B, per in [(256, 3), (256, 8), (1024, 3), (1024, 8), (1024, 16)]:
        # reward-history success rates: 16-sample means, a fifth of prompts never or always solved
        p = rng.binomial(16, rng.beta(0.6, 0.6, size=B)) / 16
        M = B * per
        best, _ = best_of(lambda p=p, M=M: allocate_knapsack_rl_repaired(p, M), 7)
        m_ours = allocate_knapsack_rl_repaired(p, M)
        ours = knapsack_rl_value(p, m_ours)
        live = int(((p > 0) & (p < 1)).sum())
        work = live * (M - 2 * B) * 126
        if not upstream.NUMBA_AVAILABLE and work > 5e7:
            print(f"B={B:<5} M={M:<7} live={live:<5}{best * 1e3:>8.2f}{'skipped':>13}   (needs numba)")
            continue
        states = np.array([[1, x, 16] for x in p], dtype=object)
        t0 = time.perf_counter()
        m_up, _ = upstream.sampling_budget_by_knapsack(states, n=per, max_n=128, allow_fallback=False)
        up_s = time.perf_counter() - t0
        theirs = knapsack_rl_value(p, m_up)
        print(
            f"B={B:<5} M={M:<7} live={live:<5}{best * 1e3:>8.2f}{up_s * 1e3:>13.0f}{up_s / best:>7.0f}   "
            f"{ours - theirs:+.2e} ({(ours - theirs) / theirs:+.2%}), {int((m_ours != m_up).sum())}"
        )


if __name__ == "__main__":
    main()
