"""The one TRACE step, for every actor: candidate pool -> V~ of each root -> stage-1 root allocation -> bare
rollouts -> stage-2 prefix allocation for each prompt as soon as its own bare rollouts end -> continuations
from forked episodes -> recursive targets -> predictor update (and, with a `flip_model`, the update of stage 2's
calibrated flip layer, `experimental.flip`, which stage 2 then reads its flip probability from instead of V~; with a
`root_model`, TRACE's root allocator reads V~ through `experimental.root_calibration`'s layer, which the step's bare
outcomes then update).

The step is generic over how a turn is sampled. An `Actor` starts episodes, advances a group of them by one
turn and forks them; the testbed's tabular policy (`testbed.actor`) and the ReAct LM agent
(`rollout.lm_actor`) are the two implementations, so `simulate`, `rollout` and the trainer run this code and
nothing else. What follows the step (a policy update) belongs to the caller.

Each active prompt is one task (`grow.grow_prompt`, run by an executor: asyncio tasks here, or Ray workers in
`ray_executor`), so a prompt whose bare rollouts end early allocates and starts its continuations while others
are still running. Every random choice is drawn from a stream named by the run's
seed, the step and the prompt (`seeding`): which prompt finishes first never changes what anything samples.
`agrow` runs inside a caller's event loop (a verl agent-loop worker, a Ray actor, a notebook); `grow` is the
synchronous wrapper.

Time is split into generate (the actor's sampling), env (environment steps, wall time during which any ran),
predictor, allocate and the rest (bookkeeping); `overhead` is allocate plus bookkeeping, the engine's own cost.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..experimental.flip import FlipCalibrator, flip_observations, make_flip_model
from ..experimental.root_calibration import RootCalibrator, make_root_model, root_observations
from ..methods import METHODS, BudgetPlan, Method, allocate_method_roots
from ..predictors.base import Predictor, training_examples
from ..seeding import derive_rng, derive_seed
from ..trace_config import PREFIX_SHARE, TraceConfig, check_prefix_share, method_spec
from ..tree import BARE, RolloutTree, TurnNode
from .grow import (
    TIMERS,
    Actor,
    Clock,
    PooledStage2,
    PromptJob,
    PromptResult,
    StepContext,
    gather_or_cancel,
    grow_prompt,
    lockstep,
)


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
    worker_retries: int = 0  # prompts started again after their worker died (Ray executor; 0 in process)
    predictor_loss: float | None = None
    predictor_examples: tuple[int, int] = (0, 0)  # (roots, prefixes) the predictor's update was given
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


class LocalExecutor:
    """Runs every prompt of a step as an asyncio task in this process (the default)."""

    async def run(self, ctx: StepContext, jobs: list[PromptJob]) -> list[PromptResult]:
        ctx.actor.begin_step(len(jobs), ctx.clock)
        # one prompt failed: the others stop rather than sample on in the caller's loop
        return await gather_or_cancel([grow_prompt(ctx, job) for job in jobs])


EXECUTORS = ("local", "ray")


def calibration_layers(config: TraceConfig) -> tuple[FlipCalibrator | None, RootCalibrator | None]:
    """Fresh (flip, root) layers of `config.predictor` (None where a layer is raw); a flip prior that does not
    read is one line naming `predictor.flip_prior`."""
    settings = config.predictor
    return make_flip_model(settings.flip_model, settings.flip_prior), make_root_model(settings.root_model)


def observe_layers(
    flip_model: FlipCalibrator | None, root_model: RootCalibrator | None, trees: list[RolloutTree], method: Method
) -> None:
    """Fit the calibration layers on a step's trees (with the predictor's update): the flip layer on the flips the
    continuations realised, where the method branches; the root layer on the roots' bare outcomes, where TRACE's
    root allocator read it."""
    if flip_model is not None and method.branches:
        flip_model.observe(*flip_observations(trees))
    if root_model is not None and method.roots_on_value:
        root_model.observe(*root_observations(trees))


def check_executor(kind: str, key: str = "executor", methods: Sequence[str] = ()) -> None:
    """The one check of an executor name (every command's `executor` setting), and of the `methods` it will run:
    a method whose stage 2 is pooled over a step's prompts (`trace_mix`) needs them all in this process."""
    if kind not in EXECUTORS:
        raise ValueError(f"{key} must be one of {', '.join(EXECUTORS)}, got {kind!r}")
    pooled = [m for m in methods if (name := method_spec(m)[0]) in METHODS and METHODS[name].pools_stage2]
    if kind != "local" and pooled:
        raise ValueError(f"{key}={kind}: {', '.join(pooled)} pools stage 2 over a step's prompts; it needs {key}=local")


def make_executor(kind: str, ray_config=None):
    """The executor named by `kind`: local (asyncio tasks in this process) or ray (a pool of Ray workers)."""
    check_executor(kind)
    if kind == "local":
        return LocalExecutor()
    from .ray_executor import RayExecutor

    return RayExecutor(ray_config)


def evaluation_seed(seed: int, index: int, sample: int) -> int:
    """The seed of sample `sample` of the `index`-th held-out task (`TreeRolloutEngine.evaluate`'s default)."""
    return derive_seed(seed, index, sample)


@dataclass
class EvalResult:
    """A flat evaluation's trees (one per task; the root's s-th child starts sample s) and what it cost."""

    trees: list[RolloutTree]
    samples: int
    generated_tokens: int = 0
    time: dict = field(default_factory=lambda: dict.fromkeys(TIMERS, 0.0))

    def rollouts(self, index: int) -> list[list[TurnNode]]:
        """The turns of each sample of the `index`-th task, in sample order."""
        tree = self.trees[index]
        out = []
        for first in tree.children(tree.root_id):
            turns = [first]
            while turns[-1].children:  # a bare rollout is a chain: one child per turn
                turns.append(tree[turns[-1].children[0]])
            out.append(turns)
        return out


def _run_sync(coro, name: str):
    """Run the engine's coroutine `coro` from synchronous code; refused inside a running event loop, where the
    caller awaits the async twin (`a<name>`) instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()  # never started: close it, or Python warns that it was never awaited
    raise RuntimeError(f"{name}() was called inside a running event loop; use `await engine.a{name}(...)`")


class TreeRolloutEngine:
    """Grows one step's trees over a candidate pool with a method, then updates the method's predictor; and
    evaluates a policy on held-out tasks (`evaluate`) with the same episode loop."""

    def __init__(
        self,
        actor: Actor,
        predictor: Predictor | None = None,
        plan: BudgetPlan | None = None,
        seed: int = 0,
        prefix_share: float = PREFIX_SHARE,
        update_predictor: bool = True,
        executor=None,
        flip_model: FlipCalibrator | None = None,
        root_model: RootCalibrator | None = None,
    ):
        check_prefix_share(prefix_share)
        self.actor, self.predictor, self.plan, self.seed = actor, predictor, plan, seed
        self.prefix_share, self.update_predictor = prefix_share, update_predictor
        self.executor = executor or LocalExecutor()
        self.flip_model = flip_model  # None: stage 2 reads q from V~; else this layer, updated with the predictor
        self.root_model = root_model  # None: TRACE's root allocator reads V~; else V~ through this layer

    @classmethod
    def from_config(
        cls,
        actor: Actor,
        predictor: Predictor | None,
        config: TraceConfig,
        *,
        seed: int = 0,
        plan: BudgetPlan | None = None,
        executor=None,
        update_predictor: bool = True,
        layers: tuple[FlipCalibrator | None, RootCalibrator | None] | None = None,
    ) -> "TreeRolloutEngine":
        """The engine of TRACE's configuration: `config.budget` (or `plan`, a framework's batch plan), the prefix
        share and the calibration layers of `config.predictor` (`calibration_layers`), or `layers`, the (flip, root)
        layers of an earlier engine, for a caller that builds one engine per step and keeps what they learned."""
        flip_model, root_model = calibration_layers(config) if layers is None else layers
        return cls(
            actor,
            predictor,
            config.budget if plan is None else plan,
            seed=seed,
            prefix_share=config.predictor.prefix_share,
            update_predictor=update_predictor,
            executor=executor,
            flip_model=flip_model,
            root_model=root_model,
        )

    def grow(self, tasks: Sequence, method: Method, step: int = 0) -> StepResult:
        """`agrow` from synchronous code; inside a running event loop, use `await engine.agrow(...)`."""
        return _run_sync(self.agrow(tasks, method, step), "grow")

    async def agrow(self, tasks: Sequence, method: Method, step: int = 0) -> StepResult:
        if self.predictor is None or self.plan is None:
            raise ValueError("this engine has no predictor or budget plan: it evaluates, it does not grow trees")
        start = time.perf_counter()
        trees = [self.actor.tree(i, task) for i, task in enumerate(tasks)]
        result, clock = StepResult(method.name, step, trees), Clock()

        t0 = time.perf_counter()
        v = self.predictor.predict([(t, t.root_id) for t in trees])
        clock.add("predictor", time.perf_counter() - t0)
        t0 = time.perf_counter()
        recalibrate = self.root_model is not None and method.roots_on_value
        v_roots = self.root_model.predict(v) if recalibrate else v  # the tree keeps V~ itself (the layer replays)
        m = allocate_method_roots(method, v_roots, self.plan, seed=derive_seed(self.seed, "roots", step))
        clock.add("allocate", time.perf_counter() - t0)
        for tree, vi in zip(trees, v):
            tree.root.predicted = float(vi)

        jobs = [PromptJob(i, trees[i], tasks[i], int(mi)) for i, mi in enumerate(m) if mi > 0]
        pool = None
        if method.pools_stage2:
            if not isinstance(self.executor, LocalExecutor):
                raise ValueError(f"method {method.name} pools stage 2 over a step's prompts; it needs executor=local")
            pool = PooledStage2(
                len(jobs), self.actor, clock, int(derive_rng(self.seed, "prefixes", step).integers(2**31))
            )
        ctx = StepContext(
            self.actor, self.predictor, self.plan, method, self.seed, step, clock, start, self.flip_model, pool
        )
        done = await self.executor.run(ctx, jobs)
        for res in done:  # an executor in another process returns its own copy of the tree
            trees[res.index] = res.tree
            result.bare_rollouts += res.bare_rollouts
            result.continuations += res.continuations
            result.generated_tokens += res.generated_tokens
            result.prefix_generated_tokens += res.prefix_generated_tokens
            result.unspent_prefix_budget += res.unspent_prefix_budget
            result.worker_retries += res.worker_retries
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
            roots = sum(node_id == tree.root_id for tree, node_id in examples)
            result.predictor_examples = (roots, len(examples) - roots)
            observe_layers(self.flip_model, self.root_model, active, method)
            clock.add("predictor", time.perf_counter() - t0)
        clock.seconds["total"] = time.perf_counter() - start
        result.time = dict(clock.seconds)
        return result

    def evaluate(
        self,
        tasks: Sequence,
        samples: int = 1,
        seeds: Callable[[int, int], int] | None = None,
        batch: int = 64,
        on_done: Callable[[int, int], None] | None = None,
    ) -> EvalResult:
        """Flat evaluation: `samples` bare rollouts of each task, nothing allocated, nothing branched, the
        predictor neither read nor updated. Sample s of the i-th task samples from `seeds(i, s)` (default
        `evaluation_seed(self.seed, i, s)`), turn t from `derive_seed(seeds(i, s), t)` as in a step, so a result
        depends on its seed only. Episodes play in batches of `batch` (they bound memory), in (task, sample)
        order, each batch one requester whose every call holds all its live episodes (under continuous batching,
        each episode's turn is its own call). `on_done(i, s)` is called
        as each sample ends (a progress bar). From synchronous code; inside an event loop, `aevaluate`."""
        return _run_sync(self.aevaluate(tasks, samples, seeds, batch, on_done), "evaluate")

    async def aevaluate(
        self,
        tasks: Sequence,
        samples: int = 1,
        seeds: Callable[[int, int], int] | None = None,
        batch: int = 64,
        on_done: Callable[[int, int], None] | None = None,
    ) -> EvalResult:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        start = time.perf_counter()
        seed_of = seeds or (lambda i, s: evaluation_seed(self.seed, i, s))
        trees = [self.actor.tree(i, task) for i, task in enumerate(tasks)]
        result, clock = EvalResult(trees, samples), Clock()
        jobs = [(i, s) for i in range(len(tasks)) for s in range(samples)]
        for lo in range(0, len(jobs), batch):
            chunk = jobs[lo : lo + batch]
            self.actor.begin_step(1, clock)  # one requester: each call holds every live episode of the batch
            try:
                episodes = []
                for i in sorted({i for i, _ in chunk}):  # a task's samples of this batch start together
                    episodes += self.actor.start(trees[i], tasks[i], [int(seed_of(j, s)) for j, s in chunk if j == i])
                done = None if on_done is None else (lambda j, chunk=chunk: on_done(*chunk[j]))
                result.generated_tokens += await lockstep(
                    self.actor,
                    [trees[i] for i, _ in chunk],
                    episodes,
                    [trees[i].root_id for i, _ in chunk],
                    BARE,
                    on_done=done,
                )
            finally:
                self.actor.end_prompt()
        clock.seconds["total"] = time.perf_counter() - start
        result.time = dict(clock.seconds)
        return result
