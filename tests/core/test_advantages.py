import numpy as np
import pytest

from trace_rl.advantages import ADVANTAGES, compute_advantages, grpo, trace
from trace_rl.tree import RolloutTree

# Hand-computed on the conftest tree: leaves 0.0.0 (r=1), 0.1.0 (r=0), 0.1.1 (r=1 branch); V^(root) = 2/3.


def approx(d):
    return {k: pytest.approx(v) for k, v in d.items()}


def test_grpo_by_hand(small_tree):
    got = grpo(small_tree, scale="none")
    assert got == approx({"0.0": 1 / 3, "0.0.0": 1 / 3, "0.1": -1 / 6, "0.1.0": -2 / 3, "0.1.1": 1 / 3})
    std = np.std([1, 0, 1]) + 1e-6
    assert grpo(small_tree, scale="std")["0.1.0"] == pytest.approx(-2 / 3 / std)


def test_tree_grpo_nested_by_hand(small_tree):
    got = compute_advantages("tree_grpo_nested", small_tree, scale="none")
    assert got == approx({"0.0": 1 / 3, "0.0.0": 1 / 3, "0.1": -1 / 6, "0.1.0": -7 / 6, "0.1.1": 5 / 6})


# tree_grpo and treepo as their authors compute them are pinned in test_baselines.py.


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
        for leaf in tree.leaves():
            # Tree-GRPO's intra-tree group of one (a lone bare rollout) adds r, as upstream's code does
            want = leaf.reward - 0.5 + (leaf.reward if name == "tree_grpo" else 0.0)
            assert adv[leaf.node_id] == pytest.approx(want), name
            assert adv[leaf.parent_id] == pytest.approx(want), name


def test_uniform_outcomes_give_zero_advantage():
    tree = RolloutTree(0)
    for _ in range(3):
        tree.add_turn("0", terminal=True, reward=1.0)
    for name in ADVANTAGES:
        # tree_grpo: each lone rollout is a one-member tree group and keeps r / (1 + 1e-6)
        want = 1.0 / (1.0 + 1e-6) if name == "tree_grpo" else 0.0
        assert all(v == pytest.approx(want) for v in compute_advantages(name, tree).values()), name


def test_unknown_estimator_and_scale():
    with pytest.raises(ValueError, match="unknown advantage"):
        compute_advantages("ppo", RolloutTree(0))
    with pytest.raises(ValueError, match="scale"):
        grpo(RolloutTree(0), scale="max")
