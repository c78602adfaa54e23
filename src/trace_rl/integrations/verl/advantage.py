"""Tree advantages for verl rows, without verl: rebuild each prompt's tree from its leaf rows' metadata, apply
the core estimator, spread the node advantages over each row's response tokens.

verl trains on one row per session (`{uid}_{session}_{index}`); the tree worker makes every leaf a session
and writes `extra_fields["trace"]` (`leaf_record`): the tree id, the leaf id and, per turn along the path, the
node id, its origin, its token count, V~ and its text. That is enough to rebuild the tree's shape, which is
all the estimators read besides the leaf rewards (verl's `rm_scores`), so the advantage step needs no token
ids and no second copy of the trees.

Limits: a row that did not reach the trainer (a failed session, evicted by the replay buffer) is simply
absent, so its tree is rebuilt without that leaf; the advantages then describe the leaves present. A response
truncated by `rollout.response_length` keeps the advantages of its first tokens. `flat_trace_advantages` is
the estimator for rows with no tree metadata (flat groups of a prompt), where `trace` reduces to
(r - mean) / (population std + 1e-6) per prompt.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...advantages import EPS
from ...tree import ROOT, RolloutTree, TurnNode
from ..rows import batch_rows

TRACE_FIELD = "trace"  # key of the tree metadata inside a verl row's extra_fields


def leaf_record(tree: RolloutTree, leaf_id: str) -> dict:
    """What a leaf's verl row carries about its tree (plain JSON types: it travels through Ray and TQ)."""
    turns = []
    for node in tree.path(leaf_id)[1:]:
        turns.append(
            {
                "id": node.node_id,
                "origin": node.origin,
                "tokens": len(node.token_ids),
                "policy": int(sum(node.loss_mask)),
                "predicted": node.predicted,
                "action": node.action,
                "observation": node.observation,
            }
        )
    return {
        "tree": tree.root_id,
        "leaf": leaf_id,
        "prompt": tree.prompt,
        "root_predicted": tree.root.predicted,
        "turns": turns,
    }


def rebuild_trees(records: Sequence[dict], rewards: Sequence[float]) -> tuple[list[RolloutTree], list[tuple[int, str]]]:
    """Trees (in order of first appearance) from leaf records; per record, (tree index, leaf id).

    Token ids are placeholders of the right length (policy tokens first): the estimators read the shape and
    the rewards, the predictor reads the text."""
    if len(records) != len(rewards):
        raise ValueError(f"{len(records)} records for {len(rewards)} rewards")
    trees: dict[str, RolloutTree] = {}
    where: list[tuple[int, str]] = []
    order: list[str] = []
    for rec, reward in zip(records, rewards):
        root = str(rec["tree"])
        if root not in trees:
            trees[root] = RolloutTree(root, prompt=rec.get("prompt"), predicted=rec.get("root_predicted"))
            order.append(root)
        tree = trees[root]
        leaf_id = str(rec["leaf"])
        turns = rec["turns"]
        if not turns or turns[-1]["id"] != leaf_id:
            raise ValueError(f"record of leaf {leaf_id!r}: its turns do not end at the leaf")
        for turn in turns:
            nid = str(turn["id"])
            node = tree.nodes.get(nid)
            tokens, policy = int(turn["tokens"]), int(turn["policy"])
            if node is None:
                tree.nodes[nid] = TurnNode(
                    nid,
                    action=turn.get("action", ""),
                    observation=turn.get("observation", ""),
                    token_ids=[0] * tokens,
                    loss_mask=[1] * policy + [0] * (tokens - policy),
                    origin=turn["origin"],
                    predicted=turn.get("predicted"),
                )
            elif len(node.token_ids) != tokens or node.origin != turn["origin"]:
                raise ValueError(f"tree {root!r}: rows disagree on node {nid!r} (tokens or origin)")
        leaf = tree.nodes[leaf_id]
        if leaf.terminal:
            raise ValueError(f"tree {root!r}: leaf {leaf_id!r} appears in two rows")
        leaf.terminal, leaf.reward = True, float(reward)
        where.append((order.index(root), leaf_id))
    out = [trees[r] for r in order]
    for tree in out:
        _link(tree)
    return out, where


