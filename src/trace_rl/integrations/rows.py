"""Rollout trees to training rows, one row per leaf: what verl and TRL train on.

Both trainers take flat sequences (prompt + response), not trees, so every root-to-leaf path becomes one row:
the root's tokens are the prompt, the turns along the path are the response. A turn shared by k leaves then
appears in k rows; how much each copy weighs is `trace_rl.paths`'s `weighting`, stated there once: "split"
(the default here: 1/k per copy, so summed over a tree's rows every turn node counts once, as the trainer's
packing trains it), "first" (1 on the first row, 0 on the others) or "leaf" (1 per copy, k in all). The
advantage of a token is its node's advantage from the core estimator (`batch_advantages`), unchanged;
`weighted_advantages` multiplies in the weight, which is what a trainer that cannot take per-token weights
receives as its advantage.

Trade-offs and limits:
- Folding the weight into the advantage is exact for losses that are positively homogeneous in the advantage
  (PPO/GRPO clip: min(r A, clip(r) A) scales with A > 0 and with A < 0 alike; CISPO, vanilla PG). It counts a
  node once under a token-sum loss normalised by a constant (verl `token-mean`, TRL `dapo`/`bnpo`); a per-row
  mean (TRL `grpo`, verl `seq-mean-*`) divides each copy by its own row length, so long rows weigh less.
- The forward pass still runs over every copy of a shared prefix: rows trade compute for trainer compatibility.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..advantages import batch_advantages
from ..paths import copy_weights, tree_paths
from ..tree import RolloutTree


@dataclass
class PathRow:
    """One leaf's root-to-leaf path as a flat training row (per-token lists all have the response's length)."""

    tree_index: int  # position of the tree in the step's list
    root_id: str
    leaf_id: str
    prompt_ids: list[int]  # the root's tokens
    completion_ids: list[int]  # the turns' tokens along the path, in order
    loss_mask: list[int]  # 1 for policy tokens, 0 for observations and templates
    logprobs: list[float] | None  # sampling log-probs per token (0.0 off the mask); None if any turn lacks them
    node_ids: list[str]  # the node each response token belongs to
    advantages: list[float]  # the token's node advantage, unweighted
    weights: list[float]  # the copy's weight under `weighting` (trace_rl.paths)
    reward: float
    turn_lengths: list[int] = field(default_factory=list)  # response tokens per turn along the path

    @property
    def weighted_advantages(self) -> list[float]:
        return [a * w for a, w in zip(self.advantages, self.weights)]


def _turn_logprobs(node) -> list[float] | None:
    """Per-token log-probs of one turn (validated by `paths.check_node`): the node stores them for its policy
    tokens only, in order; None when a turn with policy tokens has none."""
    if not node.logprobs:
        return None if sum(node.loss_mask) else [0.0] * len(node.token_ids)
    it = iter(node.logprobs)
    return [next(it) if m else 0.0 for m in node.loss_mask]


def tree_rows(
    tree: RolloutTree, advantages: dict[str, float], weighting: str = "split", tree_index: int = 0
) -> list[PathRow]:
    """One row per leaf of `tree`, with the per-node `advantages` (from the core estimators) spread on tokens.

    Leaves without a reward (an unfinished rollout) cannot be trained on and raise."""
    paths = tree_paths(tree)
    by_leaf = {path[-1].node_id: (path, w) for path, w in zip(paths, copy_weights(paths, weighting))}
    rows = []
    for leaf in tree.leaves():  # rows in the order the leaves grew (a path's "first" is still depth-first)
        path, path_weights = by_leaf[leaf.node_id]
        if leaf.reward is None:
            raise ValueError(f"leaf {leaf.node_id!r} of tree {tree.root_id!r} has no reward")
        ids, mask, node_ids, adv, wts, lens = [], [], [], [], [], []
        logprobs: list[float] | None = []
        for node, w in zip(path[1:], path_weights[1:]):
            n = len(node.token_ids)
            ids += node.token_ids
            mask += node.loss_mask
            node_ids += [node.node_id] * n
            if node.node_id not in advantages:
                raise KeyError(f"no advantage for node {node.node_id!r} of tree {tree.root_id!r}")
            adv += [float(advantages[node.node_id])] * n
            wts += [w] * n
            lens.append(n)
            turn_lp = _turn_logprobs(node)
            logprobs = None if logprobs is None or turn_lp is None else logprobs + turn_lp
        rows.append(
            PathRow(
                tree_index,
                tree.root_id,
                leaf.node_id,
                list(tree.root.token_ids),
                ids,
                mask,
                logprobs,
                node_ids,
                adv,
                wts,
                float(leaf.reward),
                lens,
            )
        )
    return rows


def batch_rows(
    trees: Sequence[RolloutTree], estimator: str = "trace", weighting: str = "split", **estimator_kwargs
) -> list[PathRow]:
    """Rows of one step's trees with the core's `estimator` (batch-level for those that whiten a step)."""
    trees = list(trees)
    advs = batch_advantages(estimator, trees, **estimator_kwargs)
    return [row for i, (t, a) in enumerate(zip(trees, advs)) for row in tree_rows(t, a, weighting, tree_index=i)]


def node_credit(rows: Sequence[PathRow]) -> dict[tuple[int, str], float]:
    """Sum over rows of weight x advantage x mask, per (tree index, node id): the gradient weight each node's
    policy tokens receive in total. Under "split" and "first" it equals advantage x policy tokens of the node,
    as when the node is trained once; tests and diagnostics compare the two."""
    out: dict[tuple[int, str], float] = {}
    for row in rows:
        for nid, a, w, m in zip(row.node_ids, row.advantages, row.weights, row.loss_mask):
            key = (row.tree_index, nid)
            out[key] = out.get(key, 0.0) + a * w * m
    return out


def pad_rows(values: Sequence[Sequence[float]], width: int | None = None, fill: float = 0.0) -> np.ndarray:
    """Right-pad per-row lists to one array (what both trainers batch), truncating rows longer than `width`."""
    width = max((len(v) for v in values), default=0) if width is None else width
    out = np.full((len(values), width), fill, dtype=np.float64)
    for i, v in enumerate(values):
        v = list(v)[:width]
        out[i, : len(v)] = v
    return out
