"""The one TRACE step, for every actor: candidate pool -> V~ of each root -> stage-1 root allocation -> bare
rollouts -> stage-2 prefix allocation for each prompt as soon as its own bare rollouts end -> continuations
from forked episodes -> recursive targets -> predictor update.

The step is generic over how a turn is sampled. An `Actor` starts episodes, advances a group of them by one
turn and forks them; the testbed's tabular policy (`testbed.actor`) and the ReAct LM agent
(`rollout.lm_actor`) are the two implementations, so `simulate`, `rollout` and the trainer run this code and
nothing else. What follows the step (a policy update) belongs to the caller.

Each active prompt is one asyncio task, so a prompt whose bare rollouts end early allocates and starts its
continuations while others are still running. Every random choice is drawn from a stream named by the run's
seed, the step and the prompt (`seeding`): which prompt finishes first never changes what anything samples.
`agrow` runs inside a caller's event loop (a verl agent-loop worker, a Ray actor, a notebook); `grow` is the
synchronous wrapper.

Time is split into generate (the actor's sampling), env (environment steps, wall time during which any ran),
predictor, allocate and the rest (bookkeeping); `overhead` is allocate plus bookkeeping, the engine's own cost.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from ..allocation import prefix_flip_prob
from ..methods import BudgetPlan, Method, allocate_method_prefixes, allocate_method_roots
from ..predictors.base import Predictor, training_examples
from ..seeding import derive_rng, derive_seed
from ..tree import BARE, BRANCH, RolloutTree

TIMERS = ("generate", "env", "predictor", "allocate", "total")


class Clock:
    """Seconds per phase of one step. Environment steps may run in threads at once: `env` counts the wall time
    during which at least one ran, not the sum over threads."""

    def __init__(self):
        self.seconds = dict.fromkeys(TIMERS, 0.0)
        self._lock = threading.Lock()
        self._env_running, self._env_since = 0, 0.0

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds

    def __getstate__(self) -> dict:  # a lock does not pickle: an executor ships actors that hold a clock
        return {"seconds": dict(self.seconds)}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self.seconds.update(state["seconds"])

    def env_started(self) -> None:
        with self._lock:
            if not self._env_running:
                self._env_since = time.perf_counter()
            self._env_running += 1

    def env_finished(self) -> None:
        with self._lock:
            self._env_running -= 1
            if not self._env_running:
                self.seconds["env"] += time.perf_counter() - self._env_since


class Actor(Protocol):
    """How turns are sampled. An episode is the actor's own object with `done` and `reward` attributes."""

    def begin_step(self, prompts: int, clock: Clock) -> None:
        """`prompts` prompt tasks are about to run this step; time goes to `clock`."""

    def end_prompt(self) -> None:
        """One prompt task finished (it will ask for no more turns this step)."""

    def tree(self, index: int, task: object) -> RolloutTree:
        """The empty tree of the pool's `index`-th prompt (its root id and what it stores as the prompt)."""

    def start(self, tree: RolloutTree, task: object, seeds: Sequence[int]) -> list:
        """Fresh episodes of `task`, one per seed; may fill the root node of `tree` (prompt tokens, features)."""

    async def advance(self, episodes: Sequence) -> list[dict]:
        """Sample one turn of each episode and step its environment; per episode, the turn's node fields
        (thought, action, observation, token_ids, loss_mask, logprobs, info) for `RolloutTree.add_turn`."""

    def fork(self, episode, seed: int):
        """A copy of `episode` that continues from its state with its own random stream."""


