"""Evaluation: `trace-rl eval`'s accuracy per benchmark (pass@1, pass@k from n samples per task), and the
success of a policy by difficulty (`trace-rl sft`'s report; its episodes come back as one-rollout trees, so the
report's samples can warm-start a predictor).

Episodes run through the TRACE step's own actor (`LMActor.run_episodes`): the same sampling, environment
stepping and stopping as training's trees. Sample s of task i has its own seed, derive_seed(seed, i, s), so a
result depends on neither the batch size nor which other tasks are evaluated alongside it. Batches only bound
memory (`batch` episodes in flight).
"""

from __future__ import annotations

import sys
from math import comb
from typing import Callable

import numpy as np

from ..agent.react import ChatFormat, start_episode
from ..seeding import derive_seed
from ..tree import BARE, RolloutTree
from .lm_actor import LMActor


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate(
    actor: LMActor,
    tasks: list[dict],
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
    jobs = [(i, s) for i in range(len(tasks)) for s in range(samples)]
    correct = np.zeros(len(tasks), dtype=int)
    bar = _bar(len(jobs), label, progress)

    def on_turn(j, ep, fields):
        if ep.done:
            bar.update(1)  # the bar moves per finished episode, not per batch

    for start in range(0, len(jobs), batch):
        chunk = jobs[start : start + batch]
        episodes = actor.run_episodes(
            [tasks[i] for i, _ in chunk], [derive_seed(seed, i, s) for i, s in chunk], on_turn=on_turn
        )
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


def success_by_group(
    actor: LMActor, tasks: list[dict], group: Callable[[dict], str] | None, seed: int = 0, batch: int = 64
) -> tuple[dict, list[RolloutTree]]:
    """Mean success overall, the share of well-formed turns, and the success of each `group(task)` label (the
    env spec's difficulty); each episode also comes back as a one-rollout tree."""
    trees = [RolloutTree(i, prompt=t) for i, t in enumerate(tasks)]
    heads = [tree.root_id for tree in trees]
    episodes = []
    for start in range(0, len(tasks), batch):

        def on_turn(j, ep, fields, start=start):
            tree = trees[start + j]
            if len(ep.turns) == 1:  # the history before the first turn is the prompt: the root's tokens
                tree.root.token_ids = ep.token_ids[: len(ep.token_ids) - len(fields["token_ids"])]
                tree.root.loss_mask = [0] * len(tree.root.token_ids)
            node = tree.add_turn(
                heads[start + j], terminal=ep.done, reward=ep.reward if ep.done else None, origin=BARE, **fields
            )
            heads[start + j] = node.node_id

        chunk = range(start, min(start + batch, len(tasks)))
        episodes += actor.run_episodes(
            [tasks[i] for i in chunk], [derive_seed(seed, "report", i) for i in chunk], on_turn=on_turn
        )
    out = {"overall": float(np.mean([e.reward for e in episodes]))}
    turns = [t for e in episodes for t in e.turns]
    out["well_formed"] = float(np.mean([not t.observation.startswith(("Invalid", "Unknown", "Error")) for t in turns]))
    if group is not None:
        labels = [group(t) for t in tasks]
        for label in sorted(set(labels)):
            out[label] = float(np.mean([e.reward for e, lab in zip(episodes, labels) if lab == label]))
    return out, trees


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
