"""Rollout trees to training rows, one row per leaf: what verl and TRL train on.

Both trainers take flat sequences (prompt + response), not trees, so every root-to-leaf path becomes one row:
the root's tokens are the prompt, the turns along the path are the response. A turn shared by k leaves then
appears in k rows; each of its tokens carries weight 1/k (`weighting="split"`), so summed over the rows of a
tree every turn node counts once, as `trace_rl.tree.turn_rows` trains it. The advantage of a token is its
node's advantage from the core estimator (`batch_advantages`), unchanged; `weighted_advantages` multiplies
in the weight, which is what a trainer that cannot take per-token weights receives as its advantage.

Trade-offs and limits:
- Folding the weight into the advantage is exact for losses that are positively homogeneous in the advantage
  (PPO/GRPO clip: min(r A, clip(r) A) scales with A > 0 and with A < 0 alike; CISPO, vanilla PG). It counts a
  node once under a token-sum loss normalised by a constant (verl `token-mean`, TRL `dapo`/`bnpo`); a per-row
  mean (TRL `grpo`, verl `seq-mean-*`) divides each copy by its own row length, so long rows weigh less.
- The forward pass still runs over every copy of a shared prefix: rows trade compute for trainer compatibility.
- `weighting="none"` gives every copy weight 1 (a shared node counts k times), for comparison only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..advantages import batch_advantages
from ..tree import RolloutTree

WEIGHTINGS = ("split", "none")


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
    weights: list[float]  # 1 / (leaves through the token's node) under "split", 1 under "none"
    reward: float
    turn_lengths: list[int] = field(default_factory=list)  # response tokens per turn along the path

    @property
    def weighted_advantages(self) -> list[float]:
        return [a * w for a, w in zip(self.advantages, self.weights)]


def _turn_logprobs(node) -> list[float] | None:
    """Per-token log-probs of one turn: the node stores them for its policy tokens only, in order."""
    policy = sum(node.loss_mask)
    if not node.logprobs:
        return None if policy else [0.0] * len(node.token_ids)
    if len(node.logprobs) != policy:
        raise ValueError(f"node {node.node_id!r}: {len(node.logprobs)} log-probs for {policy} policy tokens")
    it = iter(node.logprobs)
    return [next(it) if m else 0.0 for m in node.loss_mask]


def tree_rows(
    tree: RolloutTree, advantages: dict[str, float], weighting: str = "split", tree_index: int = 0
) -> list[PathRow]:
    """One row per leaf of `tree`, with the per-node `advantages` (from the core estimators) spread on tokens.

    Leaves without a reward (an unfinished rollout) cannot be trained on and raise."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    tree.compute_targets()  # fills node.leaves, the number of rows that carry each node
    rows = []
    for leaf in tree.leaves():
        if leaf.reward is None:
            raise ValueError(f"leaf {leaf.node_id!r} of tree {tree.root_id!r} has no reward")
        ids, mask, node_ids, adv, wts, lens = [], [], [], [], [], []
        logprobs: list[float] | None = []
        for node in tree.path(leaf.node_id)[1:]:
            if len(node.token_ids) != len(node.loss_mask):
                raise ValueError(f"node {node.node_id!r}: {len(node.token_ids)} tokens, {len(node.loss_mask)} mask")
            n = len(node.token_ids)
            ids += node.token_ids
            mask += node.loss_mask
            node_ids += [node.node_id] * n
            if node.node_id not in advantages:
                raise KeyError(f"no advantage for node {node.node_id!r} of tree {tree.root_id!r}")
            adv += [float(advantages[node.node_id])] * n
            wts += [1.0 / node.leaves if weighting == "split" else 1.0] * n
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
    policy tokens receive in total. Under "split" it equals advantage x policy tokens of the node, as when the
    node is trained once; tests and diagnostics compare the two."""
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
