"""Per-prompt rollout counts for one verl batch: the stage-1 root allocation, without verl.

verl's V1 agent-loop worker runs `prompt.pop("__rollout_n__", rollout.n)` sessions per prompt, so the
manager writes each row's count and the worker obeys it. The batch itself is the candidate pool (the core's
pool_factor is 1): raise `data.train_batch_size` and lower `rollout.n` to give the allocator more prompts to
choose from at the same cost. verl sizes its PPO mini-batches as `ppo_mini_batch_size x rollout.n` rows, so
the step must produce `batch size x n` rows in total; `root_counts` refuses a setting where it cannot:
- a tree method spends `B n / (1 + N)` roots and N continuations per root (the core's `BudgetPlan`), so
  `B n` must divide by `1 + N`;
- the active allocator caps a prompt at `max_per_prompt`, so `B x max_per_prompt` must cover the roots.
One shortfall is left to verl's padding: a prompt whose bare rollouts all end in one turn has no anchor to
branch from, and its continuations are not spent (reported as `trace/unspent_prefix_budget`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...methods import BudgetPlan, Method, allocate_method_roots, get_method
from ...seeding import derive_seed
from ...tree import RolloutTree

CONFIG_KEY = "trace_rl"  # top-level block of the verl config (`+trace_rl.method=...`); verl has no such key
ROLLOUT_N_KEY = "__rollout_n__"  # read (and popped) per prompt by verl 0.9.1's AgentLoopWorkerTQ._run_prompt


@dataclass(frozen=True)
class TraceSettings:
    """The `trace_rl` block of a verl config (`+trace_rl.method=trace +trace_rl.branch_factor=1 ...`)."""

    method: str = "trace"
    branch_factor: int = BudgetPlan.branch_factor  # N: continuations per bare rollout for tree methods
    max_per_prompt: int = BudgetPlan.max_per_prompt  # m_max for the active root allocator (at least n / (1 + N))
    estimator: str | None = None  # advantage estimator; None takes the method's own
    weighting: str = "split"  # how shared-prefix tokens are weighted across leaf rows (see integrations.rows)
    prefix_share: float = 0.5  # share of prefixes among the predictor's training examples
    predictor: str = "light_text"  # which predictor scores prompts and prefixes
    seed: int = 0

    def __post_init__(self):
        get_method(self.method)  # raises on an unknown name, listing the known ones
        if self.branch_factor < 0:
            raise ValueError(f"trace_rl.branch_factor must be >= 0, got {self.branch_factor}")
        if self.max_per_prompt < 2:
            raise ValueError(f"trace_rl.max_per_prompt must be >= 2, got {self.max_per_prompt}")

    @classmethod
    def from_config(cls, block) -> "TraceSettings":
        """From a mapping (an OmegaConf node or a dict); unknown keys are an error, not silently ignored."""
        data = dict(block or {})
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown trace settings {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**data)

    @property
    def method_spec(self) -> Method:
        return get_method(self.method)

    @property
    def advantage(self) -> str:
        return self.estimator or self.method_spec.advantage

    def plan(self, batch_size: int, n: int) -> BudgetPlan:
        branches = self.branch_factor if self.method_spec.branches else 0
        return BudgetPlan(
            prompts=batch_size,
            rollouts_per_prompt=n,
            branch_factor=branches,
            pool_factor=1,
            max_per_prompt=self.max_per_prompt,
        )


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
            f"batch size x rollout.n = {total} does not divide by 1 + trace_rl.branch_factor = "
            f"{1 + plan.branch_factor}: the step could not fill verl's mini-batches exactly"
        )
    counts = allocate_method_roots(method, v, plan, seed=derive_seed(settings.seed, "roots", step))
    got = expected_rows(counts, settings)
    if got != total:
        raise ValueError(
            f"{settings.method} allocated {got} rollouts for a budget of {total} (batch {batch} x n {n}); "
            f"raise trace_rl.max_per_prompt (now {settings.max_per_prompt}) to at least rollout.n"
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
