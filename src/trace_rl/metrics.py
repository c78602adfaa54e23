"""Step metrics over the trees of one step: effective ratio, contrast groups, flips, budget spent."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tree import BARE, BRANCH, RolloutTree


@dataclass
class StepBudget:
    """What one step spent: rollouts (bare + continuations), turns generated and the prefix share."""

    bare_rollouts: int = 0
    continuations: int = 0
    turns: int = 0
    prefix_turns: int = 0

    @property
    def rollouts(self) -> int:
        return self.bare_rollouts + self.continuations


def tree_budget(trees: list[RolloutTree]) -> StepBudget:
    b = StepBudget()
    for tree in trees:
        for node in tree.turns():
            b.turns += 1
            if node.origin == BRANCH:
                b.prefix_turns += 1
                parent = tree[node.parent_id]
                b.continuations += parent.origin != BRANCH  # first node of a continuation
            elif node.origin == BARE and node.depth == 1:
                b.bare_rollouts += 1
    return b


def effective_ratio(trees: list[RolloutTree]) -> float:
    """Share of active prompts (trees with at least one rollout) whose leaves hold a success and a failure."""
    active = [t for t in trees if t.root.children]
    return float(np.mean([t.is_mixed() for t in active])) if active else 0.0


def contrast_groups(trees: list[RolloutTree]) -> int:
    """Sibling groups (children of one node, root included) whose subtrees reach different mean outcomes."""
    count = 0
    for tree in trees:
        for node in tree.nodes.values():
            kids = tree.children(node.node_id)
            if len(kids) >= 2 and len({round(k.target, 12) for k in kids if k.target is not None}) >= 2:
                count += 1
    return count


def continuation_flips(trees: list[RolloutTree]) -> tuple[int, int]:
    """(continuations that ended unlike the bare rollout they branched from, all continuations).

    Stage 2 maximises the expected number of anchors with a flipped continuation, so flips per continuation
    is its yield: how well q ranked the prefixes, against random branch points at the same budget.
    """
    flips = total = 0
    for tree in trees:
        for node, r in tree.anchors():
            for x in tree.started_rewards(node.node_id):
                total += 1
                flips += (x > 0.5) != (r > 0.5)
    return flips, total


def mean_reward(trees: list[RolloutTree]) -> float:
    r = [x for t in trees for x in t.rewards()]
    return float(np.mean(r)) if r else 0.0
