import numpy as np
import pytest

from trace_rl.advantages import ADVANTAGES, compute_advantages, grpo, trace, tree_grpo, treepo
from trace_rl.tree import RolloutTree

# Hand-computed on the conftest tree: leaves 0.0.0 (r=1), 0.1.0 (r=0), 0.1.1 (r=1 branch); V^(root) = 2/3.


def approx(d):
    return {k: pytest.approx(v) for k, v in d.items()}


def test_grpo_by_hand(small_tree):
    got = grpo(small_tree, scale="none")
    assert got == approx({"0.0": 1 / 3, "0.0.0": 1 / 3, "0.1": -1 / 6, "0.1.0": -2 / 3, "0.1.1": 1 / 3})
    std = np.std([1, 0, 1]) + 1e-6
    assert grpo(small_tree, scale="std")["0.1.0"] == pytest.approx(-2 / 3 / std)


def test_tree_grpo_by_hand(small_tree):
    got = tree_grpo(small_tree, scale="none")
    assert got == approx({"0.0": 1 / 3, "0.0.0": 1 / 3, "0.1": -1 / 6, "0.1.0": -7 / 6, "0.1.1": 5 / 6})


def test_treepo_by_hand(small_tree):
    got = treepo(small_tree, scale="none")
    assert got == approx({"0.0": 1 / 6, "0.0.0": 1 / 6, "0.1": -1 / 12, "0.1.0": -7 / 12, "0.1.1": 5 / 12})


def test_trace_by_hand(small_tree):
    got = trace(small_tree, scale="none")
    assert got == approx({"0.0": 1 / 3, "0.0.0": 1 / 3, "0.1": -1 / 6, "0.1.0": -7 / 6, "0.1.1": 5 / 6})
    only_local = trace(small_tree, scale="none", root_weight=0.0)
    assert only_local == approx({"0.0": 0, "0.0.0": 0, "0.1": 0, "0.1.0": -0.5, "0.1.1": 0.5})
    scaled = trace(small_tree, scale="std")
    assert scaled["0.1.1"] == pytest.approx((5 / 6) / (np.std([1, 0, 1]) + 1e-6))


def test_all_reduce_to_flat_advantages_on_chains():
    tree = RolloutTree(0)
    for r in (1.0, 0.0, 0.0, 1.0):
        a = tree.add_turn("0")
        tree.add_turn(a.node_id, terminal=True, reward=r)
    for name in ADVANTAGES:
        adv = compute_advantages(name, tree, scale="none")
        # treepo averages over depths, and below the root a chain's own prefix term is r - r = 0
        factor = 0.5 if name == "treepo" else 1.0
        for leaf in tree.leaves():
            want = factor * (leaf.reward - 0.5)
            assert adv[leaf.node_id] == pytest.approx(want)
            assert adv[leaf.parent_id] == pytest.approx(want)


def test_uniform_outcomes_give_zero_advantage():
    tree = RolloutTree(0)
    for _ in range(3):
        tree.add_turn("0", terminal=True, reward=1.0)
    for name in ADVANTAGES:
        assert all(v == pytest.approx(0.0) for v in compute_advantages(name, tree).values())


def test_unknown_estimator_and_scale():
    with pytest.raises(ValueError, match="unknown advantage"):
        compute_advantages("ppo", RolloutTree(0))
    with pytest.raises(ValueError, match="scale"):
        grpo(RolloutTree(0), scale="max")
