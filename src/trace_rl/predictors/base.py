"""The predictor protocol: one model V~ that scores prompt roots and turn-level prefixes in [0, 1].

A prefix is a (tree, node id) pair: the tree carries the prompt and the path of turns up to the node, so a
text critic can serialise it and a feature model can read each node's `info`. Roots are scored as
(tree, root id) before any rollout exists.

Training examples come from finished trees: every root plus every anchor that continuations started from,
sub-sampled so that prefixes make up about `prefix_share` of a batch (the paper trains with about 6%
prefixes). The target is the mean reward of the rollouts that started at the node (the bare rollouts of a
root, the continuations of an anchor), not the leaf mean V^ that the advantages use: stage 2 adds leaves
below the prefixes whose outcome looked surprising, so V^ is pulled towards those outcomes (a root with
two successes and one failure whose failing prefix took three continuations, all failing, has V^ = 2/6
where its rollouts say 2/3), and a predictor fitted to V^ learns the allocator's choices back.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from ..trace_config import check_prefix_share
from ..tree import RolloutTree

Prefix = tuple[RolloutTree, str]


class Predictor(Protocol):
    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        """Success probabilities in [0, 1], one per prefix."""

    def update(self, prefixes: Sequence[Prefix], targets: np.ndarray) -> float:
        """One training round on (prefix, target) examples; returns the mean loss on them."""

    def save(self, path) -> None:
        """Write what a checkpoint needs to resume the predictor."""

    def load(self, path) -> None:
        """Restore what `save` wrote."""


def training_examples(
    trees: Sequence[RolloutTree], prefix_share: float, rng: np.random.Generator
) -> tuple[list[Prefix], np.ndarray]:
    """Roots and branched anchors with unbiased targets (see the module docstring), prefixes kept at about
    `prefix_share` of the examples."""
    check_prefix_share(prefix_share)
    roots, inner = [], []  # (prefix, target)
    for tree in trees:
        for node in tree.nodes.values():
            started = tree.started_rewards(node.node_id) if node.children else []
            if started:
                (roots if node.node_id == tree.root_id else inner).append(((tree, node.node_id), np.mean(started)))
    want = int(round(prefix_share * len(roots) / (1.0 - prefix_share))) if prefix_share else 0
    if want < len(inner):
        inner = [inner[i] for i in sorted(rng.choice(len(inner), size=want, replace=False))]
    examples = roots + inner
    return [e for e, _ in examples], np.array([y for _, y in examples], dtype=np.float64)
