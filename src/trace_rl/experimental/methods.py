"""The experimental methods (trace_config.METHODS names them and imports this module only when one is chosen or
listed): research variants, each with what it changes and when to try it."""

from __future__ import annotations

from ..trace_config import Method

_VARIANT = "a research variant: not shown to beat trace on the LM task"

KNAPSACK_RL_REPAIRED = Method(
    "knapsack_rl_repaired",
    "knapsack_repaired",
    "none",
    "grpo",
    "history",
    changes="Knapsack RL's objective solved exactly, without its code's cost fallback",
    use="to separate Knapsack RL's objective from its implementation",
)
# PCL's root allocation under TRACE's prefix stage and estimator: the tree estimator where PCL applies
TRACE_PCL_ROOT = Method(
    "trace_pcl_root", "pcl", "active", "trace", changes="PCL's roots under TRACE's stage 2", use=_VARIANT
)
# TRACE with a root objective weighted by what a group teaches (root_objectives.py): expected rows with a non-zero
# advantage, the expected std-scaled step, the expected unscaled step
TRACE_ROWS = Method(
    "trace_rows",
    "active_rows",
    "active",
    "trace",
    changes="roots weighted by rows with a non-zero advantage",
    use=_VARIANT,
)
TRACE_GRAD = Method(
    "trace_grad",
    "active_grad",
    "active",
    "trace",
    changes="roots weighted by the expected std-scaled step",
    use=_VARIANT,
)
TRACE_GRAD_UNSCALED = Method(
    "trace_grad_unscaled",
    "active_grad_unscaled",
    "active",
    "trace",
    changes="roots weighted by the expected unscaled step",
    use=_VARIANT,
)
# TRACE with stage 2 under a cost budget: each prompt's continuations buy what its share of whole rollouts would
# cost (tokens on an LM, turns on the testbed), each at its own price (allocation: under cost)
TRACE_COST = Method(
    "trace_cost",
    "active",
    "cost",
    "trace",
    changes="stage 2 under a cost budget (tokens), continuations at their own price",
    use="equal cost in tokens rather than rollouts; not with verl or TRL (rows vary)",
)
# TRACE with stage 2 pooled over the step's prompts, spent on making trees whose bare rollouts agree mixed
# (allocation.allocate_tree_mixing; a barrier after the bare rollouts, local executor only)
TRACE_MIX = Method(
    "trace_mix",
    "active",
    "mix",
    "trace",
    changes="stage 2 pooled over the step's prompts, on trees whose bare rollouts agree",
    use=_VARIANT + "; executor=local only",
)
