"""Knapsack RL's rollout allocation (Li et al.): as its authors' code runs it, and a repaired variant.

Knapsack RL maximises sum_i f(p_i, m_i) * w(p_i) over the prompts with 0 < p_i < 1, where
f(p, m) = 1 - p^m - (1-p)^m (both outcomes seen) and w(p) = p (1 - p)^2 (its "InfoGain" weight), with
min_n <= m_i <= max_n (its launch scripts: 2 and 128); prompts with p = 0 or 1 get `fixed_n` (2). Success rates
come from each prompt's reward history (the `history` predictor). Reference: github.com/liziniu/KnapsackRL @
ca5d5f5b7e933378d916d05d1aeb4ae9de929ee5, verl/trainer/ppo/exploration_utils.py `sampling_budget_by_knapsack`
(called by ray_trainer.py `budget_allocation` with the launch script's min_n, max_n, negative_n, positive_n and
the function's defaults otherwise: allow_fallback=True, alpha=0.9, cost_estimation="probability"). The repository
ships no upstream code: the tests hold upstream's recorded outputs, and the tests and bench/bench_allocation.py run
it side by side where the developer names its file (TRACE_RL_KNAPSACK_REFERENCE; docs/baselines.md).

Two allocators (docs/baselines.md lists the differences with examples):

- `allocate_knapsack_rl` (method `knapsack_rl`, the default) is upstream's computation: the cost fallback first
  (cost_i = log(1 - alpha) / log(max(p, 1-p)), truncated, capped at max_n; when their sum is below the budget
  left after the minimums, the excess goes to the p = 0 prompts, else to the p = 1 prompts, evenly, earlier
  prompts taking the remainder), then upstream's DP, which scores a prompt left at min_n as 0 (so it tends to
  give every prompt one more rollout), with its tie-breaking, then any budget its bounds cannot absorb spread
  past max_n over the 0 < p < 1 prompts. Where upstream's own code fails its assertion we keep the budget:
  when every prompt has 0 < p < 1 and the fallback fires (upstream divides by zero and loses the excess) the DP
  takes the whole budget, as with upstream's allow_fallback=False; when no prompt has 0 < p < 1 and none has
  p = 0 (upstream gives every prompt budget // P) the budget is split as evenly as possible.
  The DP is upstream's O(prompts * budget * max_n), vectorised over the budget axis with numpy: fine at the
  sizes trace-rl trains with (tens of prompts, a few hundred rollouts), slow at thousands of prompts.
- `allocate_knapsack_rl_repaired` (method `knapsack_rl_repaired`) is the exact optimum of the stated objective,
  without the cost fallback: the weighted unit gains above min_n are non-increasing in m, so one threshold on
  them (trace_rl.allocation's `top_units`) is exact, ties broken in a seeded order. Budget the bounds cannot
  absorb goes evenly to the p = 0 prompts, else the p = 1 prompts, else past max_n over every prompt.
"""

from __future__ import annotations

import numpy as np

from .allocation import check_budget, check_probabilities, check_seed, root_value, tie_order, top_units, unit_gains

MIN_N, MAX_N, FIXED_N = 2, 128, 2  # Knapsack RL's launch scripts (examples/knapsack_trainer/*.sh)
ALPHA = 0.9  # sampling_budget_by_knapsack's default confidence for the "probability" cost estimate


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


def _start(p, budget, min_n, max_n, fixed_n) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, int, int]:
    """Checked inputs, the minimum allocation and the budget left above it (shared by both allocators)."""
    p = check_probabilities("p", p)
    budget = check_budget("budget", budget)
    min_n = _count("min_n", min_n, 2)  # below 2 the unit gains are not those of f
    max_n = _count("max_n", max_n, min_n)
    fixed_n = _count("fixed_n", fixed_n, 0)
    live = (p > 0) & (p < 1)
    m = np.where(live, min_n, fixed_n).astype(np.int64)
    if budget < int(m.sum()):
        raise ValueError(
            f"budget {budget} cannot cover min_n={min_n} for {int(live.sum())} prompts with 0 < p < 1 and "
            f"fixed_n={fixed_n} for the other {p.size - int(live.sum())}"
        )
    return p, budget, live, m, min_n, max_n


def _spread(m: np.ndarray, where: np.ndarray, amount: int) -> None:
    """amount split evenly over the indices `where`, the first ones taking the remainder (upstream's loops)."""
    m[where] += amount // where.size
    m[where[: amount % where.size]] += 1


