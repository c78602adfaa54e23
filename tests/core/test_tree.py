import json
import pickle

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


def test_anchor_costs_price_the_rest_of_each_rollout():
    tree = RolloutTree(0)
    a = tree.add_turn("0", logprobs=[-0.1] * 5)  # rollout 1: 5, 3, 2 tokens
    b = tree.add_turn(a.node_id, logprobs=[-0.1] * 3)
    tree.add_turn(b.node_id, logprobs=[-0.1] * 2, terminal=True, reward=1.0)
    c = tree.add_turn("0", logprobs=[-0.1] * 4)  # rollout 2: 4 tokens, then a turn with none (at least 1)
    tree.add_turn(c.node_id, terminal=True, reward=0.0)
    tree.add_turn("0", logprobs=[-0.1] * 9)  # unfinished: not an anchor's rollout, not in the mean
    tree.add_turn(b.node_id, logprobs=[-0.1] * 7, origin=BRANCH, terminal=True, reward=0.0)  # a branch: not bare
    costs, whole = tree.anchor_costs()
    assert [n.node_id for n, _ in tree.anchors()] == ["0.0", "0.0.0", "0.1"]
    assert costs == [5, 2, 1] and whole == pytest.approx((10 + 4) / 2)
    turns = RolloutTree(1)  # no turn records tokens (the testbed): costs are turns
    x = turns.add_turn("1")
    y = turns.add_turn(x.node_id)
    turns.add_turn(y.node_id, terminal=True, reward=1.0)
    assert turns.anchor_costs() == ([2, 1], 3.0)
    assert RolloutTree(2).anchor_costs() == ([], 0.0)


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


def _json(data) -> str:
    return json.dumps(data, sort_keys=True)


def test_path_dict_is_to_dict_restricted_to_the_path(small_tree):
    small_tree.compute_targets()
    whole = {n["node_id"]: n for n in small_tree.to_dict()["nodes"]}
    path = small_tree.path_dict("0.1.1")
    assert sorted(path) == sorted(small_tree.to_dict()) and path["root_id"] == "0" and path["prompt"] == "p0"
    assert path["nodes"] == [whole["0"], whole["0.1"], whole["0.1.1"]]  # children still name every child


def test_paths_of_every_leaf_merge_back_into_the_tree_byte_for_byte(small_tree):
    small_tree.compute_targets()
    small_tree["0.0"].logprobs, small_tree["0.1"].info = [-0.5, -0.25], {"session": 3}
    paths = [json.loads(json.dumps(small_tree.path_dict(leaf.node_id))) for leaf in small_tree.leaves()]
    back = RolloutTree.from_paths(paths)
    assert json.dumps(back.to_dict()) == json.dumps(small_tree.to_dict())
    # in another order the same nodes come back; only the order they are listed in follows the paths
    shuffled = RolloutTree.from_paths(paths[::-1])
    assert list(shuffled.nodes) != list(small_tree.nodes)
    assert _json(sorted(shuffled.to_dict()["nodes"], key=lambda n: n["node_id"])) == _json(
        sorted(small_tree.to_dict()["nodes"], key=lambda n: n["node_id"])
    )
    # merging a path the tree already holds changes nothing; an inner node's path merges too
    assert back.merge_path(paths[1]) is back["0.1.0"] and _json(back.to_dict()) == _json(small_tree.to_dict())
    assert RolloutTree.from_paths([small_tree.path_dict("0.1")])["0.1"].children == []


def test_a_missing_path_leaves_its_leaf_out():
    tree = RolloutTree("7", prompt="p")
    a = tree.add_turn("7", token_ids=[4, 5], loss_mask=[0, 1])
    tree.add_turn(a.node_id, terminal=True, reward=1.0)  # 7.0.0
    tree.add_turn(a.node_id, terminal=True, reward=0.0, origin=BRANCH)  # 7.0.1
    tree.add_turn(a.node_id, terminal=True, reward=1.0, origin=BRANCH)  # 7.0.2
    tree.add_turn("7", terminal=True, reward=0.0)  # 7.1: its own rollout
    back = RolloutTree.from_paths([tree.path_dict(leaf) for leaf in ("7.0.0", "7.0.2")])
    assert sorted(back.nodes) == ["7", "7.0", "7.0.0", "7.0.2"]
    assert back["7"].children == ["7.0"] and back["7.0"].children == ["7.0.0", "7.0.2"]
    assert back["7.0"].token_ids == [4, 5] and back["7.0"].loss_mask == [0, 1]
    back.compute_targets()
    assert back.root.target == 1.0 and back.root.leaves == 2


def test_merge_path_refuses_paths_that_do_not_fit_and_leaves_the_tree_as_it_was(small_tree):
    good = small_tree.path_dict("0.1.0")
    tree = RolloutTree.from_paths([good])
    before = _json(tree.to_dict())

    def refused(path: dict, match: str) -> None:
        with pytest.raises(ValueError, match=match) as err:
            tree.merge_path(path)
        assert "\n" not in str(err.value) and _json(tree.to_dict()) == before

    other = small_tree.path_dict("0.1.1")
    other["nodes"][1]["action"] = "changed"
    refused(other, "disagree on node '0.1'")
    refused({**small_tree.path_dict("0.1.1"), "prompt": "p1"}, "disagree on the prompt")
    refused({**good, "root_id": "1"}, "tree '1' cannot merge into tree '0'")
    skipped = small_tree.path_dict("0.1.1")
    del skipped["nodes"][1]
    refused(skipped, "'0.1.1' is not a child of '0'")
    refused({**good, "nodes": good["nodes"][1:]}, "start at the root")
    refused({**good, "nodes": []}, "without nodes")
    below = small_tree.path_dict("0.1.0")
    below["nodes"].append({**below["nodes"][-1], "node_id": "0.1.0.0"})
    refused(below, "follows the terminal node '0.1.0'")
    refused({**good, "nodes": [{**good["nodes"][0], "colour": 1}]}, "not a TurnNode")
    with pytest.raises(ValueError, match="at least one path"):
        RolloutTree.from_paths([])


def test_a_nan_value_merges_as_itself(small_tree):
    small_tree["0.1"].predicted = float("nan")
    paths = [pickle.loads(pickle.dumps(small_tree.path_dict(leaf))) for leaf in ("0.1.0", "0.1.1")]
    assert RolloutTree.from_paths(paths)["0.1"].children == ["0.1.0", "0.1.1"]
