import numpy as np
import pytest

from trace_rl.advantages import batch_advantages
from trace_rl.integrations.rows import batch_rows, node_credit, pad_rows, tree_rows
from trace_rl.paths import turn_rows


def test_one_row_per_leaf_with_the_whole_path(trees):
    rows = batch_rows(trees, "trace")
    assert len(rows) == sum(len(t.leaves()) for t in trees)
    for row in rows:
        tree = trees[row.tree_index]
        path = tree.path(row.leaf_id)[1:]
        assert row.prompt_ids == tree.root.token_ids
        assert row.completion_ids == [t for n in path for t in n.token_ids]
        assert row.loss_mask == [m for n in path for m in n.loss_mask]
        assert row.turn_lengths == [len(n.token_ids) for n in path]
        assert row.reward == tree[row.leaf_id].reward
        n = len(row.completion_ids)
        assert len(row.node_ids) == len(row.advantages) == len(row.weights) == len(row.logprobs) == n
        # log-probs sit on the policy tokens in order, 0 on observation tokens
        policy_lp = [lp for lp, m in zip(row.logprobs, row.loss_mask) if m]
        assert policy_lp == [x for node in path for x in node.logprobs]
        assert all(lp == 0.0 for lp, m in zip(row.logprobs, row.loss_mask) if not m)


@pytest.mark.parametrize("estimator", ["trace", "grpo", "tree_grpo", "treepo"])
def test_split_weights_train_every_node_once_as_the_core_does(trees, estimator):
    """Summed over a tree's rows, each node's policy tokens get exactly its core advantage once (turn_rows)."""
    rows = batch_rows(trees, estimator, weighting="split")
    credit = node_credit(rows)
    advs = batch_advantages(estimator, trees)
    for i, (tree, adv) in enumerate(zip(trees, advs)):
        for r in turn_rows(tree, adv):
            assert credit[(i, r["node_id"])] == pytest.approx(r["advantage"] * sum(r["loss_mask"]), abs=1e-12)


def test_unsplit_weights_count_a_shared_node_once_per_leaf(trees):
    rows = batch_rows(trees, "trace", weighting="leaf")
    credit = node_credit(rows)
    adv = batch_advantages("trace", trees)
    shared = [(i, n) for i, t in enumerate(trees) for n in t.turns() if n.leaves > 1 and sum(n.loss_mask)]
    assert shared, "the fixture must hold shared prefixes"
    for i, node in shared:
        assert credit[(i, node.node_id)] == pytest.approx(adv[i][node.node_id] * sum(node.loss_mask) * node.leaves)


def test_weights_follow_the_leaf_count_and_advantages_the_node(trees):
    tree = trees[0]
    adv = batch_advantages("trace", [tree])[0]
    for row in tree_rows(tree, adv):
        for nid, a, w in zip(row.node_ids, row.advantages, row.weights):
            assert w == pytest.approx(1.0 / tree[nid].leaves)
            assert a == adv[nid]
        assert row.weighted_advantages == pytest.approx([a * w for a, w in zip(row.advantages, row.weights)])


def test_missing_logprobs_give_none_and_bad_inputs_raise(trees):
    tree = trees[1]
    adv = batch_advantages("trace", [tree])[0]
    first = tree.children(tree.root_id)[0]
    saved = first.logprobs
    first.logprobs = []
    assert all(r.logprobs is None for r in tree_rows(tree, adv) if first.node_id in r.node_ids)
    first.logprobs = saved[:-1] + saved + [0.0]  # wrong count
    with pytest.raises(ValueError, match="log-probs"):
        tree_rows(tree, adv)
    first.logprobs = saved
    with pytest.raises(ValueError, match="weighting"):
        tree_rows(tree, adv, weighting="half")
    with pytest.raises(KeyError, match="no advantage"):
        tree_rows(tree, {})


def test_pad_rows_pads_and_truncates():
    out = pad_rows([[1.0, 2.0], [3.0], []], width=None)
    assert out.shape == (3, 2) and np.array_equal(out, [[1, 2], [3, 0], [0, 0]])
    assert np.array_equal(pad_rows([[1.0, 2.0, 3.0]], width=2), [[1, 2]])


@pytest.mark.parametrize("weighting,copies", [("first", [1.0, 0.0]), ("split", [0.5, 0.5]), ("leaf", [1.0, 1.0])])
def test_each_weighting_on_a_hand_built_tree(weighting, copies):
    from trace_rl.tree import RolloutTree

    tree = RolloutTree(0)
    tree.root.token_ids, tree.root.loss_mask = [5, 6], [0, 0]
    a = tree.add_turn("0", token_ids=[7, 8], loss_mask=[1, 0], logprobs=[-1.0])
    tree.add_turn(a.node_id, token_ids=[9], loss_mask=[1], logprobs=[-1.0], terminal=True, reward=1.0)
    tree.add_turn(a.node_id, token_ids=[10], loss_mask=[1], logprobs=[-1.0], terminal=True, reward=0.0)
    rows = tree_rows(tree, {"0.0": 0.5, "0.0.0": 1.0, "0.0.1": -1.0}, weighting)
    assert [r.leaf_id for r in rows] == ["0.0.0", "0.0.1"]  # the order the leaves grew
    assert [r.weights for r in rows] == [[copies[0]] * 2 + [1.0], [copies[1]] * 2 + [1.0]]
    assert node_credit(rows)[(0, "0.0")] == pytest.approx(0.5 * sum(copies))
