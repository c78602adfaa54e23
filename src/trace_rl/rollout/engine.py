"""The TRACE tree rollout engine for LM agents: stage 1 over a candidate pool, bare rollouts, and stage 2 for
each prompt as soon as that prompt's bare rollouts end.

Each active prompt is one asyncio task. Tasks never call the model directly: they submit their turn's prompts
to a micro-batcher, which runs one backend call over everything submitted in the same event-loop tick. So
prompts progress independently (a prompt whose episodes end early allocates and starts its continuations
while others are still in their bare rollouts), and the model still sees large batches. The backend call is
synchronous on the loop thread: on one device nothing else needs to run while the model does.

Every baseline of the core runs through the same engine (a `Method` picks the root and prefix strategies).
Budget is accounted in rollouts and in generated tokens; the time split is generate / predictor / allocate /
env (environment steps and tokenising their observations, which any rollout pays), and the rest of the
engine's time (allocation and bookkeeping) is reported as its overhead.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..agent.react import ChatFormat, Episode, apply_generation, start_episode
from ..allocation import prefix_flip_prob
from ..methods import BudgetPlan, Method, allocate_method_prefixes, allocate_method_roots
from ..envs.base import AgentEnv
from ..backends.base import Generation, PolicyBackend, SamplingParams
from ..predictors.base import Predictor
from ..tree import BARE, BRANCH, RolloutTree
from .episodes import record_turn


@dataclass
class StepResult:
    trees: list[RolloutTree]
    rollouts: int = 0
    continuations: int = 0
    generated_tokens: int = 0
    prefix_generated_tokens: int = 0
    unspent_prefix_budget: int = 0
    time: dict = field(default_factory=lambda: {"generate": 0.0, "predictor": 0.0, "allocate": 0.0, "env": 0.0,
                                                "total": 0.0})
    events: list[tuple[str, int, float]] = field(default_factory=list)  # (what, prompt index, seconds)

    @property
    def overhead(self) -> float:
        """The engine's own time (allocation and bookkeeping): neither the model, the predictor nor the env."""
        t = self.time
        return max(t["total"] - t["generate"] - t["predictor"] - t["env"], 0.0)


class _MicroBatcher:
    """Collects generate requests made in one event-loop tick and serves them with one backend call."""

    def __init__(self, backend: PolicyBackend, params: SamplingParams, result: StepResult, seed: int):
        self.backend, self.params, self.result, self.seed = backend, params, result, seed
        self.pending: list[tuple[list[list[int]], asyncio.Future]] = []
        self.calls = 0

    async def generate(self, prompts: list[list[int]]) -> list[Generation]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self.pending:
            loop.call_soon(self._flush)
        self.pending.append((prompts, fut))
        return await fut

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        flat = [p for prompts, _ in batch for p in prompts]
        t0 = time.perf_counter()
        try:
            gens = self.backend.generate(flat, self.params, seed=self.seed * 1_000_003 + self.calls)
        except Exception as err:  # hand the failure to every waiting prompt instead of hanging them
            for _, fut in batch:
                fut.set_exception(err)
            return
        self.result.time["generate"] += time.perf_counter() - t0
        self.calls += 1
        i = 0
        for prompts, fut in batch:
            fut.set_result(gens[i: i + len(prompts)])
            i += len(prompts)


