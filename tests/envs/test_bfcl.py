import pytest

pytest.importorskip("bfcl_eval")

from trace_rl.envs.bfcl_env import CATEGORIES, BFCLEnv, load_bfcl, replay_ground_truth  # noqa: E402


@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_replays_valid_and_corruption_does_not(category):
    entries = load_bfcl(category)
    assert len(entries) == 200
    assert all(replay_ground_truth(e) == 1.0 for e in entries)
    assert all(replay_ground_truth(e, corrupt=True) == 0.0 for e in entries[:40])


def test_fork_isolates_backend_state_and_bad_calls_are_observations():
    entry = load_bfcl("multi_turn_base", limit=1)[0]
    env = BFCLEnv()
    env.reset(entry)
    twin = env.fork()
    twin.step("Action: call[mkdir(dir_name='only_in_twin')]")
    obs, *_ = env.step("Action: call[ls()]")
    assert "only_in_twin" not in obs
    assert "only_in_twin" in twin.step("Action: call[ls()]")[0]
    assert "could not parse" in env.step("Action: call[ls(]")[0]
    assert "no function named 'rm_rf'" in env.step("Action: call[rm_rf()]")[0]
    assert "must be literal" in env.step("Action: call[cd(folder=open('x'))]")[0]


def test_miss_func_hides_then_reveals_functions():
    entry = load_bfcl("multi_turn_miss_func", limit=1)[0]
    env = BFCLEnv()
    env.reset(entry)
    (turn, names), = entry["missed_function"].items()
    assert not set(names) & env.visible
    for _ in range(int(turn)):
        env.step("Action: done[]")
    assert set(names) <= env.visible
