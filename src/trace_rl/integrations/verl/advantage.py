"""Tree advantages for verl rows, without verl: merge each prompt's tree from its leaf rows' paths, apply the
core estimator, spread the node advantages over each row's response tokens.

verl trains on one row per session (`{uid}_{session}_{index}`); the tree worker makes every leaf a session
and writes `extra_fields["trace"]` (`leaf_record`): the leaf's root-to-leaf path in the project's one tree
format, `RolloutTree.path_dict` (`root_id`, `prompt`, `nodes` serialised exactly as `to_dict` serialises
them: token ids, loss mask, log-probs, text, V~, origin), plus the row keys `leaf` and `unspent` (the
worker's unspent prefix budget). `rebuild_trees` merges the paths back with `RolloutTree.from_paths` /
`merge_path`, so the trees the trainer and the predictor update see are token-faithful: with every row
present, a rebuilt tree's `to_dict` is the worker's tree's (node for node; nodes listed in order of first
appearance across rows).

Size: a row now carries its path's token ids, loss mask and log-probs, which it also holds as its own tensors,
and the turns shared by k leaves travel k times. On a synthetic tree (`bench/bench_verl_record.py`) of 8 bare
rollouts and 8 continuations, 4 turns of 300 tokens (220 policy) each, a record is 19 KiB pickled or as
msgpack (how Ray and TQ move it; 35 KiB as JSON) against 4.5 KiB for the former counts-only record, about as
much as the row's own response ids, mask and log-probs (22 KiB as int64, int64, float32); without log-probs it
would be 11 KiB. At 256 rows a step that is 5 MB through TQ, small beside a step's generation and update, so
the record keeps every field and has no option to drop any.

Limits: a row that did not reach the trainer (a failed session, evicted by the replay buffer) is simply
absent, so its tree is rebuilt without that leaf (V^ and leaf counts recomputed); the advantages then
describe the leaves present. A response truncated by `rollout.response_length` keeps the advantages of its
first tokens. `flat_trace_advantages` is the estimator for rows with no tree metadata (flat groups of a
prompt), where `trace` reduces to (r - mean) / (population std + 1e-6) per prompt.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...advantages import EPS
from ...tree import RolloutTree
from ..rows import batch_rows

TRACE_FIELD = "trace"  # key of the leaf record (a tree.py path) inside a verl row's extra_fields


def leaf_record(tree: RolloutTree, leaf_id: str) -> dict:
    """What a leaf's verl row carries about its tree: the leaf's path as tree.py serialises it (`path_dict`:
    `root_id`, `prompt`, `nodes`) and the row key `leaf`; plain JSON types, as it travels through Ray and TQ."""
    return {**tree.path_dict(leaf_id), "leaf": leaf_id}


def rebuild_trees(records: Sequence[dict], rewards: Sequence[float]) -> tuple[list[RolloutTree], list[tuple[int, str]]]:
    """Trees (in order of first appearance) merged from the rows' leaf paths; per record, (tree index, leaf id).

    A leaf's reward is its row's score (verl's `rm_scores`, which the worker set from the same reward); V^ and
    leaf counts are recomputed, so a tree missing rows describes the leaves present. Nodes are listed in order
    of first appearance across the rows."""
    if len(records) != len(rewards):
        raise ValueError(f"{len(records)} records for {len(rewards)} rewards")
    trees: dict[str, RolloutTree] = {}
    where: list[tuple[int, str]] = []
    for rec, reward in zip(records, rewards):
        try:
            root, leaf_id, nodes = str(rec["root_id"]), str(rec["leaf"]), rec["nodes"]
            last = nodes[-1]["node_id"] if nodes else None
        except (KeyError, TypeError, IndexError):
            raise ValueError(
                f"extra_fields[{TRACE_FIELD!r}] is not a leaf record (root_id, prompt, nodes, leaf)"
            ) from None
        if last != leaf_id or not nodes[-1].get("terminal"):
            raise ValueError(f"record of leaf {leaf_id!r}: its path does not end at the leaf, a terminal node")
        tree = trees.get(root)
        if tree is not None and leaf_id in tree.nodes and tree[leaf_id].terminal:
            raise ValueError(f"tree {root!r}: leaf {leaf_id!r} appears in two rows")
        if tree is None:
            tree = trees[root] = RolloutTree.from_paths([rec])
        else:
            tree.merge_path(rec)
        tree[leaf_id].reward = float(reward)
        where.append((list(trees).index(root), leaf_id))
    out = list(trees.values())
    for tree in out:
        tree.compute_targets()
    return out, where


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
