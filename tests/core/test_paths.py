import pytest

from trace_rl.paths import WEIGHTINGS, check_node, copy_weights, node_weights, tree_paths, turn_rows
from trace_rl.tree import BRANCH, RolloutTree


@pytest.fixture
def tree() -> RolloutTree:
    """Prompt 0; turn a (0.0) shared by three leaves: b (0.0.0) ends, c (0.0.1) has two children d, e; and a
    separate chain f (0.1) -> g (0.1.0)."""
    t = RolloutTree(0)
    t.root.token_ids, t.root.loss_mask = [1, 2], [0, 0]

    def turn(parent, terminal, reward=None, origin="bare"):
        return t.add_turn(
            parent, token_ids=[3, 4], loss_mask=[1, 0], logprobs=[-0.5], terminal=terminal, reward=reward, origin=origin
        )

    a = turn("0", False)
    turn(a.node_id, True, 1.0)  # b
    c = turn(a.node_id, False, origin=BRANCH)
    turn(c.node_id, True, 0.0)  # d
    turn(c.node_id, True, 1.0, BRANCH)  # e
    f = turn("0", False)
    turn(f.node_id, True, 0.0)  # g
    return t


def ids(paths):
    return [[n.node_id for n in p] for p in paths]


def test_paths_are_depth_first_root_to_leaf(tree):
    assert ids(tree_paths(tree)) == [
        ["0", "0.0", "0.0.0"],
        ["0", "0.0", "0.0.1", "0.0.1.0"],
        ["0", "0.0", "0.0.1", "0.0.1.1"],
        ["0", "0.1", "0.1.0"],
    ]
    # keep: a subtree with nothing kept is left out, and a path ends at the last node with something kept below
    assert ids(tree_paths(tree, keep=lambda n: n.node_id in ("0.0.1", "0.1.0"))) == [
        ["0", "0.0", "0.0.1"],
        ["0", "0.1", "0.1.0"],
    ]
    assert tree_paths(tree, keep=lambda n: False) == []
    assert tree_paths(RolloutTree(5)) == []  # a prompt with no rollout


@pytest.mark.parametrize(
    "weighting,a,c,f",
    [
        # the shared turn a lies on 3 paths, c on 2, f on 1
        ("first", [1.0, 0.0, 0.0], [1.0, 0.0], [1.0]),
        ("split", [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5], [1.0]),
        ("leaf", [1.0, 1.0, 1.0], [1.0, 1.0], [1.0]),
    ],
)
def test_each_weighting_on_a_hand_built_tree(tree, weighting, a, c, f):
    paths = tree_paths(tree)
    w = copy_weights(paths, weighting)
    assert [row[1] for row in w[:3]] == pytest.approx(a)
    assert [row[2] for row in w[1:3]] == pytest.approx(c)
    assert [w[3][1]] == pytest.approx(f)
    assert [row[-1] for row in w] == [1.0] * 4  # a leaf is on one path: every weighting gives it 1
    total = node_weights(paths, weighting)
    assert total["0.0"] == pytest.approx(sum(a)) and total["0.0.1"] == pytest.approx(sum(c))
    assert total["0.0"] == (3.0 if weighting == "leaf" else 1.0)
    rows = {r["node_id"]: r for r in turn_rows(tree, {n.node_id: 0.5 for n in tree.turns()}, weighting)}
    assert rows["0.0"]["weight"] == total["0.0"] and rows["0.0"]["advantage"] == 0.5


def test_one_node_validation_and_bad_weighting(tree):
    node = tree["0.0"]
    check_node(node, need_logprobs=True)
    node.logprobs = []
    check_node(node)  # no log-probs at all is allowed where no ratio is taken
    with pytest.raises(ValueError, match="1 policy tokens but 0 log-probs"):
        check_node(node, need_logprobs=True)
    node.logprobs = [-1.0, -2.0]
    with pytest.raises(ValueError, match="'0.0': 1 policy tokens but 2 log-probs"):
        tree_paths(tree)
    node.logprobs, node.loss_mask = [-1.0], [1]
    with pytest.raises(ValueError, match="2 token_ids but 1 mask entries"):
        tree_paths(tree)
    with pytest.raises(ValueError, match=f"weighting must be one of {', '.join(WEIGHTINGS)}, got 'half'"):
        copy_weights([], "half")


def test_turn_rows_take_turns_without_tokens_as_the_testbed_writes_them():
    t = RolloutTree(0)
    a = t.add_turn("0", logprobs=[-0.1], info={"kind": 1})  # a testbed turn: a log-prob, no tokens
    t.add_turn(a.node_id, logprobs=[-0.2], terminal=True, reward=1.0)
    t.add_turn(a.node_id, logprobs=[-0.3], terminal=True, reward=0.0)
    rows = turn_rows(t, {"0.0": 0.1, "0.0.0": 0.5, "0.0.1": -0.5}, "leaf")
    assert [(r["node_id"], r["weight"]) for r in rows] == [("0.0", 2.0), ("0.0.0", 1.0), ("0.0.1", 1.0)]
    with pytest.raises(ValueError, match="0 policy tokens but 1 log-probs"):
        tree_paths(t)  # a trainer that reads tokens refuses them
