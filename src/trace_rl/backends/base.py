"""Policy backends, token-in/token-out: prompt token ids in, sampled token ids, their log-probs and the stop
reason out. Histories are extended by appending ids; nothing is re-tokenised.

Randomness is per request: each prompt row carries its own seed, so what a row samples does not depend on
which other rows share its batch. That is what lets the engine batch whatever is ready (rows arriving from
different prompts at different times) and still reproduce a run from one seed. (A backend whose logits depend
on the batch shape in the last bits, as fp32 matmuls do, can still flip a token whose cumulative probability
sits within rounding of the row's uniform draw; the engine's default batching keeps batch composition fixed.)

Caches keyed on token ids (prefix KV, per-row KV) are only valid for the weights that filled them: every
backend carries a `weight_version`, bumped by `update_weights()` / `invalidate()`, and serves no cached state
from an older version.

`ScriptedBackend` answers from a function of the decoded prompt, deterministically, so the agent loop and the
rollout engine are testable without a model.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from ..seeding import derive_seed


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn."""

    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    max_new_tokens: int = 64  # hard cap on generated tokens per call
    stop: tuple[str, ...] = ()  # stop strings (the tokenizer's eos token always stops)

    def __post_init__(self):
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Generation:
    """One sampled continuation."""

    token_ids: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" (eos or a stop string) or "length"
    text: str = ""
    # prompt tokens prefilled for this row (0 when fully cached); a backend that prefills a call's rows together
    # (hf) counts the call's prefill on its first row, so the sum over a call's rows is what the call prefilled
    prefix_tokens_computed: int = 0


def row_seeds(n: int, seed: int | None, seeds: Sequence[int] | None) -> list[int]:
    """Per-row seeds: as given, or derived from the call's seed and the row's index."""
    if seeds is not None:
        if len(seeds) != n:
            raise ValueError(f"seeds: {len(seeds)} seeds for {n} prompts")
        return [int(s) for s in seeds]
    return [derive_seed(0 if seed is None else int(seed), "row", i) for i in range(n)]


class PolicyBackend(Protocol):
    tokenizer: object
    weight_version: int

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """One continuation per prompt; row i samples from `seeds[i]` (or from `seed` and i); prompts sharing a
        prefix share its computation."""

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        """`generate` without blocking the event loop (vLLM's async engine implements this natively)."""

    def update_weights(self, state_dict: dict | None = None) -> int:
        """Load new weights (or note that the model was updated in place); drops cached KV; new version."""

    def invalidate(self) -> int:
        """Drop every cache and bump the weight version."""


class VersionedBackend:
    """What every backend shares: the weight version, and an `agenerate` that runs `generate` in a worker
    thread (one call at a time: a model is not safe to call from two threads at once)."""

    weight_version: int = 0
    _call_lock = threading.Lock()  # class-wide: simple, and one process drives one model at a time anyway

    def generate(self, prompts, params, seed=None, seeds=None) -> list[Generation]:
        raise NotImplementedError

    async def agenerate(self, prompts, params: SamplingParams, seeds: Sequence[int] | None = None) -> list[Generation]:
        return await asyncio.to_thread(self._generate_locked, prompts, params, seeds)

    def _generate_locked(self, prompts, params, seeds) -> list[Generation]:
        with self._call_lock:
            return self.generate(prompts, params, None, seeds)

    def clear_cache(self) -> None:
        """Drop cached state (backends with caches override this)."""

    def invalidate(self) -> int:
        self.clear_cache()
        self.weight_version += 1
        return self.weight_version

    def update_weights(self, state_dict: dict | None = None) -> int:
        if state_dict is not None:
            self._load_state_dict(state_dict)
        return self.invalidate()

    def _load_state_dict(self, state_dict: dict) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no weights to load")


@dataclass
class ScriptedBackend(VersionedBackend):
    """Deterministic test backend: `respond(prompt_text, index)` gives the text to emit."""

    tokenizer: object
    respond: Callable[[str, int], str]
    calls: list[int] = field(default_factory=list)

    def generate(self, prompts, params: SamplingParams, seed: int | None = None, seeds=None) -> list[Generation]:
        out = []
        eos = self.tokenizer.eos_token
        for i, prompt in enumerate(prompts):
            text = self.respond(self.tokenizer.decode(list(prompt)), i)
            ids = self.tokenizer(text + eos, add_special_tokens=False).input_ids[: params.max_new_tokens]
            reason = "stop" if ids and ids[-1] == self.tokenizer.eos_token_id else "length"
            out.append(Generation(ids, [0.0] * len(ids), reason, self.tokenizer.decode(ids)))
        self.calls.append(len(prompts))
        return out
