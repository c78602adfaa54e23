"""The calibrated flip layer (experimental/flip.py): its prior against a brute-force Beta world, its MAP fit against
a grid search and its first-order conditions, the online update (ageing, dropping, a restored state refitting to
the same numbers), the observations it reads off trees, the claim it is built on: where V~ cannot see the
state, q from V~ over-predicts the flips of the prefixes an arg-max chooses, and the layer, fitted only on those
chosen prefixes, predicts them; and a prior fitted on earlier runs (`FlipPrior`): the layer's own fit, what a
fresh layer predicts under it, how data moves it, its file and the refusal of a bad one."""

import json

import numpy as np
import pytest

from trace_rl.allocation import allocate_prefixes, prefix_flip_prob
from trace_rl.experimental.flip import (
    FlipCalibrator,
    FlipPrior,
    beta_flip_prior,
    fit_flip_prior,
    flip_observations,
    make_flip_model,
)
from trace_rl.experimental.map_logistic import MAX_HALF_LIVES
from trace_rl.tree import BRANCH, RolloutTree


@pytest.mark.parametrize("kappa", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("v", [0.2, 0.5, 0.85])
def test_the_prior_is_the_flip_rate_of_a_beta_world(kappa, v):
    rng = np.random.default_rng(0)
    states = rng.beta(kappa * v, kappa * (1 - v), size=400_000)  # V given the features, mean v
    r = rng.uniform(size=states.size) < states  # the rollout's own outcome
    cont = rng.uniform(size=states.size) < states  # one continuation from the same state
    for outcome in (True, False):
        sel = r == outcome
        realised = float(np.mean(cont[sel] != outcome))
        q = float(prefix_flip_prob(float(outcome), v))
        assert beta_flip_prior(q, kappa) == pytest.approx(realised, abs=0.004)
    assert beta_flip_prior(0.6, 1.0) == pytest.approx(0.3)  # k = 1: half of q


def _cell_objective(a, offset, k, f, w, sigma):
    """The negative log posterior of one cell's intercept `a` (a row of candidates) on rows k, f, w (columns)."""
    eta = offset + a
    return np.sum(w * (k * np.logaddexp(0.0, eta) - f * eta), axis=0) + 0.5 * a * a / sigma**2


def test_the_map_fit_of_a_cell_matches_a_grid_search():
    # V~ = 1/2 gives q = 1/2 and logit q = 0: the slopes see nothing, each (r, depth) cell is a 1-D problem
    fc = FlipCalibrator(sigma_cell=1.5, half_life=2.0)
    fc.observe([1, 1, 0], [0.5, 0.5, 0.5], [1, 1, 2], [3, 2, 4], [1, 0, 3])
    fc.observe([1, 0], [0.5, 0.5], [1, 2], [1, 2], [1, 0])
    offset = np.log(0.25 / 0.75)  # logit(q k/(k+1)) at q = 1/2, k = 1
    grid = np.linspace(-8, 8, 320_001)
    w_old, w_new = 0.5 ** (1 / 2.0), 1.0  # one step old, this step
    cells = {  # (success, depth bin): continuations, flips, weights
        (1, 0): ([3, 2, 1], [1, 0, 1], [w_old, w_old, w_new]),
        (0, 1): ([4, 2], [3, 0], [w_old, w_new]),
    }
    for (success, dbin), (k, f, w) in cells.items():
        k, f, w = (np.array(x, float)[:, None] for x in (k, f, w))
        a = grid[np.argmin(_cell_objective(grid, offset, k, f, w, 1.5))]
        assert fc.theta[success * fc.max_depth + dbin] == pytest.approx(a, abs=1e-4)
    untouched = [i for i in range(2 * fc.max_depth) if i not in (fc.max_depth, 1)]
    assert np.all(fc.theta[untouched] == 0) and np.allclose(fc.theta[-2:], 0)


def test_per_cell_the_weighted_predictions_meet_the_flips_up_to_the_prior_pull():
    rng = np.random.default_rng(3)
    fc = FlipCalibrator(half_life=1.0)
    batches = []
    for _ in range(3):
        n = 60
        b = (
            rng.integers(0, 2, n).astype(float),
            rng.uniform(0.05, 0.95, n),
            rng.integers(1, 7, n),
            rng.integers(1, 4, n),
        )
        flips = rng.binomial(b[3], np.where(b[0] > 0, 0.1, 0.5))
        batches.append((*b, flips))
        fc.observe(*batches[-1])
    # first-order conditions of the MAP: per cell, sum of w (K p - F) = -a / sigma^2, with w = 0.5 ** age
    prec = 1.0 / fc.sigma_cell**2
    for success in (0, 1):
        for dbin in range(fc.max_depth):
            lhs = 0.0
            for age, (r, v, d, k, f) in zip((2, 1, 0), batches):
                sel = ((r > 0.5) == success) & (np.minimum(d, fc.max_depth) - 1 == dbin)
                p = fc.predict(r[sel], v[sel], d[sel])
                lhs += 0.5**age * np.sum(k[sel] * p - f[sel])
            assert lhs == pytest.approx(-prec * fc.theta[success * fc.max_depth + dbin], abs=1e-7)


def test_old_rows_fade_and_are_dropped_and_a_saved_state_refits_to_the_same_numbers():
    fc = FlipCalibrator(half_life=2.0)
    fc.observe([1.0], [0.3], [1], [4], [4])  # a success whose every continuation flipped
    high = fc.predict([1.0], [0.3], [1])[0]
    for _ in range(4):
        fc.observe([1.0], [0.3], [1], [4], [0])  # then none flips
    assert fc.predict([1.0], [0.3], [1])[0] < high
    steps = int(MAX_HALF_LIVES * fc.half_life)  # the last row is kept this many steps, then dropped
    for _ in range(steps):
        fc.observe([], [], [], [], [])
    assert len(fc.state_dict()["rows"]) == 1
    fc.observe([], [], [], [], [])
    assert fc.steps_seen == 6 + steps and len(fc.state_dict()["rows"]) == 0  # all aged out
    assert np.all(fc.theta == 0)  # nothing left: the prior
    assert fc.predict([1.0], [0.3], [1])[0] == pytest.approx(0.7 / 2)

    a, b = FlipCalibrator(), FlipCalibrator()
    a.observe([1, 0, 1], [0.6, 0.3, 0.9], [1, 2, 5], [2, 1, 3], [0, 1, 1])
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # as a checkpoint stores it
    for fc in (a, b):
        fc.observe([0, 1], [0.4, 0.2], [3, 1], [2, 2], [1, 0])
    assert np.array_equal(a.theta, b.theta)
    assert np.array_equal(a.predict([1, 0], [0.5, 0.5], [1, 4]), b.predict([1, 0], [0.5, 0.5], [1, 4]))
    with pytest.raises(ValueError, match="settings"):
        FlipCalibrator(kappa=2.0).load_state_dict(a.state_dict())


def test_bad_input_is_one_line():
    fc = FlipCalibrator()
    with pytest.raises(ValueError, match="probabilities"):
        fc.predict([1.0], [1.5], [1])
    with pytest.raises(ValueError, match="depth"):
        fc.predict([1.0], [0.5], [0])
    with pytest.raises(ValueError, match="one length"):
        fc.predict([1.0, 0.0], [0.5], [1])
    with pytest.raises(ValueError, match="flips"):
        fc.observe([1.0], [0.5], [1], [2], [3])
    with pytest.raises(ValueError, match="kappa"):
        FlipCalibrator(kappa=0)
    with pytest.raises(ValueError, match="flip_model"):
        make_flip_model("smart")
    assert make_flip_model("raw") is None and isinstance(make_flip_model("calibrated"), FlipCalibrator)


def test_observations_are_the_scored_anchors_that_grew_continuations():
    t = RolloutTree(0, predicted=0.5)
    a = t.add_turn("0", predicted=0.7)
    b = t.add_turn(a.node_id, predicted=0.6)
    t.add_turn(b.node_id, terminal=True, reward=1.0)
    t.add_turn(a.node_id, terminal=True, reward=0.0, origin=BRANCH)
    t.add_turn(a.node_id, terminal=True, reward=1.0, origin=BRANCH)
    r, v, d, k, f = flip_observations([t])
    assert r.tolist() == [1.0] and v.tolist() == [0.7] and d.tolist() == [1] and k.tolist() == [2] and f.tolist() == [1]
    assert all(x.size == 0 for x in flip_observations([RolloutTree(1)]))


def _world(rng, prompts):
    """Prompts of 2 rollouts x 3 anchors. A rollout's states are a martingale: V1 around the prompt's v, V2 around
    V1, V3 around V2 (Beta, concentration 2), and its outcome r is drawn from V3. V~ at every anchor is the
    prompt's v: calibrated (E[V_d] = v) but blind to the state, as hashed n-grams are to a computed number."""
    rollouts = 2 * prompts
    v = np.repeat(rng.uniform(0.1, 0.9, prompts), 2)
    states, prev = [], v
    for _ in range(3):
        prev = np.clip(rng.beta(2 * prev, 2 * (1 - prev)), 1e-9, 1 - 1e-9)
        states.append(prev)
    r = (rng.uniform(size=rollouts) < states[-1]).astype(float)
    # flattened anchor by anchor: rollout 0's depths 1, 2, 3, then rollout 1's, ...
    return np.tile([1, 2, 3], rollouts), np.repeat(v, 3), np.stack(states, axis=1).ravel(), np.repeat(r, 3)


def _stage2_run(layer: bool, steps: int = 40, prompts: int = 16, budget: int = 2) -> dict[int, np.ndarray]:
    """Stage 2 on `_world` for `steps` steps, on q of V~ or on the layer (which observes either way); per depth,
    over the chosen anchors after the first 5 steps (which the prior carries), one row per continuation: the
    q of V~, the layer's q and its anchor's realised flip share (so column means are per-continuation rates)."""
    rng = np.random.default_rng(7)
    fc = FlipCalibrator()
    rows = []
    for step in range(steps):
        depth, v, states, r = _world(rng, prompts)
        q_raw, q_layer = prefix_flip_prob(r, v), fc.predict(r, v, depth)
        q = q_layer if layer else q_raw
        k = np.concatenate([allocate_prefixes(q[i : i + 6], budget, seed=step) for i in range(0, q.size, 6)])
        flips = rng.binomial(k, np.where(r > 0.5, 1 - states, states))  # a continuation succeeds with V_d
        chosen = k > 0
        if step >= 5:
            cols = (depth, q_raw, q_layer, flips / np.maximum(k, 1))
            rows.append(np.repeat(np.stack(cols, axis=1)[chosen], k[chosen], axis=0))
        fc.observe(r[chosen], v[chosen], depth[chosen], k[chosen], flips[chosen])
    rows = np.concatenate(rows)
    return {d: rows[rows[:, 0] == d, 1:] for d in (1, 2, 3)} | {0: rows[:, 1:]}


def test_fitted_only_on_the_prefixes_it_chose_the_layer_predicts_their_flips_where_q_of_v_does_not():
    raw, layer = _stage2_run(layer=False), _stage2_run(layer=True)
    # the arg-max on a blind V~ over-predicts, the more the deeper (the deeper, the more the state is decided)
    gaps = [raw[d][:, 0].mean() - raw[d][:, 2].mean() for d in (1, 2, 3)]
    assert min(gaps) > 0.1 and gaps == sorted(gaps), gaps
    for d in (0, 1, 2, 3):  # the layer, allocating on itself, predicts what its choices realise
        if len(layer[d]) >= 50:  # it stops choosing a cell that rarely flips (here depth 2)
            assert abs(layer[d][:, 1].mean() - layer[d][:, 2].mean()) < 0.04, d
    assert len(layer[1]) > len(raw[1])  # it moves continuations to the early prefixes, which flip most
    assert layer[0][:, 2].mean() > raw[0][:, 2].mean() + 0.05  # and buys more flips with the same budget


def _anchors(rng, n: int, flip_success: float, flip_failure: float) -> tuple[np.ndarray, ...]:
    """n anchors (reward, V~, depth, continuations, flips) whose continuations flip at a rate set by r alone."""
    r = rng.integers(0, 2, n).astype(float)
    k = rng.integers(1, 4, n)
    f = rng.binomial(k, np.where(r > 0.5, flip_success, flip_failure))
    return r, rng.uniform(0.05, 0.95, n), rng.integers(1, 7, n), k, f


def test_a_fitted_prior_is_the_layers_own_map_fit_on_the_pooled_rows_without_ageing():
    rng = np.random.default_rng(5)
    runs = [_anchors(rng, 80, 0.1, 0.4), _anchors(rng, 50, 0.2, 0.3)]
    prior = fit_flip_prior(runs, sigma_cell=0.5, sigma_slope=0.25, names=["a", "b"])
    layer = FlipCalibrator()
    layer.observe(*(np.concatenate([run[i] for run in runs]) for i in range(5)))  # one step: every row weight 1
    assert np.array_equal(prior.theta, layer.theta)
    again = fit_flip_prior(runs[::-1], sigma_cell=0.5, sigma_slope=0.25)  # no ageing: the runs' order is moot
    assert np.allclose(again.theta, prior.theta, atol=1e-9)
    aged = FlipCalibrator()
    for run in runs:  # the online layer, one run a step, weighs the first run half as much: another fit
        aged.observe(*run)
    assert not np.allclose(aged.theta, prior.theta, atol=1e-3)
    r, _, d, k, f = (np.concatenate([run[i] for run in runs]) for i in range(5))
    cell = (r > 0.5).astype(int) * 4 + np.minimum(d, 4) - 1
    assert prior.continuations == tuple(np.bincount(cell, weights=k, minlength=8).astype(int))
    assert prior.flips == tuple(np.bincount(cell, weights=f, minlength=8).astype(int))
    assert (prior.sigma_cell, prior.sigma_slope, prior.runs) == (0.5, 0.25, ("a", "b"))


def test_under_a_fitted_prior_the_layer_predicts_it_before_data_and_moves_toward_data():
    rng = np.random.default_rng(6)
    earlier = [_anchors(rng, 400, 0.05, 0.45)]  # deep in the prior: successes rarely flip, failures often
    prior = fit_flip_prior(earlier, sigma_cell=0.5, sigma_slope=0.25)
    fitted = FlipCalibrator()
    fitted.observe(*earlier[0])
    probe = (np.array([1.0, 1.0, 0.0, 0.0]), np.array([0.7, 0.3, 0.6, 0.2]), np.array([1, 4, 2, 5]))
    cold = prior.layer()
    assert np.allclose(cold.predict(*probe), fitted.predict(*probe), atol=1e-12)  # before any data: the prior
    assert cold.predict(*probe) == pytest.approx([0.05, 0.05, 0.45, 0.45], abs=0.1)  # the earlier rates, not q/2
    assert not np.allclose(FlipCalibrator().predict(*probe), cold.predict(*probe), atol=0.05)

    loose = FlipPrior(**{**prior.to_dict(), "sigma_cell": 4.0, "sigma_slope": 0.5}).layer()
    gaps = {id(cold): [], id(loose): []}
    for _ in range(6):  # now successes flip at 0.3: each step moves the layer toward it
        batch = _anchors(rng, 40, 0.3, 0.45)
        for layer in (cold, loose):
            layer.observe(*batch)
            gaps[id(layer)].append(abs(float(np.mean(layer.predict(*probe)[:2])) - 0.3))
    before = abs(float(np.mean(prior.layer().predict(*probe)[:2])) - 0.3)
    assert gaps[id(cold)][0] < before and gaps[id(cold)][-1] < 0.5 * before  # data moves it, step by step
    assert gaps[id(loose)][0] < gaps[id(cold)][0]  # a looser prior lets the first step move it further
    # the MAP pulls toward the prior's mean, not toward 0: per cell, sum of w (K p - F) = -(a - a0) / sigma^2
    rows = np.array(cold.state_dict()["rows"])  # success, q of V~, depth bin, continuations, flips, age
    cell = (rows[:, 0] == 1) & (rows[:, 2] == 0)  # after a success, depth 1
    success, q, k, f, age = rows[cell, 0], rows[cell, 1], rows[cell, 3], rows[cell, 4], rows[cell, 5]
    p = cold.predict(success, 1.0 - q, np.ones(q.size, dtype=int))  # after a success q = 1 - V~
    lhs = float(np.sum(0.5 ** (age / cold.half_life) * (k * p - f)))
    assert lhs == pytest.approx(-(cold.theta[4] - prior.theta[4]) / prior.sigma_cell**2, abs=1e-7)


def test_a_prior_file_round_trips_and_a_checkpoint_keeps_its_prior(tmp_path):
    rng = np.random.default_rng(7)
    prior = fit_flip_prior([_anchors(rng, 60, 0.1, 0.4)], sigma_cell=0.5, sigma_slope=0.25, names=["run"])
    path = tmp_path / "prior.json"
    prior.save(path)
    assert FlipPrior.load(path) == prior
    layer = make_flip_model("calibrated", str(path))
    assert np.array_equal(layer.prior_mean, prior.theta) and layer.sigma_cell == 0.5 and layer.sigma_slope == 0.25
    layer.observe(*_anchors(rng, 20, 0.2, 0.3))
    restored = prior.layer()
    restored.load_state_dict(json.loads(json.dumps(layer.state_dict())))
    batch = _anchors(rng, 20, 0.2, 0.3)
    for each in (layer, restored):
        each.observe(*batch)
    assert np.array_equal(layer.theta, restored.theta)
    with pytest.raises(ValueError, match="settings"):  # a checkpoint of another prior is refused
        FlipCalibrator(sigma_cell=0.5, sigma_slope=0.25).load_state_dict(layer.state_dict())
    assert "prior_mean" not in FlipCalibrator().state_dict()["settings"]  # checkpoints from before still load
    path.write_text("[" * 100_000 + "]" * 100_000)  # deeper than json's recursive parser: once a RecursionError
    with pytest.raises(ValueError, match="not a JSON file"):
        FlipPrior.load(path)


def test_a_prior_carries_the_half_life_its_layer_ages_at_and_older_files_keep_sixteen(tmp_path):
    rng = np.random.default_rng(8)
    prior = fit_flip_prior([_anchors(rng, 60, 0.1, 0.4)], sigma_cell=0.5, sigma_slope=0.25, half_life=4.0)
    path = tmp_path / "prior.json"
    prior.save(path)
    layer = make_flip_model("calibrated", str(path))
    assert layer.half_life == 4.0 and prior.layer(2.0).half_life == 2.0  # an explicit one wins (the replay's)
    doc = json.loads(path.read_text())
    del doc["half_life"]  # a prior written before the key existed
    path.write_text(json.dumps(doc))
    assert make_flip_model("calibrated", str(path)).half_life == 16.0
    # the half-life is what the layer ages by: under 4 a row of 8 steps ago weighs 1/4, under 16 about 0.71
    rows = [_anchors(rng, 30, 0.1, 0.6)] + [_anchors(rng, 30, 0.3, 0.3) for _ in range(8)]
    fast, slow = prior.layer(), prior.layer(16.0)
    for batch in rows:
        fast.observe(*batch)
        slow.observe(*batch)
    failures = tuple(x[rows[0][0] < 0.5] for x in rows[0][:3])
    assert fast.predict(*failures).mean() < slow.predict(*failures).mean()  # step 0's flips fade faster under 4
    with pytest.raises(ValueError, match="half_life"):
        FlipPrior(**{**prior.__dict__, "half_life": 0.0})


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no file"),
        ("{not json", "not a JSON file"),
        ("[1, 2]", "JSON object"),
        ('{"theta": [0.0]}', "lacks continuations, flips, sigma_cell, sigma_slope"),
        ('{"theta": [0.0], "sigma_cell": 1, "sigma_slope": 1, "continuations": [], "flips": [], "x": 1}', "keys x"),
        ('{"theta": [0.0], "sigma_cell": 1, "sigma_slope": 1, "continuations": [], "flips": []}', "10 finite"),
        (
            '{"theta": [0,0,0,0,0,0,0,0,0,0], "sigma_cell": 0, "sigma_slope": 1, "continuations": [], "flips": []}',
            "sigma_cell",
        ),
        (
            '{"theta": [0,0,0,0,0,0,0,0,0,0], "sigma_cell": 1, "sigma_slope": 1, "continuations": [1], "flips": [1]}',
            "per cell",
        ),
    ],
)
def test_a_bad_prior_file_is_one_line_naming_the_setting(tmp_path, content, message):
    path = tmp_path / "prior.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as err:
        make_flip_model("calibrated", str(path))
    text = str(err.value)
    assert text.startswith("predictor.flip_prior: ") and message in text and "\n" not in text, text
    with pytest.raises(ValueError, match="only predictor.flip_model=calibrated reads it"):
        make_flip_model("raw", str(path))
