"""Success rate of a policy on the built-in task, by difficulty (sampled at the rollout temperature)."""

from __future__ import annotations

import numpy as np

from ..agent.react import ChatFormat, start_episode
from ..envs.calculator import CalculatorEnv
from ..rollout.episodes import run_lockstep
from .backend import SamplingParams


def success_by_difficulty(backend, tasks: list[dict], params: SamplingParams, seed: int = 0, batch: int = 64) -> dict:
    fmt = ChatFormat(backend.tokenizer)
    episodes = [start_episode(CalculatorEnv(), t, fmt) for t in tasks]
    for i in range(0, len(episodes), batch):
        run_lockstep(episodes[i: i + batch], backend, params, fmt, seed=seed + i)
    out = {"overall": float(np.mean([e.reward for e in episodes]))}
    turns = [t for e in episodes for t in e.turns]
    out["well_formed"] = float(np.mean([not t.observation.startswith(("Invalid", "Unknown", "Error")) for t in turns]))
    for key in sorted({(t["steps"], t["digits"]) for t in tasks}):
        r = [e.reward for e, t in zip(episodes, tasks) if (t["steps"], t["digits"]) == key]
        out[f"steps={key[0]} digits={key[1]}"] = float(np.mean(r))
    return out
