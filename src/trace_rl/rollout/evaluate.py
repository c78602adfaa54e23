"""Evaluation: `trace-rl eval`'s accuracy per benchmark (pass@1, pass@k from n samples per task), and the
success of a policy on the built-in task by difficulty (`trace-rl sft`'s report; its episodes come back as
one-rollout trees, so the report's samples can warm-start a predictor)."""

from __future__ import annotations

import sys
from math import comb

import numpy as np

from ..agent.react import ChatFormat, start_episode
from ..backends.base import PolicyBackend, SamplingParams
from ..envs.calculator import CalculatorEnv
from ..seeding import derive_seed
from ..tree import BARE, RolloutTree
from .episodes import record_turn, run_lockstep


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate(backend: PolicyBackend, make_env, tasks: list[dict], params: SamplingParams, samples: int = 1,
             ks: tuple[int, ...] = (1,), batch: int = 32, seed: int = 0, label: str = "") -> dict:
    fmt = ChatFormat(backend.tokenizer)
    jobs = [(i, s) for i in range(len(tasks)) for s in range(samples)]
    correct = np.zeros(len(tasks), dtype=int)
    done = 0
    for start in range(0, len(jobs), batch):
        chunk = jobs[start: start + batch]
        episodes = [start_episode(make_env(), tasks[i], fmt) for i, _ in chunk]
        run_lockstep(episodes, backend, params, fmt, seed=derive_seed(seed, "eval-chunk", start))
        for (i, _), ep in zip(chunk, episodes):
            correct[i] += ep.reward > 0.5
        done += len(chunk)
        width = 30
        bar = "#" * int(width * done / len(jobs))
        print(f"\r{label:<16} [{bar:<{width}}] {done}/{len(jobs)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    out = {"tasks": len(tasks), "samples": samples}
    for k in ks:
        if k <= samples:
            out[f"pass@{k}"] = float(np.mean([pass_at_k(samples, int(c), k) for c in correct]))
    return out


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

        run_lockstep(episodes[i: i + batch], backend, params, fmt, seed=derive_seed(seed, "report-chunk", i),
                     on_turn=on_turn)
    out = {"overall": float(np.mean([e.reward for e in episodes]))}
    turns = [t for e in episodes for t in e.turns]
    out["well_formed"] = float(np.mean([not t.observation.startswith(("Invalid", "Unknown", "Error")) for t in turns]))
    for key in sorted({(t["steps"], t["digits"]) for t in tasks}):
        r = [e.reward for e, t in zip(episodes, tasks) if (t["steps"], t["digits"]) == key]
        out[f"steps={key[0]} digits={key[1]}"] = float(np.mean(r))
    return out, trees
