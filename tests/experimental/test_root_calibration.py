"""The root calibration layer: identity before data, the MAP optimum, ageing, checkpoints, refusals."""

import json

import numpy as np
import pytest

from trace_rl.experimental.map_logistic import MAX_HALF_LIVES, expit, logit
from trace_rl.experimental.root_calibration import (
    RootCalibrator,
    make_root_model,
    root_observations,
)
from trace_rl.tree import BRANCH, RolloutTree


def _roots(rng, n: int, lift: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n roots whose bare rollouts succeed at expit(logit(V~) + lift): V~ off by `lift` on the logit scale."""
    v = rng.uniform(0.1, 0.9, n)
    k = rng.integers(1, 6, n)
    return v, k, rng.binomial(k, expit(logit(v) + lift))


def test_before_any_data_the_layer_is_v_itself():
    v = np.array([0.0, 0.1, 0.5, 0.93, 1.0])
    assert np.allclose(RootCalibrator().predict(v), np.clip(v, 0.0025, 0.9975), atol=1e-4)


def test_the_fit_is_the_map_optimum_of_the_aged_rows():
    rng = np.random.default_rng(0)
    rc = RootCalibrator(sigma_a=0.7, sigma_b=0.3, half_life=2.0)
    batches = [_roots(rng, 40, 0.6) for _ in range(3)]
    for batch in batches:
        rc.observe(*batch)
    v, k, s = (np.concatenate([b[i] for b in batches]) for i in range(3))
    age = np.repeat([2.0, 1.0, 0.0], 40)
    z, w = logit(v), 0.5 ** (age / 2.0)
    p = expit(rc.theta[0] + rc.theta[1] * z)
    grad = np.array([np.sum(w * (k * p - s)), np.sum(w * (k * p - s) * z)])
    grad += (rc.theta - np.array([0.0, 1.0])) / np.array([0.7, 0.3]) ** 2
    assert np.abs(grad).max() < 1e-8  # the objective's gradient vanishes: the unique minimum (it is convex)


def test_it_moves_v_towards_the_success_the_roots_realised():
    rng = np.random.default_rng(1)
    rc = RootCalibrator()
    for _ in range(10):
        rc.observe(*_roots(rng, 30, 0.8))  # the roots succeed more often than V~ says (a V~ that lags)
    v = np.array([0.3, 0.5, 0.7])
    assert np.all(rc.predict(v) > v + 0.05)
    assert np.all(np.diff(rc.predict(v)) > 0)  # a monotone map: V~'s order is kept


def test_rows_age_out_after_max_half_lives():
    rc = RootCalibrator(half_life=1.0)
    rc.observe([0.5], [4], [4])
    for _ in range(int(MAX_HALF_LIVES)):
        rc.observe([], [], [])
    assert len(rc.state_dict()["rows"]) == 1
    rc.observe([], [], [])
    assert len(rc.state_dict()["rows"]) == 0 and np.array_equal(rc.theta, [0.0, 1.0])


def test_a_restored_state_continues_exactly_and_other_settings_are_refused():
    rng = np.random.default_rng(2)
    a = RootCalibrator()
    a.observe(*_roots(rng, 20, 0.5))
    b = RootCalibrator()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    batch = _roots(rng, 20, 0.5)
    a.observe(*batch)
    b.observe(*batch)
    assert np.array_equal(a.theta, b.theta) and a.steps_seen == b.steps_seen == 2
    with pytest.raises(ValueError, match="settings"):
        RootCalibrator(half_life=4.0).load_state_dict(a.state_dict())


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda rc: rc.predict([1.2]), "probabilities"),
        (lambda rc: rc.predict([[0.5]]), "1-D"),
        (lambda rc: rc.observe([0.5], [2, 3], [1]), "must match"),
        (lambda rc: rc.observe([0.5], [2], [3]), "successes"),
        (lambda rc: rc.observe([0.5], [0], [0]), "rollouts"),
        (lambda rc: RootCalibrator(sigma_a=0), "sigma_a"),
        (lambda rc: make_root_model("smart"), "root_model must be one of raw, calibrated"),
    ],
)
def test_bad_input_is_one_line(call, message):
    with pytest.raises(ValueError, match=message) as err:
        call(RootCalibrator())
    assert "\n" not in str(err.value)


def test_the_observations_are_the_scored_roots_with_bare_rollouts():
    trees = []
    for i, rewards in enumerate([(1.0, 0.0, 1.0), (), (0.0,)]):
        tree = RolloutTree(i, predicted=0.25 * (i + 1))
        for r in rewards:
            first = tree.add_turn(tree.root_id)  # a bare rollout of two turns; a continuation below it is not bare
            tree.add_turn(first.node_id, terminal=True, reward=r)
            tree.add_turn(first.node_id, terminal=True, reward=1 - r, origin=BRANCH)
        trees.append(tree)
    trees[2].root.predicted = None  # never scored: not observed
    v, n, s = root_observations(trees)
    assert v.tolist() == [0.25] and n.tolist() == [3] and s.tolist() == [2]
    assert make_root_model("raw") is None and isinstance(make_root_model("calibrated"), RootCalibrator)
