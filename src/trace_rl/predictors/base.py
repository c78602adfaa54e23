"""The predictor protocol: one model V~ that scores prompt roots and turn-level prefixes in [0, 1].

A prefix is a (tree, node id) pair: the tree carries the prompt and the path of turns up to the node, so a
text critic can serialise it and a feature model can read each node's `info`. Roots are scored as
(tree, root id) before any rollout exists.

Training examples come from finished trees: every root (target V^ = mean reward of all its leaves) plus
informative internal nodes (two or more leaves below), sub-sampled so that prefixes make up about
`prefix_share` of a batch (the paper trains with about 6% prefixes).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from ..tree import RolloutTree

Prefix = tuple[RolloutTree, str]


class Predictor(Protocol):
    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        """Success probabilities in [0, 1], one per prefix."""

    def update(self, prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> float:
        """One training round on (prefix, target, weight) examples; returns the weighted loss."""

    def save(self, path) -> None:
        """Write what a checkpoint needs to resume the predictor."""

    def load(self, path) -> None:
        """Restore what `save` wrote."""


def training_examples(
    trees: Sequence[RolloutTree], prefix_share: float, rng: np.random.Generator
) -> tuple[list[Prefix], np.ndarray]:
    """Roots plus informative internal nodes, prefixes kept at about `prefix_share` of the examples."""
    if not 0.0 <= prefix_share < 1.0:
        raise ValueError(f"prefix_share must be in [0, 1), got {prefix_share}")
    roots, inner = [], []
    for tree in trees:
        if not tree.root.children:
            continue
        if tree.root.leaves == 0:
            tree.compute_targets()
        roots.append((tree, tree.root_id))
        inner.extend((tree, n.node_id) for n in tree.turns() if n.children and n.leaves >= 2)
    want = int(round(prefix_share * len(roots) / (1.0 - prefix_share))) if prefix_share else 0
    if want < len(inner):
        inner = [inner[i] for i in sorted(rng.choice(len(inner), size=want, replace=False))]
    examples = roots + inner
    targets = np.array([t[nid].target for t, nid in examples], dtype=np.float64)
    return examples, targets
