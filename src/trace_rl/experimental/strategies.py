"""The experimental strategies (registry.ROOTS and PREFIXES name them; see the package's doc)."""

from __future__ import annotations

from functools import partial
from typing import Sequence

import numpy as np

from ..allocation import allocate_prefixes_under_cost, quantise_costs
from ..knapsack import allocate_knapsack_rl_repaired
from ..methods import BudgetPlan
from ..registry import PrefixStrategy, RootStrategy
from .root_objectives import allocate_roots_teach


def knapsack_repaired_roots(v: np.ndarray, budget: int, plan: BudgetPlan, seed: int = 0) -> np.ndarray:
    """The exact optimum of Knapsack RL's stated objective over the first P prompts, without its cost fallback."""
    m, p = np.zeros(v.size, dtype=np.int64), min(plan.prompts, v.size)
    m[:p] = allocate_knapsack_rl_repaired(v[:p], budget, seed=seed)
    return m


def teach_roots(objective: str, v: np.ndarray, budget: int, plan: BudgetPlan, seed: int = 0) -> np.ndarray:
    """TRACE's exact root allocation of a root objective weighted by what a group teaches (root_objectives.py)."""
    return allocate_roots_teach(v, budget, plan.max_per_prompt, objective, seed=seed)


def cost_prefixes(
    flip_prob: np.ndarray,
    budget: int,
    rng: np.random.Generator,
    cost: Sequence[int] | None = None,
    rollout_cost: float | None = None,
) -> np.ndarray:
    """Stage 2 under a cost budget: what `budget` whole rollouts would cost, `budget * rollout_cost`, spent at each
    anchor's own price `cost` (`RolloutTree.anchor_costs`)."""
    if cost is None or rollout_cost is None:
        raise ValueError("prices continuations: pass each anchor's cost and a rollout's")
    units, spend = quantise_costs(cost, int(budget * rollout_cost))
    return allocate_prefixes_under_cost(flip_prob, units, spend, seed=int(rng.integers(2**31)))


def pooled_prefixes(flip_prob, budget, rng, cost=None, rollout_cost=None) -> np.ndarray:
    raise ValueError(
        "pools stage 2 over a step's prompts (rollout.grow.PooledStage2); it runs in "
        "trace-rl's own engine with executor=local, not one prompt at a time"
    )


KNAPSACK_REPAIRED = RootStrategy(
    "knapsack_repaired",
    "the exact optimum of Knapsack RL's stated objective, without its cost fallback",
    knapsack_repaired_roots,
)
ACTIVE_ROWS = RootStrategy(
    "active_rows",
    "TRACE's roots weighted by expected rows with a non-zero advantage",
    partial(teach_roots, "rows"),
    reads_value=True,
)
ACTIVE_GRAD = RootStrategy(
    "active_grad",
    "TRACE's roots weighted by the expected std-scaled step",
    partial(teach_roots, "grad"),
    reads_value=True,
)
ACTIVE_GRAD_UNSCALED = RootStrategy(
    "active_grad_unscaled",
    "TRACE's roots weighted by the expected unscaled step",
    partial(teach_roots, "grad_unscaled"),
    reads_value=True,
)
COST = PrefixStrategy(
    "cost",
    "stage 2 under a cost budget: continuations priced at what is left of their rollout",
    cost_prefixes,
    priced=True,
)
MIX = PrefixStrategy(
    "mix",
    "stage 2 pooled over the step's prompts, spent on trees whose bare rollouts agree",
    pooled_prefixes,
    pooled=True,
)
