"""Run agent episodes in lockstep: each round, one batched backend call samples the next turn of every
episode still running. Used by evaluation and the SFT report (the TRACE step has its own actor, `lm_actor`).
Episode i's turn t samples from `derive_seed(seed, i, t)`, so results do not depend on the batch size."""

from __future__ import annotations

from typing import Callable, Sequence

from ..agent.react import ChatFormat, Episode, Turn, apply_generation
from ..backends.base import Generation, PolicyBackend, SamplingParams
from ..seeding import derive_seed
from ..tree import RolloutTree, TurnNode


def run_lockstep(
    episodes: Sequence[Episode],
    backend: PolicyBackend,
    params: SamplingParams,
    fmt: ChatFormat,
    seed: int = 0,
    on_turn: Callable[[int, Turn, Episode, Generation], None] | None = None,
) -> int:
    """Advance every episode until it is done; returns the number of generated tokens."""
    generated = 0
    while True:
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            return generated
        seeds = [derive_seed(seed, i, len(episodes[i].turns)) for i in live]
        gens = backend.generate([episodes[i].token_ids for i in live], params, seeds=seeds)
        for i, gen in zip(live, gens):
            generated += len(gen.token_ids)
            turn = apply_generation(episodes[i], gen, fmt)
            if not episodes[i].done and len(episodes[i].turns) >= episodes[i].env.max_turns:
                episodes[i].done = True  # the env enforces its limit; this guards envs that do not
            if on_turn:
                on_turn(i, turn, episodes[i], gen)


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


def record_turn(
    tree: RolloutTree, parent_id: str, turn: Turn, episode: Episode, origin: str, stop_reason: str
) -> TurnNode:
    """Append a sampled turn under `parent_id`, with the reward if it ended."""
    return tree.add_turn(
        parent_id,
        terminal=episode.done,
        reward=episode.reward if episode.done else None,
        origin=origin,
        **turn_fields(turn, stop_reason),
    )
