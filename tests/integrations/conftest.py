import numpy as np
import pytest

from trace_rl.tree import BRANCH, RolloutTree


def random_tree(
    rng: np.random.Generator, root_id: str = "t0", bare: int = 3, depth: int = 3, branches: int = 3
) -> RolloutTree:
    """Bare chains of `depth` turns, then continuations grown from random non-terminal turns; every turn has a
    few tokens (sometimes a template token, then policy tokens, then an observation) with log-probs of its
    policy tokens, every leaf a 0/1 reward. Plain ints and floats, as a tree serialises to JSON."""

    def turn(tree, parent, origin, last):
        n_tpl, n_pol, n_obs = int(rng.integers(0, 2)), int(rng.integers(1, 4)), int(rng.integers(0, 3))
        return tree.add_turn(
            parent,
            origin=origin,
            action=f"a{rng.integers(9)}",
            observation=f"o{rng.integers(9)}",
            token_ids=[int(t) for t in rng.integers(5, 50, n_tpl + n_pol + n_obs)],
            loss_mask=[0] * n_tpl + [1] * n_pol + [0] * n_obs,
            logprobs=[float(-x) for x in rng.random(n_pol)],
            predicted=float(rng.random()),
            terminal=last,
            reward=float(rng.integers(0, 2)) if last else None,
        )

    tree = RolloutTree(root_id, prompt={"question": "q"})
    tree.root.token_ids, tree.root.loss_mask, tree.root.predicted = [1, 2, 3], [0, 0, 0], 0.5
    inner = []
    for _ in range(bare):
        parent = tree.root_id
        for d in range(depth):
            node = turn(tree, parent, "bare", d == depth - 1)
            if not node.terminal:
                inner.append(node)
            parent = node.node_id
    for _ in range(branches):
        anchor = inner[int(rng.integers(len(inner)))]
        parent = anchor.node_id
        for d in range(anchor.depth, depth):
            node = turn(tree, parent, BRANCH, d == depth - 1)
            parent = node.node_id
    return tree


@pytest.fixture
def trees() -> list[RolloutTree]:
    rng = np.random.default_rng(7)
    return [random_tree(rng, f"t{i}", bare=int(rng.integers(1, 4)), branches=int(rng.integers(0, 4))) for i in range(5)]
