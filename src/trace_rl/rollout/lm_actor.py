"""The ReAct LM agent as an actor of the TRACE step: turns sampled by a token-in/token-out backend, environment
steps run in a bounded thread pool off the event loop.

Prompt tasks never call the model directly: they submit their episodes' histories to a micro-batcher that
serves many prompts with one backend call. Three batching policies:
- `round` (default): a call starts when every prompt still running is waiting for the model, so each batch
  holds every live episode of the step, its rows in an order fixed by the requests (tree id, seeds), not by
  which environment step ended first. Batches are then the same at any speed, and a run reproduces bit for bit
  with the same processor type, libraries and torch thread count (CPU kernels sum in another order at another
  thread count: docs/design.md, "What reproduces bit for bit"). Environment steps of all prompts still run at
  once in the pool; a slow tool call delays the next batch until it returns.
- `eager`: a call starts as soon as anything is waiting (and the backend is free), so a slow tool call or a
  prompt in stage 2 never holds the others back. Rows carry their own seeds, so what a row samples does not
  depend on its batch; but batch shapes then vary with timing, and a backend whose fp32 logits depend on the
  batch shape in the last bits can, rarely, flip a token. Choose it for throughput with slow tools.
- `continuous`: for a backend that serves calls at once and batches whatever is in flight (vLLM's engine, a
  server: `concurrent_calls`), each episode's turn is its own call, sent as soon as its previous environment step
  ends (`grow.lockstep` plays episodes independently), so no row waits for a round's longest row, and a prompt's
  continuations start while other prompts' bare rollouts run. The trees are laid out as under the other
  policies (turns appended in round order afterwards); the caveat of `eager` on batch shapes holds here too.

Held-out evaluation and the SFT report use this actor through the engine's flat evaluation
(`engine.TreeRolloutEngine.evaluate`), so an episode is sampled, stepped and stopped (the max-turns guard) by
one piece of code, the engine's episode loop, whether it grows a tree or is scored.
"""

from __future__ import annotations

import asyncio
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from ..agent.react import ChatFormat, Episode, Turn, apply_generation, start_episode
from ..backends.base import Generation, PolicyBackend, SamplingParams
from ..envs.base import AgentEnv
from ..seeding import derive_seed
from ..tree import RolloutTree
from .engine import Clock

BATCHING = ("round", "eager", "continuous")


def turn_fields(turn: Turn, stop_reason: str) -> dict:
    """A sampled turn as tree-node fields: text, token ids, mask, log-probs and why generation stopped."""
    return {
        "thought": turn.thought,
        "action": turn.action,
        "observation": turn.observation,
        "token_ids": turn.token_ids,
        "loss_mask": turn.loss_mask,
        "logprobs": turn.logprobs,
        "info": {"stop_reason": stop_reason},
    }


class _MicroBatcher:
    """Collects generate requests from the step's prompt tasks and serves them with one backend call."""

    def __init__(self, backend: PolicyBackend, params: SamplingParams, batching: str):
        self.backend, self.params, self.batching = backend, params, batching
        self.pending: list[tuple[list[list[int]], list[int], list[str], asyncio.Future]] = []
        # backends that route rows (vLLM with several engines) take a key per row: the tree id, so a tree's
        # branches reach the engine whose prefix cache holds its history
        self.takes_keys = "keys" in inspect.signature(getattr(backend, "agenerate", backend.generate)).parameters
        self.live, self.running, self.clock = 0, False, Clock()
        self.tasks: set[asyncio.Task] = set()  # the loop holds tasks weakly: a call in flight is kept alive here

    def begin(self, prompts: int, clock: Clock) -> None:
        self.live, self.pending, self.running, self.clock = prompts, [], False, clock

    def end_prompt(self) -> None:
        self.live -= 1
        self._kick()

    async def generate(self, prompts: list[list[int]], seeds: list[int], keys: list[str]) -> list[Generation]:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((prompts, seeds, keys, fut))
        self._kick()
        return await fut

    def _kick(self) -> None:
        if self.batching == "continuous":  # every request is its own call, now: the backend batches what is in flight
            batch, self.pending = self.pending, []
            for req in batch:
                self._spawn([req])
            return
        if self.running or not self.pending:
            return
        if self.batching == "round" and len(self.pending) < self.live:
            return  # someone is still stepping its environment or allocating: wait for its request
        batch, self.pending, self.running = self.pending, [], True
        # requests arrive in the order their environment steps end (thread timing); a backend's fp32 logits can
        # depend in the last bits on a row's position in the batch (CPU kernels block the rows differently), so
        # rows are laid out in an order fixed by the requests themselves: tree ids, then seeds, then the ids
        batch.sort(key=lambda req: (req[2], req[1], req[0]))
        self._spawn(batch)

    def _spawn(self, batch) -> None:
        task = asyncio.ensure_future(self._serve(batch))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(self, batch) -> None:
        flat = [p for prompts, _, _, _ in batch for p in prompts]
        seeds = [s for _, row_seeds, _, _ in batch for s in row_seeds]
        extra = {"keys": [k for _, _, keys, _ in batch for k in keys]} if self.takes_keys else {}
        clock = self.clock  # calls may overlap (continuous): the clock counts the time any was in flight
        clock.started("generate")
        try:
            agenerate = getattr(self.backend, "agenerate", None)
            if agenerate is not None:
                gens = await agenerate(flat, self.params, seeds=seeds, **extra)
            else:  # a synchronous backend: runs on the loop thread
                gens = self.backend.generate(flat, self.params, seeds=seeds, **extra)
        except Exception as err:  # hand the failure to every waiting prompt instead of hanging them
            for _, _, _, fut in batch:
                if not fut.done():  # a requester cancelled meanwhile (its prompt failed) wants nothing
                    fut.set_exception(err)
            return
        finally:
            clock.finished("generate")
            self.running = False
        i = 0
        for prompts, _, _, fut in batch:
            if not fut.done():
                fut.set_result(gens[i : i + len(prompts)])
            i += len(prompts)
        self._kick()


