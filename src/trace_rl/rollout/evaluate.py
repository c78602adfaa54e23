"""Evaluation: `trace-rl eval`'s accuracy per benchmark (pass@1, pass@k from n samples per task), and the
success of a policy by difficulty (`trace-rl sft`'s report; its episodes come back as one-rollout trees, so the
report's samples can warm-start a predictor).

Episodes run through the TRACE engine's flat evaluation (`TreeRolloutEngine.evaluate`): the same episode loop,
actor, sampling, environment stepping and stopping as training's trees, with no allocation, no branching and no
predictor. Sample s of the i-th task has its own seed, derive_seed(seed, i, s), so a result does not depend on
the batch size: batches only bound memory (`batch` episodes in flight).
"""

from __future__ import annotations

import sys
from math import comb
from typing import Callable

import numpy as np

from ..agent.react import ChatFormat, NonFiniteReward, start_episode
from ..seeding import derive_seed
from ..tree import RolloutTree
from .engine import TreeRolloutEngine, evaluation_seed
from .lm_actor import LMActor


def evaluation_engine(policy: TreeRolloutEngine | LMActor) -> TreeRolloutEngine:
    """The engine that evaluates `policy`: itself, or an engine around an actor (one with no predictor)."""
    return policy if isinstance(policy, TreeRolloutEngine) else TreeRolloutEngine(policy)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate(
    policy: TreeRolloutEngine | LMActor,
    tasks: list[dict],
    samples: int = 1,
    ks: tuple[int, ...] = (1,),
    batch: int = 64,
    seed: int = 0,
    label: str = "",
    progress: bool = True,
    results: list | None = None,
) -> dict:
    """pass@k for each k <= samples over `tasks` (pass@1 is the mean success of all samples), played by the
    engine of `policy` (an engine, or an actor). With `results`, one record per sample is appended to it: task
    index, sample, score, turns and the generated text."""
    bar = _bar(len(tasks) * samples, label, progress)
    try:
        run = evaluation_engine(policy).evaluate(
            tasks,
            samples,
            seeds=lambda i, s: evaluation_seed(seed, i, s),
            batch=batch,
            on_done=lambda i, s: bar.update(1),  # the bar moves per finished episode, not per batch
        )
    except NonFiniteReward as err:  # never scored (NaN as a failure, inf as a success): one line saying where
        raise err.at(label or "evaluation") from None
    finally:
        bar.close()
    correct = np.zeros(len(tasks), dtype=int)
    for i, task in enumerate(tasks):
        for s, turns in enumerate(run.rollouts(i)):
            score = float(turns[-1].reward)
            correct[i] += score > 0.5
            if results is not None:
                results.append(
                    {
                        "index": task.get("index", i),
                        "sample": s,
                        "score": score,
                        "turns": len(turns),
                        "generation": [
                            {"thought": t.thought, "action": t.action, "observation": t.observation} for t in turns
                        ],
                    }
                )
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


def success_by_group(
    policy: TreeRolloutEngine | LMActor,
    tasks: list[dict],
    group: Callable[[dict], str] | None,
    seed: int = 0,
    batch: int = 64,
) -> tuple[dict, list[RolloutTree]]:
    """Mean success overall, the share of well-formed turns, and the success of each `group(task)` label (the
    env spec's difficulty); each episode also comes back as a one-rollout tree. Task i's one sample samples
    from derive_seed(seed, "report", i)."""
    run = evaluation_engine(policy).evaluate(tasks, 1, seeds=lambda i, s: derive_seed(seed, "report", i), batch=batch)
    episodes = [run.rollouts(i)[0] for i in range(len(tasks))]
    rewards = [float(turns[-1].reward) for turns in episodes]
    out = {"overall": float(np.mean(rewards))}
    turns = [t for e in episodes for t in e]
    out["well_formed"] = float(np.mean([not t.observation.startswith(("Invalid", "Unknown", "Error")) for t in turns]))
    if group is not None:
        labels = [group(t) for t in tasks]
        for label in sorted(set(labels)):
            out[label] = float(np.mean([r for r, lab in zip(rewards, labels) if lab == label]))
    return out, run.trees


def check_context(actor: LMActor, tasks: list[dict], label: str) -> None:
    """Refuse, before any generation, a prompt that with one turn's tokens exceeds the model's positions."""
    backend, params = actor.backend, actor.params
    limit = getattr(getattr(getattr(backend, "model", None), "config", None), "max_position_embeddings", None)
    if not limit:
        return
    fmt = ChatFormat(backend.tokenizer)
    for i, task in enumerate(tasks):
        n = len(start_episode(actor.env_factory(), task, fmt).token_ids)
        if n + params.max_new_tokens > limit:
            raise ValueError(
                f"{label}: task {i} has a {n}-token prompt; with max_new_tokens={params.max_new_tokens} "
                f"it exceeds the model's {limit} positions (use a model with a longer context)"
            )
