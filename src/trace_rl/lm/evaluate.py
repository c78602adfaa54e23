"""Success rate of a policy on the built-in task, by difficulty (sampled at the rollout temperature).

The episodes come back as one-rollout trees, so the report's samples can warm-start a predictor."""

from __future__ import annotations

import numpy as np

from ..agent.react import ChatFormat, start_episode
from ..envs.calculator import CalculatorEnv
from ..rollout.episodes import record_turn, run_lockstep
from ..tree import BARE, RolloutTree
from .backend import SamplingParams


def success_by_difficulty(backend, tasks: list[dict], params: SamplingParams, seed: int = 0,
                          batch: int = 64) -> tuple[dict, list[RolloutTree]]:
    fmt = ChatFormat(backend.tokenizer)
    episodes = [start_episode(CalculatorEnv(), t, fmt) for t in tasks]
    trees = [RolloutTree(i, prompt=t) for i, t in enumerate(tasks)]
    heads = [tree.root_id for tree in trees]
    for tree, ep in zip(trees, episodes):
        tree.root.token_ids, tree.root.loss_mask = list(ep.token_ids), [0] * len(ep.token_ids)

    for i in range(0, len(episodes), batch):
        def on_turn(j, turn, ep, gen, i=i):
            heads[i + j] = record_turn(trees[i + j], heads[i + j], turn, ep, BARE, gen.stop_reason).node_id

        run_lockstep(episodes[i: i + batch], backend, params, fmt, seed=seed + i, on_turn=on_turn)
    out = {"overall": float(np.mean([e.reward for e in episodes]))}
    turns = [t for e in episodes for t in e.turns]
    out["well_formed"] = float(np.mean([not t.observation.startswith(("Invalid", "Unknown", "Error")) for t in turns]))
    for key in sorted({(t["steps"], t["digits"]) for t in tasks}):
        r = [e.reward for e, t in zip(episodes, tasks) if (t["steps"], t["digits"]) == key]
        out[f"steps={key[0]} digits={key[1]}"] = float(np.mean(r))
    return out, trees