CONTINUOUS_NEEDS = (
    "batching=continuous needs a backend that serves calls at once (vllm, server); this one (as hf) serves one call "
    "at a time: use round or eager"
)


class LMActor:
    """Samples ReAct turns from `backend` in `env_factory()` environments."""

    def __init__(
        self,
        backend: PolicyBackend,
        env_factory: Callable[[], AgentEnv],
        params: SamplingParams,
        batching: str = "round",
        env_workers: int = 8,
    ):
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {', '.join(BATCHING)}, got {batching!r}")
        if batching == "continuous" and not getattr(backend, "concurrent_calls", False):
            raise ValueError(CONTINUOUS_NEEDS)
        if env_workers < 1:
            raise ValueError(f"env_workers must be >= 1, got {env_workers}")
        self.backend, self.env_factory, self.params = backend, env_factory, params
        self.fmt = ChatFormat(backend.tokenizer)
        self.batcher = _MicroBatcher(backend, params, batching)
        self.env_workers = env_workers
        self.clock = Clock()

    @property
    def continuous(self) -> bool:
        """Episodes advance independently (`grow.lockstep`), each turn its own call (`continuous` batching)."""
        return self.batcher.batching == "continuous"

    def begin_step(self, prompts: int, clock: Clock) -> None:
        self.clock = clock
        self.batcher.begin(prompts, clock)

    def __getstate__(self) -> dict:  # shipped to Ray workers: threads and pending futures stay behind
        state = dict(self.__dict__)
        state.pop("_executor", None)
        state["batcher"] = _MicroBatcher(self.backend, self.params, self.batcher.batching)
        return state

    def end_prompt(self) -> None:
        self.batcher.end_prompt()

    def tree(self, index: int, task: dict) -> RolloutTree:
        return RolloutTree(index, prompt=task)

    def start(self, tree: RolloutTree, task: dict, seeds: Sequence[int]) -> list[Episode]:
        clock = self.clock  # the one it started on, should a new step swap it meanwhile
        clock.started("env")
        try:
            episodes = [start_episode(self.env_factory(), task, self.fmt) for _ in seeds]
        finally:
            clock.finished("env")
        for ep, seed in zip(episodes, seeds):
            ep.seed, ep.key = seed, tree.root_id
        tree.root.token_ids = list(episodes[0].token_ids)
        tree.root.loss_mask = [0] * len(episodes[0].token_ids)
        return episodes

    def fork(self, episode: Episode, seed: int) -> Episode:
        twin = episode.fork()
        twin.seed = seed
        return twin

    async def advance(self, episodes: Sequence[Episode]) -> list[dict]:
        seeds = [derive_seed(ep.seed, len(ep.turns)) for ep in episodes]
        gens = await self.batcher.generate([ep.token_ids for ep in episodes], seeds, [ep.key for ep in episodes])
        loop = asyncio.get_running_loop()
        pool = self._pool()
        turns = await asyncio.gather(
            *(loop.run_in_executor(pool, self._step, ep, gen) for ep, gen in zip(episodes, gens))
        )
        return [turn_fields(t, gen.stop_reason) for t, gen in zip(turns, gens)]

    def _step(self, ep: Episode, gen: Generation):
        clock = self.clock  # the one it started on, should a new step swap it meanwhile
        clock.started("env")
        try:
            turn = apply_generation(ep, gen, self.fmt)
            if not ep.done and len(ep.turns) >= ep.env.max_turns:
                ep.done = True  # the env enforces its limit; this guards envs that do not
            return turn
        finally:
            clock.finished("env")

    def _pool(self) -> ThreadPoolExecutor:
        # one pool per actor, created on first use; threads are daemon-like and idle between steps
        if getattr(self, "_executor", None) is None:
            self._executor = ThreadPoolExecutor(self.env_workers, thread_name_prefix="trace-env")
        return self._executor
