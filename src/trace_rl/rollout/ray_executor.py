"""`executor=ray`: each prompt's tree grows as its own task on a pool of Ray workers.

A prompt's stage 2 starts as soon as its own bare rollouts end, inside its task: there is no barrier across
prompts. The step's context (actor, predictor, budget, method, seed, step; `grow.StepContext`) is shipped once
per step through Ray's object store, and the environments are created in the workers. The tree a task returns
is the only thing counted, so a worker that dies mid-tree has that prompt retried on another worker (a fresh
one replaces it), its budget is counted once, and the retry is counted in the step's metrics
(`rollout/worker_retries`). Every random draw of a prompt comes from streams named by (seed, step, prompt),
so the trees equal the local executor's for the same seed (bit for bit on the testbed; an LM backend whose
fp32 logits depend on the batch shape can, rarely, sample differently: its batches differ here).

What listens where. A local cluster (no `address`) is started in Ray's single-machine mode
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, the switch Ray itself uses on macOS and Windows, set here unless the
environment sets it), which makes the node's address 127.0.0.1: measured with `ss -ltnp` under Ray 2.60 with
two workers, every listener is on 127.0.0.1: the GCS server (1 port), the raylet (2), the driver and each
worker process (1 each, gRPC) and the runtime-env agent (1, HTTP); the dashboard is off and nothing else
listens. Without that mode Ray ignores a node address of 127.0.0.1 (it substitutes the host's reachable
address) and binds those gRPC ports on all interfaces, the runtime-env agent on the host's address; Ray's
token authentication is on either way. If `ray` was imported before the executor started the cluster, the
mode may be too late to apply: the executor then warns with the address Ray chose. With `address`, the
cluster is someone else's and listens where it was started.

Limits: a worker grows one prompt at a time, so an LM backend in a worker sees one prompt's batch; shipping
the actor each step suits small policies (the testbed, the tiny model) or actors that talk to a served model
(the OpenAI-compatible backend); a large in-process model belongs on the local executor or behind a server.
"""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from dataclasses import dataclass, replace

from .grow import Clock, PromptJob, PromptResult, StepContext, grow_prompt

SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node address is 127.0.0.1


@dataclass
class RayConfig:
    """The Ray executor's cluster (used with executor=ray)."""

    address: str = ""  # an existing cluster's address (default: start a local one, listening on 127.0.0.1)
    workers: int = 2  # worker processes, one prompt tree at a time each
    max_retries: int = 2  # times a prompt is retried when its worker dies

    def __post_init__(self):
        if self.workers < 1 or self.max_retries < 0:
            raise ValueError(f"workers must be >= 1 and max_retries >= 0, got {self.workers}, {self.max_retries}")


def _grow_in_worker(ctx: StepContext, job: PromptJob) -> tuple[PromptResult, dict]:
    """One prompt in a worker, on the worker's own clock (the driver's clock and t0 mean nothing here)."""
    ctx = replace(ctx, clock=Clock(), t0=time.perf_counter())
    ctx.actor.begin_step(1, ctx.clock)
    result = asyncio.run(grow_prompt(ctx, job))
    return result, ctx.clock.seconds


class RayExecutor:
    def __init__(self, config: RayConfig | None = None):
        self.config = config or RayConfig()
        if not self.config.address:  # read when ray is imported, and by every process the cluster starts
            os.environ.setdefault(SINGLE_MACHINE, "0")
        import ray

        if not ray.is_initialized():
            if self.config.address:
                ray.init(address=self.config.address, log_to_driver=False)
            else:
                ray.init(num_cpus=self.config.workers, include_dashboard=False, log_to_driver=False)
                node = ray.util.get_node_ip_address()
                if node != "127.0.0.1":
                    warnings.warn(
                        f"the local Ray cluster listens on {node}, not 127.0.0.1 only: ray was imported before the "
                        f"executor could set {SINGLE_MACHINE}=0 (or the environment sets it otherwise); set it to 0 "
                        "in the environment to keep the cluster local",
                        stacklevel=2,
                    )
        self.ray = ray
        # num_cpus=0: workers are placed however many executors share the cluster (each holds its own pool)
        self._worker_cls = ray.remote(num_cpus=0, max_restarts=0)(_Worker)
        self.workers = [self._worker_cls.remote() for _ in range(self.config.workers)]
        self.retries = 0  # prompts retried after a worker died, over the executor's life

    async def run(self, ctx: StepContext, jobs: list[PromptJob]) -> list[PromptResult]:
        ray = self.ray
        shared = ray.put(ctx)
        queue = list(jobs)
        attempts = {job.index: 0 for job in jobs}
        running: dict = {}  # object ref -> (worker slot, job)
        results: list[PromptResult] = []

        def submit(slot: int) -> None:
            job = queue.pop(0)
            running[self.workers[slot].grow.remote(shared, job)] = (slot, job)

        for slot in range(min(len(self.workers), len(queue))):
            submit(slot)
        while running:
            ready, _ = await asyncio.to_thread(ray.wait, list(running), num_returns=1)
            ref = ready[0]
            slot, job = running.pop(ref)
            try:
                result, seconds = ray.get(ref)
            except ray.exceptions.RayActorError:  # the worker died mid-tree: replace it, retry the prompt
                attempts[job.index] += 1
                if attempts[job.index] > self.config.max_retries:
                    raise RuntimeError(f"prompt {job.index}: its worker died {attempts[job.index]} times") from None
                self.retries += 1
                self.workers[slot] = self._worker_cls.remote()
                queue.insert(0, job)
            else:
                result.worker_retries = attempts[job.index]
                results.append(result)
                for phase in ("generate", "env", "predictor", "allocate"):
                    ctx.clock.add(phase, seconds[phase])
            if queue:
                submit(slot)
        return results


class _Worker:
    """A Ray actor that grows one prompt's tree per call (its environments live here)."""

    def grow(self, ctx: StepContext, job: PromptJob) -> tuple[PromptResult, dict]:
        return _grow_in_worker(ctx, job)
