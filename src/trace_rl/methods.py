"""Sampling methods at equal cost: TRACE, its ablations and the baselines, selectable by name.

A method is (how roots are allocated, how prefix continuations are allocated, which advantage estimator).
Equal cost is counted in rollouts: a flat method spends P*n bare rollouts; a tree method spends
P*n/(1+N) bare rollouts plus N continuations per bare rollout (a continuation is shorter than a bare
rollout, so tree methods generate fewer turns; metrics report turns too, so the comparison stays honest).
The method table and `BudgetPlan` are plain data and live in `trace_config` (TRACE's one configuration); they
are re-exported here, beside the allocators that read them.

Root strategies see a candidate pool of pool_factor*P prompts; the ones that do not choose their prompts
(uniform, knapsack, knapsack_repaired, vip) take its first P (the pool is shuffled by the data loader); VIP, as
upstream, may still give some of those 0 rollouts (its rounding drops allocations below 4).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .allocation import allocate_prefixes, allocate_roots
from .knapsack import allocate_knapsack_rl
from .registry import call
from .trace_config import METHODS, BudgetPlan, Method, get_method
from .vip import allocate_vip

__all__ = ["METHODS", "BudgetPlan", "Method", "get_method", "allocate_method_roots", "allocate_method_prefixes"]


def uniform_split(prompts: int, budget: int) -> np.ndarray:
    """budget spread over `prompts` as evenly as possible (earlier prompts take the remainder)."""
    m = np.full(prompts, budget // prompts, dtype=np.int64)
    m[: budget % prompts] += 1
    return m


# ---- the stable root strategies (registry.ROOTS): (v, budget, plan, seed) -> rollouts per candidate of the pool


def _first_prompts(v: np.ndarray, plan: BudgetPlan) -> tuple[np.ndarray, int]:
    """Zeros over the pool, and P: how many candidates a strategy that does not choose its prompts takes."""
    return np.zeros(v.size, dtype=np.int64), min(plan.prompts, v.size)


def uniform_roots(v: np.ndarray, budget: int, plan: BudgetPlan, seed: int = 0) -> np.ndarray:
    m, p = _first_prompts(v, plan)
    m[:p] = uniform_split(p, budget)
    return m


def pcl_roots(v: np.ndarray, budget: int, plan: BudgetPlan, seed: int = 0) -> np.ndarray:
    m, p = _first_prompts(v, plan)
    keep = np.argsort(np.abs(v - 0.5), kind="stable")[:p]
    m[keep] = uniform_split(p, budget)
    return m


def knapsack_roots(v: np.ndarray, budget: int, plan: BudgetPlan, seed: int = 0) -> np.ndarray:
    """Knapsack RL as its authors' code allocates (launch-script bounds 2..128, p = 0 or 1 fixed at 2, its cost
    fallback and DP); v is the reward-history success rate."""
    m, p = _first_prompts(v, plan)
    m[:p] = allocate_knapsack_rl(v[:p], budget)
    return m


def vip_roots(v: np.ndarray, budget: int, plan: BudgetPlan, seed: int = 0) -> np.ndarray:
    """VIP as its authors' trainer calls it (trace_rl.vip: RLOO rule, bounds 1..32, upstream's rounding)."""
    m, p = _first_prompts(v, plan)
    m[:p] = allocate_vip(v[:p], budget, seed=seed)
    return m


def active_roots(v: np.ndarray, budget: int, plan: BudgetPlan, seed: int = 0) -> np.ndarray:
    return allocate_roots(v, budget, plan.max_per_prompt, seed=seed)


# ---- the stable prefix strategies (registry.PREFIXES): (flip_prob, budget, rng, cost, rollout_cost) -> per anchor


def random_prefixes(flip_prob: np.ndarray, budget: int, rng: np.random.Generator, cost=None, rollout_cost=None):
    return rng.multinomial(budget, np.full(flip_prob.size, 1.0 / flip_prob.size)).astype(np.int64)


def active_prefixes(flip_prob: np.ndarray, budget: int, rng: np.random.Generator, cost=None, rollout_cost=None):
    return allocate_prefixes(flip_prob, budget, seed=int(rng.integers(2**31)))


def allocate_method_roots(method: Method, v: np.ndarray, plan: BudgetPlan, seed: int = 0) -> np.ndarray:
    """Root rollouts per candidate of the pool (length of v) for `method`; zeros mark skipped candidates."""
    v = np.asarray(v, dtype=np.float64)
    return np.asarray(call(method.root_strategy.allocate, v, plan.root_budget(method), plan, seed), dtype=np.int64)


def allocate_method_prefixes(
    method: Method,
    flip_prob: np.ndarray,
    budget: int,
    rng: np.random.Generator,
    cost: Sequence[int] | None = None,
    rollout_cost: float | None = None,
) -> np.ndarray:
    """Continuations per anchor of one prompt, as the method's prefix strategy allocates them.

    `budget` counts rollouts. A priced strategy (`trace_cost`) also reads each anchor's cost
    (`RolloutTree.anchor_costs`) and a whole rollout's.
    """
    flip_prob = np.asarray(flip_prob, dtype=np.float64)
    strategy = method.prefix_strategy
    if not strategy.branches or flip_prob.size == 0:
        return np.zeros(flip_prob.size, dtype=np.int64)
    try:
        return call(strategy.allocate, flip_prob, budget, rng, cost, rollout_cost)
    except ValueError as err:  # a strategy refuses in a phrase that follows the method's name
        raise ValueError(f"method {method.name} {err}") from None
