"""Knapsack RL's rollout allocation (Li et al.), solved exactly for the objective its authors state.

Knapsack RL maximises sum_i f(p_i, m_i) * w(p_i) over the prompts with 0 < p_i < 1, where
f(p, m) = 1 - p^m - (1-p)^m (both outcomes seen) and w(p) = p (1 - p)^2 (its "InfoGain" weight), with
min_n <= m_i <= max_n (its launch scripts: 2 and 128) and sum m_i = the budget; prompts with p = 0 or 1 are
fixed at `fixed_n` (2) rollouts. Success rates come from each prompt's reward history (the `history`
predictor). Reference: github.com/liziniu/KnapsackRL @ ca5d5f5b7e933378d916d05d1aeb4ae9de929ee5,
verl/trainer/ppo/exploration_utils.py; a faithful copy for timing lives in bench/knapsack_rl_reference.py.

Solver: for m >= 1 the unit gains w(p) p(1-p)(p^(m-1) + (1-p)^(m-1)) are non-increasing in m, so the
objective is separable concave above min_n and the budget's best units are found by one threshold on the
weighted unit gains (trace_rl.allocation's `_top_units`), exact, with ties broken in a seeded order.

Where upstream's code departs from that objective we follow the objective (docs/baselines.md has the list):
its DP scores a prompt left at min_n as 0 instead of f(p, min_n) w(p) (so it favours giving every prompt
one more rollout); the budget it cannot place is spread over the 0 < p < 1 prompts past max_n; and its
cost-based fallback drops budget and fails its own assertion when every prompt has 0 < p < 1. Here budget
the bounds cannot absorb goes evenly to the p = 0 prompts (upstream's fallback target), else to the p = 1
prompts, and only when every prompt has 0 < p < 1 past max_n over those (as upstream's DP does).
"""

from __future__ import annotations

import numpy as np

from .allocation import _budget, _probabilities, _seed, _tie_order, _top_units, _unit_gains, root_value

MIN_N, MAX_N, FIXED_N = 2, 128, 2  # Knapsack RL's launch scripts (examples/knapsack_trainer/*.sh)


def knapsack_rl_weight(p) -> np.ndarray:
    """w(p) = p (1 - p)^2, the weight Knapsack RL's DP puts on f(p, m); 0 outside 0 < p < 1."""
    p = np.asarray(p, dtype=np.float64)
    return np.where((p > 0) & (p < 1), p * (1.0 - p) ** 2, 0.0)


def knapsack_rl_value(p, m) -> float:
    """The stated objective sum_i f(p_i, m_i) w(p_i) (prompts with p = 0 or 1 contribute 0)."""
    p = np.asarray(p, dtype=np.float64)
    return float(np.sum(root_value(p, np.asarray(m)) * knapsack_rl_weight(p)))


def _count(name: str, x, low: int) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) or x < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {x!r}")
    return int(x)


def allocate_knapsack_rl(
    p, budget: int, min_n: int = MIN_N, max_n: int = MAX_N, fixed_n: int = FIXED_N, seed: int = 0
) -> np.ndarray:
    """Rollouts per prompt maximising Knapsack RL's objective exactly; sums to `budget`.

    Prompts with 0 < p < 1 get min_n..max_n, the others fixed_n. The budget must cover those minimums
    (upstream's own assertion fails otherwise: here a ValueError). Budget beyond what the bounds absorb is
    spread evenly (earlier prompts take the remainder, as upstream's loops do) over the p = 0 prompts, else
    the p = 1 prompts, else over every prompt past max_n. Ties between equal unit gains follow a seeded order.
    """
    p = _probabilities("p", p)
    budget = _budget("budget", budget)
    seed = _seed(seed)
    min_n = _count("min_n", min_n, 2)  # below 2 the unit gains are not those of f
    max_n = _count("max_n", max_n, min_n)
    fixed_n = _count("fixed_n", fixed_n, 0)
    n = p.size
    live = (p > 0) & (p < 1)
    m = np.where(live, min_n, fixed_n).astype(np.int64)
    if budget < int(m.sum()):
        raise ValueError(
            f"budget {budget} cannot cover min_n={min_n} for {int(live.sum())} prompts with 0 < p < 1 and "
            f"fixed_n={fixed_n} for the other {n - int(live.sum())}"
        )
    extra = budget - int(m.sum())
    idx = np.flatnonzero(live)
    width = min(max_n - min_n, extra)  # no prompt can take more than the budget left
    placed = min(extra, idx.size * width)
    if placed:
        pl, w = p[idx], knapsack_rl_weight(p[idx])
        # unit u of the extras is rollout min_n + u: its gain is w * (f(p, min_n + u) - f(p, min_n + u - 1))
        gains = lambda lo, hi: w[:, None] * _unit_gains(pl, lo + min_n, hi + min_n)
        m[idx] += _top_units(gains, idx.size, width, placed, _tie_order(idx.size, seed))
    left = extra - placed
    if left:
        for target in (p == 0.0, p == 1.0, np.ones(n, dtype=bool)):
            where = np.flatnonzero(target)
            if where.size:
                m[where] += left // where.size
                m[where[: left % where.size]] += 1
                break
    return m