@dataclass
class StepResult:
    """One step's trees and what it cost."""

    method: str
    step: int
    trees: list[RolloutTree]
    bare_rollouts: int = 0
    continuations: int = 0
    generated_tokens: int = 0
    prefix_generated_tokens: int = 0
    unspent_prefix_budget: int = 0  # stage-2 budget of prompts with no anchor (every bare rollout ended at once)
    predictor_loss: float | None = None
    time: dict = field(default_factory=lambda: dict.fromkeys(TIMERS, 0.0))
    events: list[tuple[str, int, float]] = field(default_factory=list)  # (what, prompt index, seconds into step)

    @property
    def rollouts(self) -> int:
        return self.bare_rollouts + self.continuations

    @property
    def active(self) -> list[RolloutTree]:
        return [t for t in self.trees if t.root.children]

    @property
    def overhead(self) -> float:
        """The engine's own time (allocation and bookkeeping): neither the actor, the predictor nor the env."""
        t = self.time
        return max(t["total"] - t["generate"] - t["predictor"] - t["env"], 0.0)


@dataclass
class PromptResult:
    """What growing one prompt's tree produced (an executor may run it in another process)."""

    index: int
    tree: RolloutTree
    bare_rollouts: int = 0
    continuations: int = 0
    generated_tokens: int = 0
    prefix_generated_tokens: int = 0
    unspent_prefix_budget: int = 0
    events: list[tuple[str, int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class PromptJob:
    """One prompt's share of a step: its tree (root already scored), task and root rollouts."""

    index: int
    tree: RolloutTree
    task: object
    rollouts: int


async def grow_prompt(
    actor: Actor,
    predictor: Predictor,
    plan: BudgetPlan,
    method: Method,
    seed: int,
    step: int,
    job: PromptJob,
    clock: Clock,
    t0: float,
) -> PromptResult:
    """Bare rollouts of one prompt, then its stage 2 as soon as they end. Every random draw comes from streams
    named by (seed, step, prompt), so the result does not depend on where or when it runs."""
    i, tree, mi = job.index, job.tree, job.rollouts
    out = PromptResult(i, tree)
    try:
        seeds = [derive_seed(seed, "rollout", step, i, 0, j) for j in range(mi)]
        episodes = actor.start(tree, job.task, seeds)
        snapshots: dict[str, object] = {}
        out.bare_rollouts = mi
        out.generated_tokens = await _lockstep(
            actor, tree, episodes, [tree.root_id] * mi, BARE, snapshots if method.branches else None
        )
        out.events.append(("bare_done", i, time.perf_counter() - t0))
        if not method.branches:
            return out
        anchors = tree.anchors()
        budget = mi * plan.branch_factor
        if not anchors:
            out.unspent_prefix_budget = budget
            return out
        t1 = time.perf_counter()
        values = predictor.predict([(tree, node.node_id) for node, _ in anchors])
        clock.add("predictor", time.perf_counter() - t1)
        t1 = time.perf_counter()
        for (node, _), val in zip(anchors, values):
            node.predicted = float(val)
        q = prefix_flip_prob(np.array([r for _, r in anchors]), values)
        k = allocate_method_prefixes(method, q, budget, derive_rng(seed, "prefixes", step, i))
        branches, parents = [], []
        for (node, _), kj in zip(anchors, k):
            for _ in range(kj):
                branch_seed = derive_seed(seed, "rollout", step, i, 1, len(branches))
                branches.append(actor.fork(snapshots[node.node_id], branch_seed))
                parents.append(node.node_id)
        clock.add("allocate", time.perf_counter() - t1)
        out.events.append(("stage2_start", i, time.perf_counter() - t0))
        out.continuations = len(branches)
        tokens = await _lockstep(actor, tree, branches, parents, BRANCH, None)
        out.generated_tokens += tokens
        out.prefix_generated_tokens = tokens
        return out
    finally:
        actor.end_prompt()


async def _lockstep(
    actor: Actor, tree: RolloutTree, episodes: list, parents: list[str], origin: str, snapshots: dict | None
) -> int:
    """Advance `episodes` one turn at a time until all are done, appending each turn under its parent."""
    generated = 0
    while True:
        live = [j for j, ep in enumerate(episodes) if not ep.done]
        if not live:
            return generated
        turns = await actor.advance([episodes[j] for j in live])
        for j, fields in zip(live, turns):
            ep = episodes[j]
            generated += len(fields.get("logprobs", ()))
            node = tree.add_turn(
                parents[j], origin=origin, terminal=ep.done, reward=float(ep.reward) if ep.done else None, **fields
            )
            parents[j] = node.node_id
            if snapshots is not None and not ep.done:
                snapshots[node.node_id] = actor.fork(ep, 0)  # the state to branch from later


class LocalExecutor:
    """Runs every prompt of a step as an asyncio task in this process (the default)."""

    async def run(
        self,
        actor: Actor,
        predictor: Predictor,
        plan: BudgetPlan,
        method: Method,
        seed: int,
        step: int,
        jobs: list[PromptJob],
        clock: Clock,
        t0: float,
    ) -> list[PromptResult]:
        actor.begin_step(len(jobs), clock)
        return list(
            await asyncio.gather(
                *(grow_prompt(actor, predictor, plan, method, seed, step, job, clock, t0) for job in jobs)
            )
        )


EXECUTORS = ("local", "ray")


def make_executor(kind: str, ray_config=None):
    """The executor named by `kind`: local (asyncio tasks in this process) or ray (a pool of Ray workers)."""
    if kind == "local":
        return LocalExecutor()
    if kind == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(ray_config)
    raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")


class TreeRolloutEngine:
    """Grows one step's trees over a candidate pool with a method, then updates the method's predictor."""

    def __init__(
        self,
        actor: Actor,
        predictor: Predictor,
        plan: BudgetPlan,
        seed: int = 0,
        prefix_share: float = 0.5,
        update_predictor: bool = True,
        executor=None,
    ):
        if not 0.0 <= prefix_share < 1.0:
            raise ValueError(f"prefix_share must be in [0, 1), got {prefix_share}")
        self.actor, self.predictor, self.plan, self.seed = actor, predictor, plan, seed
        self.prefix_share, self.update_predictor = prefix_share, update_predictor
        self.executor = executor or LocalExecutor()

    def grow(self, tasks: Sequence, method: Method, step: int = 0) -> StepResult:
        """`agrow` from synchronous code; inside a running event loop, use `await engine.agrow(...)`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.agrow(tasks, method, step))
        raise RuntimeError("grow() was called inside a running event loop; use `await engine.agrow(...)`")

    async def agrow(self, tasks: Sequence, method: Method, step: int = 0) -> StepResult:
        start = time.perf_counter()
        trees = [self.actor.tree(i, task) for i, task in enumerate(tasks)]
        result, clock = StepResult(method.name, step, trees), Clock()

        t0 = time.perf_counter()
        v = self.predictor.predict([(t, t.root_id) for t in trees])
        clock.add("predictor", time.perf_counter() - t0)
        t0 = time.perf_counter()
        m = allocate_method_roots(method, v, self.plan, seed=derive_seed(self.seed, "roots", step))
        clock.add("allocate", time.perf_counter() - t0)
        for tree, vi in zip(trees, v):
            tree.root.predicted = float(vi)

        jobs = [PromptJob(i, trees[i], tasks[i], int(mi)) for i, mi in enumerate(m) if mi > 0]
        done = await self.executor.run(
            self.actor, self.predictor, self.plan, method, self.seed, step, jobs, clock, start
        )
        for res in done:  # an executor in another process returns its own copy of the tree
            trees[res.index] = res.tree
            result.bare_rollouts += res.bare_rollouts
            result.continuations += res.continuations
            result.generated_tokens += res.generated_tokens
            result.prefix_generated_tokens += res.prefix_generated_tokens
            result.unspent_prefix_budget += res.unspent_prefix_budget
            result.events.extend(res.events)
        result.events.sort(key=lambda e: e[2])

        active = result.active
        for tree in active:
            tree.compute_targets()
        if self.update_predictor:
            t0 = time.perf_counter()
            rng = derive_rng(self.seed, "predictor-examples", step)
            examples, targets = training_examples(active, self.prefix_share, rng)
            result.predictor_loss = float(self.predictor.update(examples, targets)) if examples else None
            clock.add("predictor", time.perf_counter() - t0)
        clock.seconds["total"] = time.perf_counter() - start
        result.time = dict(clock.seconds)
        return result
