import numpy as np
import pytest

from trace_rl.testbed import OraclePredictor, SoftmaxPolicy, TestbedConfig, TestbedEnv, TestbedFeatures, make_tasks
from trace_rl.tree import RolloutTree

CFG = TestbedConfig(seed=0)


def test_tasks_follow_config():
    tasks = make_tasks(CFG, 300, seed=1)
    assert all(CFG.min_turns <= t.horizon <= CFG.max_turns for t in tasks)
    assert all(t.tolerance <= t.horizon // 3 for t in tasks)
    assert make_tasks(CFG, 5, seed=1) == tasks[:5]
    with pytest.raises(ValueError, match="difficulty_mix"):
        TestbedConfig(difficulty_mix=(0.5, 0.5, 0.5))


def test_fork_never_touches_parent_or_sibling():
    task = make_tasks(CFG, 1, seed=2)[0]
    env = TestbedEnv(CFG, np.random.default_rng(0))
    env.reset(task)
    env.step(0)
    state = (env.turn, env.mistakes, env.done)
    a, b = env.fork(), env.fork()
    while not a.done:
        a.step(1)
    assert (env.turn, env.mistakes, env.done) == state
    assert (b.turn, b.mistakes, b.done) == state
    b.step(0)
    assert b.turn == state[0] + 1 and env.turn == state[0]


def test_malformed_action_is_an_observation_not_an_exception():
    task = make_tasks(CFG, 1, seed=3)[0]
    env = TestbedEnv(CFG, np.random.default_rng(0))
    env.reset(task)
    obs, reward, done, info = env.step(99)
    assert obs.startswith("error: action must be") and info["mistakes"] == 1


def test_exact_value_matches_monte_carlo():
    policy = SoftmaxPolicy(CFG, warm_start=1.0)
    task = next(t for t in make_tasks(CFG, 200, seed=4) if t.horizon >= 4 and t.tolerance == 1)
    rng = np.random.default_rng(0)
    wins = 0
    n = 4000
    for _ in range(n):
        env = TestbedEnv(CFG, rng, policy.right)
        env.reset(task)
        done = False
        while not done:
            _, r, done, _ = env.step(policy.act(task, env.turn, rng)[0])
        wins += r
    v = policy.value(task)
    assert abs(wins / n - v) < 4 * np.sqrt(v * (1 - v) / n) + 1e-3


def test_policy_gradient_moves_towards_positive_advantage():
    policy = SoftmaxPolicy(CFG, warm_start=0.0)
    before = policy.probs(0, 0)[2]
    policy.update(np.array([0]), np.array([0]), np.array([2]), np.array([1.0]), lr=1.0, scale=1.0)
    assert policy.probs(0, 0)[2] > before


def test_oracle_and_features_read_the_prefix():
    tasks = {t.index: t for t in make_tasks(CFG, 4, seed=5)}
    policy = SoftmaxPolicy(CFG)
    tree = RolloutTree(0, prompt=0)
    tree.root.info = {"turn": 0, "mistakes": 0}
    doomed = tree.add_turn("0", info={"turn": 1, "mistakes": tasks[0].tolerance + 1})
    oracle = OraclePredictor(tasks, policy)
    v = oracle.predict([(tree, "0"), (tree, doomed.node_id)])
    assert v[0] == pytest.approx(policy.value(tasks[0])) and v[1] == 0.0
    feats = TestbedFeatures(CFG, tasks)
    x = feats([(tree, "0"), (tree, doomed.node_id)])
    assert x.shape == (2, feats.dim) and not np.array_equal(x[0], x[1])
