"""Policy backends, token-in/token-out: prompt token ids in, sampled token ids, their log-probs and the stop
reason out. Histories are extended by appending ids; nothing is re-tokenised.

`ScriptedBackend` answers from a function of the decoded prompt, deterministically, so the agent loop and the
rollout engine are testable without a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence


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
    prefix_tokens_computed: int = 0  # prompt tokens this call had to prefill (0 when fully cached)


class PolicyBackend(Protocol):
    tokenizer: object

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int | None = None) -> list[Generation]:
        """One continuation per prompt; prompts sharing a prefix share its computation."""


@dataclass
class ScriptedBackend:
    """Deterministic test backend: `respond(prompt_text, index)` gives the text to emit."""

    tokenizer: object
    respond: Callable[[str, int], str]
    calls: list[int] = field(default_factory=list)

    def generate(self, prompts, params: SamplingParams, seed: int | None = None) -> list[Generation]:
        out = []
        eos = self.tokenizer.eos_token
        for i, prompt in enumerate(prompts):
            text = self.respond(self.tokenizer.decode(list(prompt)), i)
            ids = self.tokenizer(text + eos, add_special_tokens=False).input_ids[: params.max_new_tokens]
            reason = "stop" if ids and ids[-1] == self.tokenizer.eos_token_id else "length"
            out.append(Generation(ids, [0.0] * len(ids), reason, self.tokenizer.decode(ids)))
        self.calls.append(len(prompts))
        return out
