"""`trace-rl eval`: accuracy per benchmark, pass@1 and (on request) pass@k from n samples per task."""

from __future__ import annotations

import sys
from math import comb

import numpy as np

from ..agent.react import ChatFormat, start_episode
from ..lm.backend import PolicyBackend, SamplingParams
from .episodes import run_lockstep


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
        run_lockstep(episodes, backend, params, fmt, seed=seed + start)
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