def _link(tree: RolloutTree) -> None:
    """Children lists from the ids, in index order (the order the worker added them)."""
    for node in tree.nodes.values():
        node.children = []
    for nid in sorted(tree.nodes, key=lambda s: [int(p) for p in s.split(".")[1:]]):
        parent = tree.nodes[nid].parent_id
        if parent is None:
            continue
        if parent not in tree.nodes:
            raise ValueError(f"tree {tree.root_id!r}: node {nid!r} has no parent {parent!r}")
        if tree.nodes[parent].terminal:
            raise ValueError(f"tree {tree.root_id!r}: leaf {parent!r} has a child {nid!r}")
        tree.nodes[parent].children.append(nid)
    if tree.root.origin != ROOT:
        raise ValueError(f"tree {tree.root_id!r}: its root is not a root node")


def token_advantages(
    records: Sequence[dict],
    rewards: Sequence[float],
    response_lengths: Sequence[int],
    estimator: str = "trace",
    weighting: str = "split",
    **estimator_kwargs,
) -> tuple[list[np.ndarray], list[RolloutTree]]:
    """Per row, the weighted per-token advantages over its `response_lengths[i]` tokens, and the rebuilt trees.

    Rows are in the order given; tokens past the path's end (padding) get 0."""
    trees, where = rebuild_trees(records, rewards)
    rows = {(r.tree_index, r.leaf_id): r for r in batch_rows(trees, estimator, weighting, **estimator_kwargs)}
    out = []
    for key, length in zip(where, response_lengths):
        adv = np.zeros(int(length), dtype=np.float64)
        wa = rows[key].weighted_advantages[: int(length)]
        adv[: len(wa)] = wa
        out.append(adv)
    return out, trees


def flat_trace_advantages(scores: np.ndarray, index: Sequence, scale: str = "std") -> np.ndarray:
    """`trace` on a prompt's flat group (every rollout a chain below the root): (r - mean) / (std + 1e-6) with
    the population std, one scale per prompt, as `trace_rl.advantages.trace` computes on chains."""
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    scores = np.asarray(scores, dtype=np.float64)
    index = np.asarray([str(i) for i in index])
    out = np.zeros_like(scores)
    for group in np.unique(index):
        members = index == group
        r = scores[members]
        centred = r - r.mean()
        out[members] = centred / (r.std() + EPS) if scale == "std" else centred
    return out


def merge_tree_advantages(
    extra_fields: Sequence[dict | None],
    scores: Sequence[float],
    lengths: Sequence[int],
    padding: Sequence[bool],
    base: Sequence[np.ndarray],
    estimator: str = "trace",
    weighting: str = "split",
    **estimator_kwargs,
) -> tuple[list[np.ndarray], list[RolloutTree]]:
    """A verl batch's advantages: rows carrying a tree record get the tree advantages, every other row (flat
    sessions, and verl's padding rows, which copy a real row's fields including its record) keeps `base`,
    verl's own estimator's value. Returns per-row arrays and the rebuilt trees."""
    out = [np.asarray(b, dtype=np.float64).copy() for b in base]
    picked = [
        i
        for i, (ef, pad) in enumerate(zip(extra_fields, padding))
        if not pad and isinstance(ef, dict) and TRACE_FIELD in ef
    ]
    if not picked:
        return out, []
    advs, trees = token_advantages(
        [extra_fields[i][TRACE_FIELD] for i in picked],
        [float(scores[i]) for i in picked],
        [int(lengths[i]) for i in picked],
        estimator,
        weighting,
        **estimator_kwargs,
    )
    for i, adv in zip(picked, advs):
        out[i] = adv
    return out, trees
