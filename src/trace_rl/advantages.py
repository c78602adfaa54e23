"""Advantage estimators as pure functions of a rollout tree: node id -> advantage, each turn node once.

A turn node shared by several leaves is trained once, so every estimator first defines a per-leaf (or
per-node) signal and gives a shared node the leaf-count-weighted mean of the signals below it. Targets are
recomputed on every call, so advantages always describe the tree as it is (a tree may grow after a first call).

- grpo: r - mean(r over the prompt's leaves), optionally / std (flat GRPO; Dr.GRPO when scale="none").
- tree_grpo (Ji et al., Tree-GRPO, as its code computes it): an inter-tree term, the leaf's reward against all
  leaves of the prompt, plus an intra-tree term against all leaves of its tree (one bare rollout with every
  continuation branched below it); each term is (r - mean) / (unbiased std + 1e-6) when scale="std", and a
  group of one gets r (upstream's mean 0, std 1). So a lone bare rollout gets (r - mean) / std + r.
- tree_grpo_nested: trace-rl's earlier variant: the intra term groups the leaves below the leaf's deepest
  branching ancestor (nested, overlapping groups), population std, 0 for a leaf with no such ancestor.
- treepo (Li et al., TreePO, as its code computes it): the mean, over the leaf's prefixes, of r - (mean of
  the leaves below that prefix), where the prompt itself always counts and a deeper prefix counts only when
  another leaf shares it; then `batch_advantages` whitens all leaves of a step together (token-weighted
  mean, unbiased variance). `compute_advantages` on one tree returns the unwhitened values.
- trace: a node's V^ minus the mean V^ of its siblings under the same parent (the anchor), only where the
  anchor branched, plus a root term V^(node) - V^(root). Under scale="std" both terms are divided by the
  std of the prompt's leaf rewards, one scale per tree so that deep contrasts are not inflated by their
  (small, noisy) group std.

On a tree of bare rollouts only (chains) grpo, tree_grpo_nested, treepo (before whitening) and trace reduce
to plain per-trajectory advantages; tree_grpo adds r, its one-member intra-tree group.

Estimators are registered by name in `registry.ADVANTAGES` (re-exported here); one that normalises across a step
names its batch function (`Estimator.batch`).
"""

from __future__ import annotations

import numpy as np

from .registry import ADVANTAGES, call
from .tree import ROOT, RolloutTree

EPS = 1e-6
SCALES = ("none", "std")


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")


def _prepared(tree: RolloutTree) -> RolloutTree:
    # Always recompute: a cached V^ goes stale (or is missing on new nodes) once the tree grows, and the
    # cost is one pass over the nodes.
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


def _group_term(values: np.ndarray, scale: str) -> np.ndarray:
    """Tree-GRPO's per-group normalisation (verl's GRPO outcome advantage): a group of one has mean 0 and
    std 1, larger groups the unbiased (n - 1) std; eps 1e-6 on the std as upstream."""
    if values.size == 1:
        return values / (1.0 + EPS) if scale == "std" else values.copy()
    out = values - values.mean()
    return out / (values.std(ddof=1) + EPS) if scale == "std" else out


def tree_grpo(tree: RolloutTree, scale: str = "std") -> dict[str, float]:
    _check_scale(scale)
    leaves = _prepared(tree).leaves()
    if not leaves:
        return {}
    reward = np.array([l.reward for l in leaves], dtype=float)
    adv = _group_term(reward, scale)  # inter-tree: every leaf of the prompt
    tree_of = np.array([l.node_id.split(".")[1] for l in leaves])  # the bare rollout a leaf descends from
    for t in np.unique(tree_of):
        members = tree_of == t
        adv[members] += _group_term(reward[members], scale)  # intra-tree
    return _spread_to_nodes(tree, {l.node_id: float(a) for l, a in zip(leaves, adv)})


def tree_grpo_nested(tree: RolloutTree, scale: str = "std") -> dict[str, float]:
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


TREEPO_WEIGHTINGS = ("average", "group_size")


