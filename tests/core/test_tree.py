import pytest

from trace_rl.paths import turn_rows
from trace_rl.tree import BRANCH, RolloutTree, load_trees, save_trees


def test_ids_targets_and_leaf_counts(small_tree):
    tree = small_tree
    assert sorted(tree.nodes) == ["0", "0.0", "0.0.0", "0.1", "0.1.0", "0.1.1"]
    assert all("_" not in nid for nid in tree.nodes)
    tree.compute_targets()
    assert tree["0.1"].target == pytest.approx(0.5) and tree["0.1"].leaves == 2
    assert tree["0"].target == pytest.approx(2 / 3) and tree["0"].leaves == 3
    assert tree["0.0.0"].target == 1.0 and tree["0.0.0"].leaves == 1
    assert tree["0.1.1"].depth == 2 and tree["0.1.1"].parent_id == "0.1"


def test_targets_are_leaf_weighted_not_child_averaged():
    tree = RolloutTree(5)
    a = tree.add_turn("5")
    tree.add_turn(a.node_id, terminal=True, reward=1.0)
    tree.add_turn(a.node_id, terminal=True, reward=1.0)
    tree.add_turn(a.node_id, terminal=True, reward=1.0)
    tree.add_turn("5", terminal=True, reward=0.0)
    tree.compute_targets()
    assert tree.root.target == pytest.approx(3 / 4)  # child mean would say 1/2


def test_started_rewards_count_only_rollouts_started_at_the_node():
    tree = RolloutTree(0)
    a = tree.add_turn("0")  # bare rollout 1: 0.0 -> 0.0.0 (success)
    tree.add_turn(a.node_id, terminal=True, reward=1.0)
    b = tree.add_turn("0")  # bare rollout 2: 0.1 -> 0.1.0 -> 0.1.0.0 (failure)
    c = tree.add_turn(b.node_id)
    tree.add_turn(c.node_id, terminal=True, reward=0.0)
    d = tree.add_turn(b.node_id, origin=BRANCH)  # a continuation from 0.1: two turns, success
    tree.add_turn(d.node_id, terminal=True, reward=1.0, origin=BRANCH)
    unfinished = tree.add_turn(b.node_id, origin=BRANCH)  # a continuation that never ended
    assert unfinished.node_id == "0.1.2"
    assert sorted(tree.started_rewards("0")) == [0.0, 1.0]
    assert tree.started_rewards("0.1") == [1.0]
    assert tree.started_rewards("0.1.0") == [] and tree.started_rewards("0.0") == []


def test_mixed_and_anchors(small_tree):
    assert small_tree.is_mixed()
    anchors = small_tree.anchors()
    assert [(n.node_id, r) for n, r in anchors] == [("0.0", 1.0), ("0.1", 0.0)]
    pure = RolloutTree(1)
    pure.add_turn("1", terminal=True, reward=0.0)
    pure.add_turn("1", terminal=True, reward=0.0)
    assert not pure.is_mixed() and pure.anchors() == []


def test_jsonl_round_trip(tmp_path, small_tree):
    small_tree.compute_targets()
    path = tmp_path / "trees.jsonl"
    save_trees(path, [small_tree, small_tree])
    back = load_trees(path)
    assert len(back) == 2
    assert back[0].to_dict() == small_tree.to_dict()


def test_load_rejects_garbage_with_location(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"root_id": "1", "nodes": []}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_trees(path)


def test_bad_ids_and_turns_after_terminal(small_tree):
    with pytest.raises(ValueError, match="root_id"):
        RolloutTree("a_b")
    with pytest.raises(ValueError, match="terminal"):
        small_tree.add_turn("0.0.0")
    with pytest.raises(KeyError):
        small_tree.add_turn("9.9")
    unfinished = RolloutTree(2)
    unfinished.add_turn("2")
    with pytest.raises(ValueError, match="no reward"):
        unfinished.compute_targets()


def test_turn_rows_keep_tokens_and_masks(small_tree):
    rows = turn_rows(small_tree, {"0.0": 0.5, "0.1.1": -1.0})
    assert [r["node_id"] for r in rows] == ["0.0", "0.1.1"]
    assert rows[0]["token_ids"] == [1, 2] and rows[0]["loss_mask"] == [1, 1] and rows[0]["advantage"] == 0.5
