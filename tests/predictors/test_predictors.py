import numpy as np
import pytest

from trace_rl.predictors import OnlineLogisticPredictor, RewardHistoryPredictor, training_examples
from trace_rl.tree import BRANCH, RolloutTree


def make_tree(idx, rewards, depth=2):
    tree = RolloutTree(idx, prompt=f"p{idx}")
    for r in rewards:
        parent = "%d" % idx
        for _ in range(depth - 1):
            parent = tree.add_turn(parent).node_id
        tree.add_turn(parent, terminal=True, reward=r)
    b = tree.add_turn(f"{idx}.0", terminal=True, reward=1 - rewards[0], origin=BRANCH)  # a continuation from 0.0
    assert b.node_id == f"{idx}.0.1"
    return tree


def test_training_examples_roots_plus_informative_prefixes():
    trees = [make_tree(i, [1.0, 0.0]) for i in range(10)]
    ex, y = training_examples(trees, prefix_share=0.5, rng=np.random.default_rng(0))
    roots = [e for e in ex if e[1] == e[0].root_id]
    inner = [e for e in ex if e[1] != e[0].root_id]
    assert len(roots) == 10 and len(inner) == 10
    assert [nid for _, nid in inner] == [f"{i}.0" for i in range(10)]  # the anchors continuations started at
    assert y[:10].tolist() == [0.5] * 10 and y[10:].tolist() == [0.0] * 10  # bare mean; the continuation's reward
    ex, _ = training_examples(trees, prefix_share=0.1, rng=np.random.default_rng(0))
    assert len(ex) == 10 + 1  # round(0.1 * 10 / 0.9) prefixes
    assert np.all((y >= 0) & (y <= 1))
    with pytest.raises(ValueError, match="prefix_share"):
        training_examples(trees, prefix_share=1.0, rng=np.random.default_rng(0))


def test_training_targets_ignore_leaves_that_stage_2_added():
    # Bare rollouts S, S, F; the failing rollout's first turn took three continuations, all failing.
    tree = RolloutTree(0, prompt="p")
    for r in (1.0, 1.0, 0.0):
        tree.add_turn(tree.add_turn("0").node_id, terminal=True, reward=r)
    for _ in range(3):
        tree.add_turn("0.2", terminal=True, reward=0.0, origin=BRANCH)
    tree.compute_targets()
    assert tree.root.target == pytest.approx(2 / 6)  # V^, what the advantages use
    ex, y = training_examples([tree], prefix_share=0.5, rng=np.random.default_rng(0))
    assert [nid for _, nid in ex] == ["0", "0.2"]
    assert y.tolist() == pytest.approx([2 / 3, 0.0])  # what the rollouts started there say


def test_reward_history_cold_start_and_decay():
    pred = RewardHistoryPredictor(decay=0.5)
    t = RolloutTree(1, prompt="a")
    u = RolloutTree(2, prompt="b")
    assert pred.predict([(t, "1")]).tolist() == [0.5]
    pred.update([(t, "1")], np.array([1.0]))
    pred.update([(t, "1")], np.array([0.0]))
    assert pred.predict([(t, "1")])[0] == pytest.approx(0.5)
    pred.update([(u, "2")], np.array([0.0]))
    assert pred.predict([(RolloutTree(3, prompt="c"), "3")])[0] == pytest.approx(0.25)  # prior = mean seen


def test_logistic_learns_a_separable_signal():
    rng = np.random.default_rng(0)
    trees = [RolloutTree(i, prompt=i) for i in range(200)]
    feats = {i: np.array([1.0, (i % 2) * 2 - 1.0]) for i in range(200)}
    featurize = lambda prefixes: np.stack([feats[t.prompt] for t, _ in prefixes])
    pred = OnlineLogisticPredictor(featurize, 2, lr=0.1, seed=0)
    prefixes = [(t, t.root_id) for t in trees]
    y = np.array([0.9 if i % 2 else 0.1 for i in range(200)])
    first = pred.update(prefixes, y)
    for _ in range(20):
        last = pred.update(prefixes, y + rng.normal(0, 0.01, 200).clip(-0.05, 0.05))
    p = pred.predict(prefixes)
    assert last < first
    assert abs(p[1] - 0.9) < 0.05 and abs(p[0] - 0.1) < 0.05


def test_save_and_load_round_trip(tmp_path):
    trees = [RolloutTree(i, prompt=i) for i in range(20)]
    featurize = lambda prefixes: np.stack([[1.0, t.prompt % 2] for t, _ in prefixes])
    a = OnlineLogisticPredictor(featurize, 2, lr=0.1)
    prefixes = [(t, t.root_id) for t in trees]
    a.update(prefixes, np.array([0.8 if t.prompt % 2 else 0.2 for t in trees]))
    a.save(tmp_path / "p.npz")
    b = OnlineLogisticPredictor(featurize, 2)
    b.load(tmp_path / "p.npz")
    assert np.allclose(a.predict(prefixes), b.predict(prefixes))
    with pytest.raises(ValueError, match="weights"):
        OnlineLogisticPredictor(featurize, 3).load(tmp_path / "p.npz")
    h = RewardHistoryPredictor()
    h.update(prefixes[:2], np.array([1.0, 0.0]))
    h.save(tmp_path / "h.json")
    g = RewardHistoryPredictor()
    g.load(tmp_path / "h.json")
    assert np.allclose(g.predict(prefixes), h.predict(prefixes))


def test_text_features_flag_numbers_the_agent_did_not_read():
    from trace_rl.predictors.text import HashedTextFeatures

    def path(action):
        tree = RolloutTree(0, prompt={"question": "Compute 17 +25 *3 left to right."})
        tree.add_turn("0", action=action, observation="42. Next: *3")
        return tree, "0.0"

    feats = HashedTextFeatures(64)
    copied, invented = feats([path("calc[17+25]"), path("calc[71+25]")])
    assert copied[-1] == 0.0 and invented[-1] > 0.0  # 71 appears nowhere in what the agent had read
    assert copied[-3] == 3 / 8 and copied[-2] == 2 / 4  # three numbers in the prompt, the longest has 2 digits
