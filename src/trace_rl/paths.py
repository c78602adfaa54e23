"""Rollout trees to training rows: root-to-leaf paths, one node validation, and how a shared node is weighted.

Every trainer of this package reads a tree through this module: the trainer's packing (`train.packing`: tree
rows and flat per-path rows), the verl and TRL rows (`integrations.rows`) and the testbed's update
(`turn_rows`). A turn node shared by k root-to-leaf paths appears on k paths; `weighting` says what it counts:

- "first" (the trainer's default): the node counts once, on the first path (depth-first) that holds it, with
  weight 1; its other copies are context only (weight 0).
- "split": the node counts once, spread as weight 1/k on each of its k copies (what a trainer that cannot
  skip copies needs: verl and TRL take every row whole).
- "leaf": the node counts once per path through it, weight 1 on every copy, k in total: what flat
  per-trajectory rows (GRPO's) give a shared prefix. With an advantage that is the mean over the node's leaves
  (TRACE's V^(node) - V^(root)), "leaf" trains the prefix with the sum of its leaves' signals, "first" and
  "split" with their mean.

Every copy of a node sees the same context (its path from the root), so its copies' log-probs are equal and
"first" and "split" give the same gradient under a loss summed over tokens; a layout that holds a node once
(the tree layout, `turn_rows`) carries the node's total weight (`node_weights`): 1, 1 and k. They differ under
a loss normalised per row (a copy's share depends on its row's length).

Limits: k counts the paths listed (`tree_paths` with `keep` drops subtrees that hold nothing to train, whose
paths then do not count), not the leaves of the whole tree.
"""

from __future__ import annotations

from typing import Callable

from .tree import RolloutTree, TurnNode

WEIGHTINGS = ("first", "split", "leaf")


def check_weighting(weighting: str) -> None:
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")


def check_node(node: TurnNode, need_logprobs: bool = False) -> None:
    """The one validation of a node's token fields: one mask entry per token, and one sampling log-prob per
    policy token (or none at all, unless `need_logprobs`: a trainer's ratio needs them)."""
    if len(node.token_ids) != len(node.loss_mask):
        raise ValueError(
            f"node {node.node_id!r}: {len(node.token_ids)} token_ids but {len(node.loss_mask)} mask entries"
        )
    policy = sum(node.loss_mask)
    if (node.logprobs or need_logprobs) and len(node.logprobs) != policy:
        raise ValueError(f"node {node.node_id!r}: {policy} policy tokens but {len(node.logprobs)} log-probs")


def tree_paths(
    tree: RolloutTree, keep: Callable[[TurnNode], bool] | None = None, tokens: bool = True
) -> list[list[TurnNode]]:
    """Root-to-leaf paths in depth-first order (children in the order they were added), root included.

    With `keep`, a subtree holding no node for which keep(node) is true is left out, so a path ends at the
    last node with something kept at or below it; a tree with nothing kept has no path. With `tokens` (for a
    trainer that reads them) every node is validated (`check_node`); the testbed's turns carry no tokens."""
    wanted: dict[str, bool] = {}
    for node in sorted(tree.nodes.values(), key=lambda n: -n.depth):
        if tokens:
            check_node(node)
        wanted[node.node_id] = keep is None or keep(node) or any(wanted[c] for c in node.children)
    out: list[list[TurnNode]] = []

    def walk(node: TurnNode, path: list[TurnNode]) -> None:
        path = path + [node]
        kids = [c for c in node.children if wanted[c]]
        if not kids:
            out.append(path)
        for c in kids:
            walk(tree[c], path)

    if wanted[tree.root_id] and (keep is not None or tree.root.children):
        walk(tree.root, [])
    return out


def path_counts(paths: list[list[TurnNode]]) -> dict[str, int]:
    """k per node id: how many of `paths` hold the node."""
    k: dict[str, int] = {}
    for path in paths:
        for node in path:
            k[node.node_id] = k.get(node.node_id, 0) + 1
    return k


def copy_weights(paths: list[list[TurnNode]], weighting: str = "first") -> list[list[float]]:
    """Per path, the weight of each node's copy on it (same shape as `paths`), by the module's `weighting`."""
    check_weighting(weighting)
    k = path_counts(paths)
    seen: set[str] = set()
    out = []
    for path in paths:
        row = []
        for node in path:
            if weighting == "first":
                row.append(0.0 if node.node_id in seen else 1.0)
                seen.add(node.node_id)
            else:
                row.append(1.0 / k[node.node_id] if weighting == "split" else 1.0)
        out.append(row)
    return out


def node_weights(paths: list[list[TurnNode]], weighting: str = "first") -> dict[str, float]:
    """Per node id, the sum of its copies' weights: what a layout holding each node once multiplies its
    advantage by (1 under "first" and "split", k under "leaf")."""
    check_weighting(weighting)
    k = path_counts(paths)
    return {nid: float(n) if weighting == "leaf" else 1.0 for nid, n in k.items()}


def turn_rows(tree: RolloutTree, advantages: dict[str, float], weighting: str = "first") -> list[dict]:
    """Each turn node that has an advantage once: its tokens, mask, log-probs, advantage, depth, info and
    `weight` (its `node_weights` over all the tree's paths; 1 unless weighting="leaf"). The rows are passed on
    as they are (the testbed's turns have no tokens), so nothing here is validated."""
    weights = node_weights(tree_paths(tree, tokens=False), weighting)
    rows = []
    for node in tree.turns():
        if node.node_id not in advantages:
            continue
        rows.append(
            {
                "node_id": node.node_id,
                "depth": node.depth,
                "token_ids": node.token_ids,
                "loss_mask": node.loss_mask,
                "logprobs": node.logprobs,
                "advantage": float(advantages[node.node_id]),
                "weight": weights.get(node.node_id, 1.0),
                "info": node.info,
            }
        )
    return rows