class TreeRolloutEngine:
    def __init__(
        self,
        backend: PolicyBackend,
        env_factory: Callable[[], AgentEnv],
        predictor: Predictor,
        plan: BudgetPlan,
        params: SamplingParams = SamplingParams(),
        seed: int = 0,
    ):
        self.backend, self.env_factory, self.predictor = backend, env_factory, predictor
        self.plan, self.params, self.seed = plan, params, seed
        self.fmt = ChatFormat(backend.tokenizer)
        self.rng = np.random.default_rng(seed)

    def grow(self, tasks: list[dict], method: Method, step: int = 0) -> StepResult:
        """Grow one step's trees over the candidate pool `tasks` with `method`."""
        return asyncio.run(self._grow(tasks, method, step))

    async def _grow(self, tasks: list[dict], method: Method, step: int) -> StepResult:
        start = time.perf_counter()
        trees = [RolloutTree(i, prompt=task) for i, task in enumerate(tasks)]
        result = StepResult(trees)
        self._t0 = start
        t0 = time.perf_counter()
        v = self.predictor.predict([(t, t.root_id) for t in trees])
        result.time["predictor"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        m = allocate_method_roots(method, v, self.plan, seed=self.seed * 100_003 + step)
        result.time["allocate"] += time.perf_counter() - t0
        batcher = _MicroBatcher(self.backend, self.params, result, self.seed * 7_919 + step)
        jobs = []
        for i, (tree, task, mi) in enumerate(zip(trees, tasks, m)):
            tree.root.predicted = float(v[i])
            if mi > 0:
                jobs.append(self._grow_prompt(i, tree, task, int(mi), method, batcher, result))
        await asyncio.gather(*jobs)
        for tree in trees:
            if tree.root.children:
                tree.compute_targets()
        result.time["total"] = time.perf_counter() - start
        return result

    async def _grow_prompt(self, i, tree, task, mi, method, batcher, result) -> None:
        t0 = time.perf_counter()
        episodes = [start_episode(self.env_factory(), task, self.fmt) for _ in range(mi)]
        result.time["env"] += time.perf_counter() - t0
        tree.root.token_ids = list(episodes[0].token_ids)
        tree.root.loss_mask = [0] * len(episodes[0].token_ids)
        snapshots: dict[str, Episode] = {}
        result.rollouts += mi
        # await first, then add: `x += await ...` would read x before the await and lose other prompts' updates
        tokens = await self._lockstep(tree, episodes, [tree.root_id] * mi, BARE, batcher, result,
                                      snapshots if method.branches else None)
        result.generated_tokens += tokens
        result.events.append(("bare_done", i, time.perf_counter() - self._t0))
        if not method.branches:
            return
        anchors = tree.anchors()
        budget = mi * self.plan.branch_factor
        if not anchors:
            result.unspent_prefix_budget += budget
            return
        t0 = time.perf_counter()
        values = self.predictor.predict([(tree, node.node_id) for node, _ in anchors])
        result.time["predictor"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        for (node, _), val in zip(anchors, values):
            node.predicted = float(val)
        q = prefix_flip_prob(np.array([r for _, r in anchors]), values)
        k = allocate_method_prefixes(method, q, budget, self.rng)
        branches, parents = [], []
        for (node, _), kj in zip(anchors, k):
            for _ in range(kj):
                branches.append(snapshots[node.node_id].fork())
                parents.append(node.node_id)
        result.time["allocate"] += time.perf_counter() - t0
        result.events.append(("stage2_start", i, time.perf_counter() - self._t0))
        result.continuations += len(branches)
        result.rollouts += len(branches)
        tokens = await self._lockstep(tree, branches, parents, BRANCH, batcher, result, None)
        result.generated_tokens += tokens
        result.prefix_generated_tokens += tokens

    async def _lockstep(self, tree, episodes, parents, origin, batcher, result, snapshots) -> int:
        generated = 0
        while True:
            live = [j for j, ep in enumerate(episodes) if not ep.done]
            if not live:
                return generated
            gens = await batcher.generate([episodes[j].token_ids for j in live])
            for j, gen in zip(live, gens):
                ep = episodes[j]
                t0 = time.perf_counter()
                turn = apply_generation(ep, gen, self.fmt)
                result.time["env"] += time.perf_counter() - t0
                generated += len(gen.token_ids)
                if not ep.done and len(ep.turns) >= ep.env.max_turns:
                    ep.done = True
                node = record_turn(tree, parents[j], turn, ep, origin, gen.stop_reason)
                parents[j] = node.node_id
                if snapshots is not None and not ep.done:
                    snapshots[node.node_id] = ep.fork()