def _treepo_leaves(tree: RolloutTree, scale: str, weighting: str) -> dict[str, float]:
    """TreePO's per-leaf advantage before whitening (upstream's `compute_tree_reinforce_plus_plus_baseline_
    outcome_advantage` with remove_no_std_subgroup=False). weighting="average" (its launch script) takes the
    plain mean over the counted prefixes; "group_size" (the function's default) weights each by its size."""
    _check_scale(scale)
    if weighting not in TREEPO_WEIGHTINGS:
        raise ValueError(f"weighting must be one of {TREEPO_WEIGHTINGS}, got {weighting!r}")
    leaves = _prepared(tree).leaves()
    leaf_adv = {}
    for leaf in leaves:
        terms, sizes = [], []
        for depth, node in enumerate(tree.path(leaf.node_id)[:-1]):
            if depth == 0 or node.leaves > 1:  # the prompt group always counts; a prefix only when shared
                # a group of one has mean 0 upstream, so a prompt with a single leaf gets r
                terms.append(leaf.reward - (node.target if node.leaves > 1 else 0.0))
                sizes.append(node.leaves)
        weights = np.ones(len(terms)) if weighting == "average" else np.array(sizes, dtype=float)
        leaf_adv[leaf.node_id] = float(np.dot(terms, weights) / weights.sum())
    if scale == "std" and leaves:
        std = float(np.std(tree.rewards())) + EPS
        leaf_adv = {k: v / std for k, v in leaf_adv.items()}
    return leaf_adv


def treepo(tree: RolloutTree, scale: str = "none", weighting: str = "average") -> dict[str, float]:
    """TreePO on one tree, unwhitened (TreePO whitens across the whole step: use `batch_advantages`).
    scale="std" divides by the tree's reward std, a trace-rl option that upstream does not have."""
    leaf_adv = _treepo_leaves(tree, scale, weighting)
    return _spread_to_nodes(tree, leaf_adv) if leaf_adv else {}


def leaf_tokens(tree: RolloutTree) -> dict[str, float]:
    """Policy tokens of each leaf's whole trajectory (the sum of loss_mask along its path), which is how a
    leaf row weighs in upstream's token-level whitening; 1 per turn when the tree carries no tokens (the
    synthetic testbed)."""
    has_tokens = any(n.loss_mask for n in tree.turns())
    own = {n.node_id: (float(sum(n.loss_mask)) if has_tokens else 1.0) for n in tree.turns()}
    return {l.node_id: sum(own[n.node_id] for n in tree.path(l.node_id)[1:]) for l in tree.leaves()}


def masked_whiten(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """verl's masked_whiten over rows of `weights` tokens each: (x - mean) / sqrt(var + 1e-8), token-weighted
    mean, variance with Bessel's correction over the token count. With at most one token there is no
    variance to estimate (upstream raises) and the centred values are returned."""
    total = float(weights.sum())
    mean = float(np.dot(values, weights)) / (total + 1e-8)
    centred = values - mean
    if total <= 1.0:
        return centred
    var = float(np.dot(centred**2, weights)) / (total + 1e-8) * total / (total - 1.0)
    return centred / np.sqrt(var + 1e-8)


def treepo_batch(trees: list[RolloutTree], scale: str = "none", weighting: str = "average", whiten: bool = True):
    """TreePO for one step: per-tree leaf advantages, whitened together across every leaf of the step."""
    per_tree = [_treepo_leaves(tree, scale, weighting) for tree in trees]
    if whiten:
        ids = [(i, lid) for i, adv in enumerate(per_tree) for lid in adv]
        tokens = [leaf_tokens(tree) for tree in trees]
        if ids:
            vals = np.array([per_tree[i][lid] for i, lid in ids])
            wts = np.array([tokens[i][lid] for i, lid in ids])
            for (i, lid), a in zip(ids, masked_whiten(vals, wts)):
                per_tree[i][lid] = float(a)
    return [_spread_to_nodes(tree, adv) if adv else {} for tree, adv in zip(trees, per_tree)]


def trace(
    tree: RolloutTree, scale: str = "std", root_weight: float = 1.0, local_weight: float = 1.0
) -> dict[str, float]:
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


def compute_advantages(name: str, tree: RolloutTree, **kwargs) -> dict[str, float]:
    """One tree's advantages; for treepo these are before the step-level whitening."""
    return ADVANTAGES.resolve(name)(tree, **kwargs)


def batch_advantages(name: str, trees: list[RolloutTree], **kwargs) -> list[dict[str, float]]:
    """Advantages of every tree of one step, in order: what a policy update consumes. Estimators that
    normalise across the whole batch (`Estimator.batch`: treepo's whitening) do it here; the others are per tree."""
    estimator = ADVANTAGES.resolve(name)
    if estimator.batch is not None:
        return call(estimator.batch, list(trees), **kwargs)
    return [estimator(tree, **kwargs) for tree in trees]
