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

from .allocation import allocate_prefixes, allocate_prefixes_under_cost, allocate_roots, quantise_costs
from .knapsack import allocate_knapsack_rl, allocate_knapsack_rl_repaired
from .root_objectives import TEACH_ALPHA, allocate_roots_teach
from .trace_config import METHODS, BudgetPlan, Method, get_method
from .vip import allocate_vip

__all__ = ["METHODS", "BudgetPlan", "Method", "get_method", "allocate_method_roots", "allocate_method_prefixes"]

# active_<objective>: TRACE's exact root allocation of a root objective weighted by what a group teaches
ROOT_STRATEGIES = (
    "uniform",
    "pcl",
    "knapsack",
    "knapsack_repaired",
    "vip",
    "active",
    *(f"active_{o}" for o in TEACH_ALPHA),
)
PREFIX_STRATEGIES = ("none", "random", "active", "cost", "mix")


def uniform_split(prompts: int, budget: int) -> np.ndarray:
    """budget spread over `prompts` as evenly as possible (earlier prompts take the remainder)."""
    m = np.full(prompts, budget // prompts, dtype=np.int64)
    m[: budget % prompts] += 1
    return m


def allocate_method_roots(method: Method, v: np.ndarray, plan: BudgetPlan, seed: int = 0) -> np.ndarray:
    """Root rollouts per candidate of the pool (length of v) for `method`; zeros mark skipped candidates."""
    v = np.asarray(v, dtype=np.float64)
    budget = plan.root_budget(method)
    m = np.zeros(v.size, dtype=np.int64)
    p = min(plan.prompts, v.size)
    if method.root == "uniform":
        m[:p] = uniform_split(p, budget)
    elif method.root == "pcl":
        keep = np.argsort(np.abs(v - 0.5), kind="stable")[:p]
        m[keep] = uniform_split(p, budget)
    elif method.root == "knapsack":
        # Knapsack RL as its authors' code allocates (launch-script bounds 2..128, p = 0 or 1 fixed at 2,
        # its cost fallback and DP); v is the reward-history success rate
        m[:p] = allocate_knapsack_rl(v[:p], budget)
    elif method.root == "knapsack_repaired":
        # the exact optimum of Knapsack RL's stated objective, without its cost fallback
        m[:p] = allocate_knapsack_rl_repaired(v[:p], budget, seed=seed)
    elif method.root == "vip":
        # VIP as its authors' trainer calls it (trace_rl.vip: RLOO rule, bounds 1..32, upstream's rounding)
        m[:p] = allocate_vip(v[:p], budget, seed=seed)
    elif method.root == "active":
        m = allocate_roots(v, budget, plan.max_per_prompt, seed=seed)
    elif method.root.startswith("active_") and method.root[len("active_") :] in TEACH_ALPHA:
        m = allocate_roots_teach(v, budget, plan.max_per_prompt, method.root[len("active_") :], seed=seed)
    else:
        raise ValueError(f"unknown root strategy {method.root!r}; choose from {ROOT_STRATEGIES}")
    return m


def allocate_method_prefixes(
    method: Method,
    flip_prob: np.ndarray,
    budget: int,
    rng: np.random.Generator,
    cost: Sequence[int] | None = None,
    rollout_cost: float | None = None,
) -> np.ndarray:
    """Continuations per anchor of one prompt: exact TRACE optimum or uniformly random branch points.

    `budget` counts rollouts. Under a cost budget (prefix strategy `cost`) it buys what `budget` whole rollouts
    would cost, `budget * rollout_cost`, spent at each anchor's own price `cost` (`RolloutTree.anchor_costs`).
    """
    flip_prob = np.asarray(flip_prob, dtype=np.float64)
    if method.prefix == "none" or flip_prob.size == 0:
        return np.zeros(flip_prob.size, dtype=np.int64)
    if method.prefix == "random":
        return rng.multinomial(budget, np.full(flip_prob.size, 1.0 / flip_prob.size)).astype(np.int64)
    if method.prefix == "active":
        return allocate_prefixes(flip_prob, budget, seed=int(rng.integers(2**31)))
    if method.prefix == "cost":
        if cost is None or rollout_cost is None:
            raise ValueError(f"method {method.name} prices continuations: pass each anchor's cost and a rollout's")
        units, spend = quantise_costs(cost, int(budget * rollout_cost))
        return allocate_prefixes_under_cost(flip_prob, units, spend, seed=int(rng.integers(2**31)))
    if method.prefix == "mix":
        raise ValueError(
            f"method {method.name} pools stage 2 over a step's prompts (rollout.grow.PooledStage2); it runs in "
            "trace-rl's own engine with executor=local, not one prompt at a time"
        )
    raise ValueError(f"unknown prefix strategy {method.prefix!r}; choose from {PREFIX_STRATEGIES}")
