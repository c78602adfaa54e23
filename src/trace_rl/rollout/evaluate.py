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


def evaluate(
    backend: PolicyBackend,
    make_env,
    tasks: list[dict],
    params: SamplingParams,
    samples: int = 1,
    ks: tuple[int, ...] = (1,),
    batch: int = 64,
    seed: int = 0,
    label: str = "",
    progress: bool = True,
    results: list | None = None,
) -> dict:
    """pass@k for each k <= samples over `tasks` (pass@1 is the mean success of all samples). With `results`,
    one record per sample is appended to it: task index, sample, score, turns and the generated text."""
    fmt = ChatFormat(backend.tokenizer)
    jobs = [(i, s) for i in range(len(tasks)) for s in range(samples)]
    correct = np.zeros(len(tasks), dtype=int)
    bar = _bar(len(jobs), label, progress)
    for start in range(0, len(jobs), batch):
        chunk = jobs[start : start + batch]
        episodes = [start_episode(make_env(), tasks[i], fmt) for i, _ in chunk]

        def on_turn(j, turn, ep, gen):
            if ep.done:
                bar.update(1)  # the bar moves per finished episode, not per batch

        run_lockstep(episodes, backend, params, fmt, seed=derive_seed(seed, "eval-chunk", start), on_turn=on_turn)
        for (i, s), ep in zip(chunk, episodes):
            correct[i] += ep.reward > 0.5
            if results is not None:
                results.append(
                    {
                        "index": tasks[i].get("index", i),
                        "sample": s,
                        "score": float(ep.reward),
                        "turns": len(ep.turns),
                        "generation": [
                            {"thought": t.thought, "action": t.action, "observation": t.observation} for t in ep.turns
                        ],
                    }
                )
    bar.close()
    out = {"tasks": len(tasks), "samples": samples}
    for k in ks:
        if k <= samples:
            out[f"pass@{k}"] = float(np.mean([pass_at_k(samples, int(c), k) for c in correct]))
    return out


def _bar(total: int, label: str, enabled: bool):
    """A tqdm bar with an ETA on stderr (a no-op object when disabled)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=label or "eval",
        unit="episode",
        file=sys.stderr,
        disable=not enabled,
        dynamic_ncols=True,
        leave=False,
    )


def success_by_difficulty(
    backend, tasks: list[dict], params: SamplingParams, seed: int = 0, batch: int = 64
) -> tuple[dict, list[RolloutTree]]:
    fmt = ChatFormat(backend.tokenizer)
    episodes = [start_episode(CalculatorEnv(), t, fmt) for t in tasks]
    trees = [RolloutTree(i, prompt=t) for i, t in enumerate(tasks)]
    heads = [tree.root_id for tree in trees]
    for tree, ep in zip(trees, episodes):
        tree.root.token_ids, tree.root.loss_mask = list(ep.token_ids), [0] * len(ep.token_ids)

    for i in range(0, len(episodes), batch):

        def on_turn(j, turn, ep, gen, i=i):
            heads[i + j] = record_turn(trees[i + j], heads[i + j], turn, ep, BARE, gen.stop_reason).node_id

        run_lockstep(
            episodes[i : i + batch], backend, params, fmt, seed=derive_seed(seed, "report-chunk", i), on_turn=on_turn
        )
    out = {"overall": float(np.mean([e.reward for e in episodes]))}
    turns = [t for e in episodes for t in e.turns]
    out["well_formed"] = float(np.mean([not t.observation.startswith(("Invalid", "Unknown", "Error")) for t in turns]))
    for key in sorted({(t["steps"], t["digits"]) for t in tasks}):
        r = [e.reward for e, t in zip(episodes, tasks) if (t["steps"], t["digits"]) == key]
        out[f"steps={key[0]} digits={key[1]}"] = float(np.mean(r))
    return out, trees


def check_context(backend: PolicyBackend, make_env, tasks: list[dict], params: SamplingParams, label: str) -> None:
    """Refuse, before any generation, a prompt that with one turn's tokens exceeds the model's positions."""
    limit = getattr(getattr(getattr(backend, "model", None), "config", None), "max_position_embeddings", None)
    if not limit:
        return
    fmt = ChatFormat(backend.tokenizer)
    for i, task in enumerate(tasks):
        n = len(start_episode(make_env(), task, fmt).token_ids)
        if n + params.max_new_tokens > limit:
            raise ValueError(
                f"{label}: task {i} has a {n}-token prompt; with max_new_tokens={params.max_new_tokens} "
                f"it exceeds the model's {limit} positions (use a model with a longer context)"
            )
