"""Allocator speed: TRACE's exact root allocator vs the plain O(B*M*m_max) knapsack DP (as Knapsack RL uses).

Prints figures, asserts nothing. Run on one core: `python bench/bench_allocation.py`.
Goals (issue 2): B=1,024, M=2,048, m_max=16 in <= 1 ms; B=100,000, M=200,000 in <= 200 ms.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402

import numpy as np  # noqa: E402

from trace_rl.allocation import allocate_prefixes, allocate_roots, root_value  # noqa: E402


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
    rng = np.random.default_rng(0)
    print(f"{'case':<28}{'best ms':>10}{'median ms':>11}{'goal ms':>9}   knapsack DP")
    for B, M, goal in [(1024, 2048, 1.0), (100_000, 200_000, 200.0)]:
        v = rng.beta(0.5, 0.5, size=B)
        best, med = best_of(lambda: allocate_roots(v, M, 16), 30 if B < 10_000 else 7)
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


if __name__ == "__main__":
    main()
