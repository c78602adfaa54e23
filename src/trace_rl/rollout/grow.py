"""One prompt's share of a TRACE step: its bare rollouts, then its stage 2 as soon as they end (`grow_prompt`).

What every prompt task of a step shares travels in one `StepContext` (the actor, the predictor, the budget,
the method, the run's seed and step, the step's clock); what one prompt adds is its `PromptJob`. An executor
(`engine.LocalExecutor`, `ray_executor.RayExecutor`) runs `grow_prompt(context, job)` for each job, here or
in another process, and returns each job's `PromptResult`; `engine.TreeRolloutEngine` does the rest of the step.
This module imports neither, so the executors and the engine depend on it, not on each other.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from ..allocation import allocate_tree_mixing, prefix_flip_prob
from ..methods import BudgetPlan, Method, allocate_method_prefixes
from ..predictors.base import Predictor
from ..seeding import derive_rng, derive_seed
from ..tree import BARE, BRANCH, RolloutTree

TIMERS = ("generate", "env", "predictor", "allocate", "total")


class Clock:
    """Seconds per phase of one step. Environment steps may run in threads at once, and generate calls at once
    under continuous batching: a phase timed with `started`/`finished` counts the wall time during which at least
    one ran, not the sum over threads or calls."""

    def __init__(self):
        self.seconds = dict.fromkeys(TIMERS, 0.0)
        self._lock = threading.Lock()
        self._running = dict.fromkeys(TIMERS, 0)
        self._since = dict.fromkeys(TIMERS, 0.0)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds

    def __getstate__(self) -> dict:  # a lock does not pickle: an executor ships actors that hold a clock
        return {"seconds": dict(self.seconds)}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self.seconds.update(state["seconds"])

    def started(self, phase: str) -> None:
        with self._lock:
            if not self._running[phase]:
                self._since[phase] = time.perf_counter()
            self._running[phase] += 1

    def finished(self, phase: str) -> None:
        with self._lock:
            self._running[phase] -= 1
            if not self._running[phase]:
                self.seconds[phase] += time.perf_counter() - self._since[phase]


class FlipModel(Protocol):
    """What stage 2 can read its flip probability from instead of V~ alone (`experimental.flip.FlipCalibrator`)."""

    def predict(self, reward, v, depth) -> np.ndarray:
        """P(one continuation flips its rollout's outcome), per anchor: bare reward, V~ and depth."""


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
class PromptResult:
    """What growing one prompt's tree produced (an executor may run it in another process)."""

    index: int
    tree: RolloutTree
    bare_rollouts: int = 0
    continuations: int = 0
    generated_tokens: int = 0
    prefix_generated_tokens: int = 0
    unspent_prefix_budget: int = 0
    worker_retries: int = 0  # times the prompt was started again because its worker died (Ray executor)
    events: list[tuple[str, int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class PromptJob:
    """One prompt's share of a step: its tree (root already scored), task and root rollouts."""

    index: int
    tree: RolloutTree
    task: object
    rollouts: int


@dataclass(frozen=True)
class StepContext:
    """What every prompt task of one step shares. `t0` is the step's start on `clock`'s host (event times are
    seconds since it); an executor in another process gives each task its own clock and t0 and adds the
    task's seconds back."""

    actor: Actor
    predictor: Predictor
    plan: BudgetPlan
    method: Method
    seed: int
    step: int
    clock: Clock
    t0: float
    flip_model: FlipModel | None = None  # stage 2's flip probability; None: q from V~ (`allocation.prefix_flip_prob`)
    stage2_pool: PooledStage2 | None = None  # prefix strategy `mix`: the step's one pooled stage 2


class PooledStage2:
    """Stage 2 pooled over a step's prompts (prefix strategy `mix`, `allocation.allocate_tree_mixing`). Each
    prompt hands in its anchors' flip probabilities, whether its bare rollouts agreed and its own stage-2 budget
    as soon as its bare rollouts end, then waits; the last to hand in runs one allocation of the whole budget and
    every prompt goes on with its share. The price is a barrier: no continuation starts before every bare rollout
    of the step has ended. The prompts must share this object, so it runs in the local executor only."""

    def __init__(self, prompts: int, actor: Actor, clock: Clock, seed: int):
        self.prompts, self.actor, self.clock, self.seed = prompts, actor, clock, seed
        self.entries: dict[int, tuple[bool, np.ndarray, int]] = {}
        self.answer: asyncio.Future | None = None

    async def allocate(self, index: int, agree: bool, q: np.ndarray, budget: int) -> tuple[np.ndarray, int]:
        """This prompt's continuations per anchor and its unspent budget, once every prompt has handed in."""
        if self.answer is None:
            self.answer = asyncio.get_running_loop().create_future()
        self.entries[index] = (agree, q, budget)
        if len(self.entries) < self.prompts:
            self.actor.end_prompt()  # waits here: the actor's batcher must not wait for this prompt's requests
            return (await self.answer)[index]
        t0 = time.perf_counter()
        order = sorted(self.entries)
        qs = [self.entries[i][1] for i in order]
        total = sum(self.entries[i][2] for i in order)
        try:
            k = allocate_tree_mixing(qs, [self.entries[i][0] for i in order], total, seed=self.seed)
        except BaseException as err:
            self.fail(err)
            raise
        self.clock.add("allocate", time.perf_counter() - t0)
        spendable = any(q.size for q in qs)  # no anchor in the whole step: every prompt keeps its budget unspent
        shares = {i: (ki, 0 if spendable else self.entries[i][2]) for i, ki in zip(order, k)}
        self.actor.begin_step(self.prompts, self.clock)  # every prompt asks for turns again
        self.answer.set_result(shares)
        return shares[index]

    def fail(self, err: BaseException) -> None:
        """A prompt failed before the allocation: every prompt waiting for it gets the error instead of waiting
        for ever (under `agrow` in a caller's event loop nothing else would end them)."""
        if self.answer is None:
            self.answer = asyncio.get_running_loop().create_future()
        if not self.answer.done():
            self.answer.set_exception(err)
            self.answer.exception()  # retrieved: asyncio would otherwise log it when no prompt was waiting


async def grow_prompt(ctx: StepContext, job: PromptJob) -> PromptResult:
    """Bare rollouts of one prompt, then its stage 2 as soon as they end. Every random draw comes from streams
    named by (seed, step, prompt), so the result does not depend on where or when it runs."""
    actor, method = ctx.actor, ctx.method
    i, tree, mi = job.index, job.tree, job.rollouts
    out = PromptResult(i, tree)
    try:
        seeds = [derive_seed(ctx.seed, "rollout", ctx.step, i, 0, j) for j in range(mi)]
        episodes = actor.start(tree, job.task, seeds)
        snapshots: dict[str, object] = {}
        out.bare_rollouts = mi
        out.generated_tokens = await lockstep(
            actor, [tree] * mi, episodes, [tree.root_id] * mi, BARE, snapshots if method.branches else None
        )
        out.events.append(("bare_done", i, time.perf_counter() - ctx.t0))
        if not method.branches:
            return out
        anchors = tree.anchors()
        budget = mi * ctx.plan.branch_factor
        if not anchors and ctx.stage2_pool is not None:  # hands in nothing, but the pool waits for every prompt
            _, out.unspent_prefix_budget = await ctx.stage2_pool.allocate(i, False, np.zeros(0), budget)
            return out
        if not anchors:
            out.unspent_prefix_budget = budget
            return out
        t1 = time.perf_counter()
        values = ctx.predictor.predict([(tree, node.node_id) for node, _ in anchors])
        ctx.clock.add("predictor", time.perf_counter() - t1)
        t1 = time.perf_counter()
        rewards = np.array([r for _, r in anchors])
        if ctx.flip_model is None:
            q = prefix_flip_prob(rewards, values)
        else:
            q = ctx.flip_model.predict(rewards, values, np.array([node.depth for node, _ in anchors]))
        for (node, _), val, qj in zip(anchors, values, q):
            node.predicted, node.flip_predicted = float(val), float(qj)  # what stage 2 allocated on
        if ctx.stage2_pool is not None:
            ctx.clock.add("allocate", time.perf_counter() - t1)
            # before stage 2 the tree's leaves are its bare rollouts: not mixed means they agree
            k, out.unspent_prefix_budget = await ctx.stage2_pool.allocate(i, not tree.is_mixed(), q, budget)
            t1 = time.perf_counter()
        else:
            cost, rollout_cost = tree.anchor_costs() if method.prefix_strategy.priced else (None, None)
            rng = derive_rng(ctx.seed, "prefixes", ctx.step, i)
            k = allocate_method_prefixes(method, q, budget, rng, cost, rollout_cost)
        branches, parents = [], []
        for (node, _), kj in zip(anchors, k):
            for _ in range(kj):
                branch_seed = derive_seed(ctx.seed, "rollout", ctx.step, i, 1, len(branches))
                branches.append(actor.fork(snapshots[node.node_id], branch_seed))
                parents.append(node.node_id)
        ctx.clock.add("allocate", time.perf_counter() - t1)
        out.events.append(("stage2_start", i, time.perf_counter() - ctx.t0))
        out.continuations = len(branches)
        tokens = await lockstep(actor, [tree] * len(branches), branches, parents, BRANCH, None)
        out.generated_tokens += tokens
        out.prefix_generated_tokens = tokens
        return out
    except BaseException as err:
        if ctx.stage2_pool is not None:  # before its hand-in, the pooled stage 2 would wait for it for ever
            ctx.stage2_pool.fail(err)
        raise
    finally:
        actor.end_prompt()


async def gather_or_cancel(coros: Sequence) -> list:
    """`asyncio.gather` of `coros`, except that when one fails (or the caller is cancelled) the others are cancelled
    and awaited before the error is raised, rather than left running in the caller's event loop."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def lockstep(
    actor: Actor,
    trees: Sequence[RolloutTree],
    episodes: list,
    parents: list[str],
    origin: str,
    snapshots: dict | None = None,
    on_done: Callable[[int], None] | None = None,
) -> int:
    """The one episode loop: advance `episodes` one turn at a time until all are done, appending episode j's
    turns to `trees[j]` under `parents[j]`; returns the tokens generated. A step's prompt plays its own tree's
    episodes (`grow_prompt`); held-out evaluation plays a batch of episodes of many trees
    (`engine.TreeRolloutEngine.evaluate`). `on_done(j)` is called when episode j ends."""
    if getattr(actor, "continuous", False):
        return await _independent(actor, trees, episodes, parents, origin, snapshots, on_done)
    generated = 0
    while True:
        live = [j for j, ep in enumerate(episodes) if not ep.done]
        if not live:
            return generated
        turns = await actor.advance([episodes[j] for j in live])
        for j, fields in zip(live, turns):
            ep = episodes[j]
            generated += len(fields.get("logprobs", ()))
            node = trees[j].add_turn(
                parents[j], origin=origin, terminal=ep.done, reward=float(ep.reward) if ep.done else None, **fields
            )
            parents[j] = node.node_id
            if snapshots is not None and not ep.done:
                snapshots[node.node_id] = actor.fork(ep, 0)  # the state to branch from later
            if on_done is not None and ep.done:
                on_done(j)


async def _independent(
    actor: Actor,
    trees: Sequence[RolloutTree],
    episodes: list,
    parents: list[str],
    origin: str,
    snapshots: dict | None,
    on_done: Callable[[int], None] | None,
) -> int:
    """`lockstep` for an actor whose episodes advance independently (continuous batching): each episode asks for
    its next turn as soon as its own environment step ends, so none waits for a round's slowest row. Its turns are
    held back and appended once every episode has ended, in lockstep's order (round by round, episodes in index
    order), so node ids and the trees' order are lockstep's, whatever order the turns came back in. `on_done(j)` is
    called as episode j ends, before its turns are in the tree (lockstep: after)."""

    async def play(j: int) -> list[tuple]:
        ep, turns = episodes[j], []
        while not ep.done:
            (fields,) = await actor.advance([ep])
            snap = actor.fork(ep, 0) if snapshots is not None and not ep.done else None  # the state to branch from
            turns.append((fields, ep.done, float(ep.reward) if ep.done else None, snap))
        if on_done is not None:
            on_done(j)
        return turns

    played = await gather_or_cancel([play(j) for j in range(len(episodes))])  # one fails: the others stop too
    generated = 0
    for t in range(max((len(turns) for turns in played), default=0)):
        for j, turns in enumerate(played):
            if t >= len(turns):
                continue
            fields, terminal, reward, snap = turns[t]
            generated += len(fields.get("logprobs", ()))
            node = trees[j].add_turn(parents[j], origin=origin, terminal=terminal, reward=reward, **fields)
            parents[j] = node.node_id
            if snap is not None:
                snapshots[node.node_id] = snap
    return generated
