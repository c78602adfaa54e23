"""Per-prompt rollout counts for one verl batch: the stage-1 root allocation, without verl.

verl's V1 agent-loop worker runs `prompt.pop("__rollout_n__", rollout.n)` sessions per prompt, so the
manager writes each row's count and the worker obeys it. The batch itself is the candidate pool (the core's
pool_factor is 1): raise `data.train_batch_size` and lower `rollout.n` to give the allocator more prompts to
choose from at the same cost. verl sizes its PPO mini-batches as `ppo_mini_batch_size x rollout.n` rows, so
the step must produce `batch size x n` rows in total; `root_counts` refuses a setting where it cannot:
- a tree method spends `B n / (1 + N)` roots and N continuations per root (`TraceConfig.batch_plan`), so
  `B n` must divide by `1 + N` (`trace_rl.budget.branch_factor`);
- the active allocator caps a prompt at `budget.max_per_prompt`, so `B x max_per_prompt` must cover the roots.
One shortfall is left to verl's padding: a prompt whose bare rollouts all end in one turn has no anchor to
branch from, and its continuations are not spent (reported as `trace/unspent_prefix_budget`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ...methods import BudgetPlan, Method, allocate_method_roots
from ...seeding import check_seed, derive_seed
from ...trace_config import TraceConfig, check_method
from ...tree import RolloutTree

CONFIG_KEY = "trace_rl"  # top-level block of the verl config (`+trace_rl.method=...`); verl has no such key
ROLLOUT_N_KEY = "__rollout_n__"  # read (and popped) per prompt by verl 0.9.1's AgentLoopWorkerTQ._run_prompt


# names the `trace_rl` block used before TRACE had one configuration: refused, naming the new key, so a YAML written
# for them never silently changes meaning
RENAMED = {
    "estimator": "advantage",
    "branch_factor": "budget.branch_factor",
    "max_per_prompt": "budget.max_per_prompt",
    "prefix_share": "predictor.prefix_share",
    "predictor": "predictor.kind",
}
# budget keys verl decides: the batch is the pool, and its size and group size are verl's own settings
SET_BY_VERL = {
    "budget.prompts": "verl's data.train_batch_size sets it",
    "budget.rollouts_per_prompt": "verl's actor_rollout_ref.rollout.n sets it",
    "budget.pool_factor": "the batch is the candidate pool (pool factor 1)",
}


@dataclass(frozen=True)
class TraceSettings:
    """The `trace_rl` block of a verl config: TRACE's one configuration (`trace_config.TraceConfig`, with the
    command line's names: `+trace_rl.method=trace +trace_rl.budget.branch_factor=1 +trace_rl.predictor.kind=light`)
    and the seed of the plugin's random streams (`+trace_rl.seed=0`)."""

    config: TraceConfig = field(default_factory=TraceConfig)
    seed: int = 0

    def __post_init__(self):
        check_method(self.config.method, key=f"{CONFIG_KEY}.method", oracle=False)
        if self.config.method_spec.pools_stage2:  # the plugin grows each prompt's tree on its own worker
            raise ValueError(
                f"{CONFIG_KEY}.method={self.config.method} pools stage 2 over a step's prompts; the verl plugin grows "
                "one prompt at a time, so choose a per-prompt method such as trace"
            )
        if not self.config.method_spec.fixed_rows:  # verl's mini-batches are data.train_batch_size x rollout.n rows
            raise ValueError(
                f"{CONFIG_KEY}.method={self.config.method} spends a cost budget, so its rows vary in number; verl's "
                "mini-batches need batch size x rollout.n rows, so choose a method counted in rollouts such as trace"
            )
        check_seed(self.seed, f"{CONFIG_KEY}.seed")

    @classmethod
    def from_config(cls, block) -> "TraceSettings":
        """From a mapping (an OmegaConf node or a dict); unknown and renamed keys are an error, not ignored."""
        data = {str(k): v for k, v in dict(block or {}).items()}
        seed = data.pop("seed", 0)
        return cls(TraceConfig.from_settings(data, CONFIG_KEY, RENAMED, SET_BY_VERL), seed)

    @property
    def method_spec(self) -> Method:
        return self.config.method_spec

    @property
    def advantage(self) -> str:
        return self.config.advantage_name

    @property
    def branch_factor(self) -> int:
        return self.config.budget.branch_factor

    def plan(self, batch_size: int, n: int) -> BudgetPlan:
        return self.config.batch_plan(batch_size, n)


def expected_rows(counts: Sequence[int], settings: TraceSettings) -> int:
    """Rows (leaves) the counts produce when every prompt spends its continuation budget."""
    per_root = 1 + (settings.branch_factor if settings.method_spec.branches else 0)
    return int(np.sum(counts)) * per_root


def root_counts(values: Sequence[float], n: int, settings: TraceSettings, step: int = 0) -> np.ndarray:
    """Bare rollouts per prompt of a batch (0 skips a prompt) for the predictor's `values`, at rollout.n = n.

    The same allocation (and seed stream) as the core engine's stage 1 with the batch as the pool."""
    v = np.asarray(values, dtype=np.float64)
    batch = v.size
    if batch == 0:
        return np.zeros(0, dtype=np.int64)
    plan = settings.plan(batch, n)
    method = settings.method_spec
    total = plan.total
    if method.branches and total % (1 + plan.branch_factor):
        raise ValueError(
            f"batch size x rollout.n = {total} does not divide by 1 + {CONFIG_KEY}.budget.branch_factor = "
            f"{1 + plan.branch_factor}: the step could not fill verl's mini-batches exactly"
        )
    counts = allocate_method_roots(method, v, plan, seed=derive_seed(settings.seed, "roots", step))
    got = expected_rows(counts, settings)
    if got != total:
        raise ValueError(
            f"{method.name} allocated {got} rollouts for a budget of {total} (batch {batch} x n {n}); "
            f"raise {CONFIG_KEY}.budget.max_per_prompt (now {plan.max_per_prompt}) to at least rollout.n"
        )
    return counts


def prompt_text(raw_prompt) -> str:
    """The question a predictor reads from a verl row's `raw_prompt` (chat messages, or plain text)."""
    if isinstance(raw_prompt, str):
        return raw_prompt
    messages = [] if raw_prompt is None else list(raw_prompt)  # verl hands a numpy object array: no truth value
    users = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    content = users[-1] if users else ""
    if isinstance(content, list):  # typed content blocks
        content = " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return str(content)


def prompt_trees(uids: Sequence[str], raw_prompts: Sequence) -> list[RolloutTree]:
    """Empty trees (root only) for the predictor to score a batch's prompts, one per row, rooted at the uid."""
    return [RolloutTree(str(uid), prompt={"question": prompt_text(p)}) for uid, p in zip(uids, raw_prompts)]
