"""Advantage estimators as pure functions of a rollout tree: node id -> advantage, each turn node once.

A turn node shared by several leaves is trained once, so every estimator first defines a per-leaf (or
per-node) signal and gives a shared node the leaf-count-weighted mean of the signals below it. On a tree of
bare rollouts only (chains) every estimator reduces to plain per-trajectory advantages.

- grpo: r - mean(r over the prompt's leaves), optionally / std (flat GRPO; Dr.GRPO when scale="none").
- tree_grpo (Ji et al.): prompt-group term plus a subtree term: the leaf's reward against the leaves below
  its deepest branching ancestor, each term normalised by its own group's std when scale="std".
- treepo (Li et al.): average over depths d of (r - mean of the leaves sharing the leaf's prefix at depth d).
- trace: a node's V^ minus the mean V^ of its siblings under the same parent (the anchor), only where the
  anchor branched, plus a root term V^(node) - V^(root). Under scale="std" both terms are divided by the
  std of the prompt's leaf rewards, one scale per tree so that deep contrasts are not inflated by their
  (small, noisy) group std.

Estimators are registered by name in ADVANTAGES.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .tree import ROOT, RolloutTree

EPS = 1e-6
SCALES = ("none", "std")


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")


def _prepared(tree: RolloutTree) -> RolloutTree:
    if tree.root.leaves == 0 and tree.root.children:
        tree.compute_targets()
    return tree


def _leaf_ids_below(tree: RolloutTree) -> dict[str, list[str]]:
    below: dict[str, list[str]] = {nid: [] for nid in tree.nodes}
    for leaf in tree.leaves():
        for node in tree.path(leaf.node_id):
            below[node.node_id].append(leaf.node_id)
    return below


def _spread_to_nodes(tree: RolloutTree, leaf_adv: dict[str, float]) -> dict[str, float]:
    """Each turn node gets the mean advantage of the leaves below it (every leaf counts once)."""
    below = _leaf_ids_below(tree)
    return {n.node_id: float(np.mean([leaf_adv[l] for l in below[n.node_id]])) for n in tree.turns()}


def _centre(values: np.ndarray, scale: str) -> np.ndarray:
    out = values - values.mean()
    return out / (values.std() + EPS) if scale == "std" else out


def grpo(tree: RolloutTree, scale: str = "std") -> dict[str, float]:
    _check_scale(scale)
    leaves = _prepared(tree).leaves()
    if not leaves:
        return {}
    adv = _centre(np.array([l.reward for l in leaves], dtype=float), scale)
    return _spread_to_nodes(tree, {l.node_id: a for l, a in zip(leaves, adv)})


def tree_grpo(tree: RolloutTree, scale: str = "std") -> dict[str, float]:
    _check_scale(scale)
    leaves = _prepared(tree).leaves()
    if not leaves:
        return {}
    below = _leaf_ids_below(tree)
    reward = {l.node_id: float(l.reward) for l in leaves}
    root_adv = dict(zip(reward, _centre(np.array(list(reward.values())), scale)))
    leaf_adv = {}
    for leaf in leaves:
        # the deepest non-root ancestor with two or more children defines the leaf's subtree group
        group = next((n for n in reversed(tree.path(leaf.node_id)[1:-1]) if len(n.children) >= 2), None)
        sub = 0.0
        if group is not None:
            ids = below[group.node_id]
            vals = _centre(np.array([reward[i] for i in ids]), scale)
            sub = float(vals[ids.index(leaf.node_id)])
        leaf_adv[leaf.node_id] = root_adv[leaf.node_id] + sub
    return _spread_to_nodes(tree, leaf_adv)


def treepo(tree: RolloutTree, scale: str = "none") -> dict[str, float]:
    _check_scale(scale)
    leaves = _prepared(tree).leaves()
    if not leaves:
        return {}
    leaf_adv = {}
    for leaf in leaves:
        terms = [leaf.reward - node.target for node in tree.path(leaf.node_id)[:-1]]
        leaf_adv[leaf.node_id] = float(np.mean(terms))
    if scale == "std":
        std = float(np.std(tree.rewards())) + EPS
        leaf_adv = {k: v / std for k, v in leaf_adv.items()}
    return _spread_to_nodes(tree, leaf_adv)


def trace(tree: RolloutTree, scale: str = "std", root_weight: float = 1.0, local_weight: float = 1.0) -> dict[str, float]:
    _check_scale(scale)
    _prepared(tree)
    if not tree.root.children:
        return {}
    root_v = tree.root.target
    denom = float(np.std(tree.rewards())) + EPS if scale == "std" else 1.0
    out = {}
    for node in tree.turns():
        parent = tree[node.parent_id]
        adv = root_weight * (node.target - root_v)
        if parent.origin != ROOT and len(parent.children) >= 2:
            sib = np.mean([c.target for c in tree.children(parent.node_id)])
            adv += local_weight * (node.target - sib)
        out[node.node_id] = float(adv / denom)
    return out


ADVANTAGES: dict[str, Callable[..., dict[str, float]]] = {
    "grpo": grpo,
    "tree_grpo": tree_grpo,
    "treepo": treepo,
    "trace": trace,
}


def compute_advantages(name: str, tree: RolloutTree, **kwargs) -> dict[str, float]:
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; choose from {sorted(ADVANTAGES)}")
    return ADVANTAGES[name](tree, **kwargs)


def batch_advantages(name: str, trees: list[RolloutTree], **kwargs) -> list[dict[str, float]]:
    """Advantages of every tree of one step, in order: what a policy update consumes. Estimators that
    normalise across the whole batch do it here; the others are per tree."""
    return [compute_advantages(name, tree, **kwargs) for tree in trees]