def knapsack_rl_dp(p: np.ndarray, min_n: int, width: int, budget: int) -> np.ndarray:
    """Upstream's `solve_by_dp` over the live prompts p: extra rollouts k in 0..width per prompt, value
    f(p, min_n + k) w(p) for k >= 1 and 0 for k = 0, the largest reachable budget <= `budget`, then what is
    left spread past the bounds. Same recurrence, same strict-improvement tie rule (the first k reaching the
    maximum, and k = 0 unless some k beats it) and same backtracking, vectorised over the budget axis."""
    n = p.size
    out = np.zeros(n, dtype=np.int64)
    if budget <= 0 or n == 0:
        return out
    if width == 0:  # max_n = min_n: the DP places nothing, all of it goes past the bounds
        _spread(out, np.arange(n), budget)
        return out
    k = np.arange(1, width + 1)
    exps = (k + min_n).astype(np.float32)
    w_axis = np.arange(budget + 1)
    src = w_axis[:, None] - k[None, :]  # dp[i-1, w-k]
    ok = src >= 0
    src = np.where(ok, src, 0)
    prev = np.full(budget + 1, -np.inf)
    prev[0] = 0.0
    choice = np.zeros((n, budget + 1), dtype=np.int64)
    for i in range(n):
        # upstream keeps success rates in a float32 array, so its (pure-Python) DP computes the gains in
        # float32: the same here, which reproduces its choice among exactly tied sums too
        sr = np.float32(p[i])
        gain = ((1 - sr**exps - (1 - sr) ** exps) * sr * ((1 - sr) ** 2)).astype(np.float64)
        cand = np.where(ok, prev[src] + gain[None, :], -np.inf)
        best_k = np.argmax(cand, axis=1)  # first k at the maximum, as upstream's strict `>` keeps it
        best = cand[w_axis, best_k]
        take = best > prev
        choice[i] = np.where(take, best_k + 1, 0)
        prev = np.where(take, best, prev)
    usable = budget
    while usable > 0 and prev[usable] == -np.inf:
        usable -= 1
    w = usable
    for i in range(n - 1, -1, -1):
        out[i] = choice[i, w]
        w -= out[i]
    left = budget - usable
    if left > 0:
        _spread(out, np.arange(n), left)
    return out


def allocate_knapsack_rl(p, budget: int, min_n: int = MIN_N, max_n: int = MAX_N, fixed_n: int = FIXED_N) -> np.ndarray:
    """Rollouts per prompt as Knapsack RL's code allocates them (cost fallback, then its DP); sums to `budget`.

    Deterministic (upstream has no randomness here). The budget must cover min_n for the 0 < p < 1 prompts and
    fixed_n for the others (upstream's assertion fails otherwise: here a ValueError)."""
    p, budget, live, m, min_n, max_n = _start(p, budget, min_n, max_n, fixed_n)
    extra = budget - int(m.sum())
    idx = np.flatnonzero(live)
    if extra > 0 and idx.size == 0:
        zeros = np.flatnonzero(p == 0.0)
        if zeros.size:
            _spread(m, zeros, extra)
        else:  # upstream sets every prompt to budget // P; the remainder goes to the first prompts
            m[:] = 0
            _spread(m, np.arange(p.size), budget)
        return m
    if extra > 0:
        with np.errstate(divide="ignore"):
            cost = np.log(1.0 - ALPHA) / np.log(np.maximum(p[idx], 1.0 - p[idx]))
        estimated = int(sum(int(min(max_n, c)) for c in cost.astype(np.float32)))
        if estimated < extra:
            zeros, others = np.flatnonzero(p == 0.0), np.flatnonzero(~live)
            target = zeros if zeros.size else others
            if target.size:  # with no such prompt upstream loses the excess and fails its assertion
                _spread(m, target, extra - estimated)
                extra = estimated
    m[idx] += knapsack_rl_dp(p[idx], min_n, max_n - min_n, extra)
    return m


def allocate_knapsack_rl_repaired(
    p, budget: int, min_n: int = MIN_N, max_n: int = MAX_N, fixed_n: int = FIXED_N, seed: int = 0
) -> np.ndarray:
    """Rollouts per prompt maximising Knapsack RL's stated objective exactly, without its cost fallback; sums
    to `budget`.

    Prompts with 0 < p < 1 get min_n..max_n, the others fixed_n. Budget beyond what the bounds absorb is
    spread evenly (earlier prompts take the remainder) over the p = 0 prompts, else the p = 1 prompts, else
    over every prompt past max_n. Ties between equal unit gains follow a seeded order.
    """
    p, budget, live, m, min_n, max_n = _start(p, budget, min_n, max_n, fixed_n)
    seed = check_seed(seed)
    n = p.size
    extra = budget - int(m.sum())
    idx = np.flatnonzero(live)
    width = min(max_n - min_n, extra)  # no prompt can take more than the budget left
    placed = min(extra, idx.size * width)
    if placed:
        pl, w = p[idx], knapsack_rl_weight(p[idx])
        # unit u of the extras is rollout min_n + u: its gain is w * (f(p, min_n + u) - f(p, min_n + u - 1))
        gains = lambda lo, hi: w[:, None] * unit_gains(pl, lo + min_n, hi + min_n)
        m[idx] += top_units(gains, idx.size, width, placed, tie_order(idx.size, seed))
    left = extra - placed
    if left:
        for target in (p == 0.0, p == 1.0, np.ones(n, dtype=bool)):
            where = np.flatnonzero(target)
            if where.size:
                _spread(m, where, left)
                break
    return m
