"""VIP's Gaussian-process predictor against the verbatim copy of upstream's `GPR` (bench/vip_reference.py), driven
as VIP's trainer drives it: one fit per step on the last step's prompts, the mean kept between fits, prior -5."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from trace_rl.predictors.gp import PRIOR, GaussianProcessPredictor
from trace_rl.tree import RolloutTree

pytest.importorskip("scipy")  # the reference's Cholesky; scipy comes with the `plots` extra
_spec = importlib.util.spec_from_file_location(
    "vip_reference", Path(__file__).resolve().parents[2] / "bench" / "vip_reference.py"
)
upstream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(upstream)


def universe(seed: int, size: int = 60, dim: int = 16):
    """Unit embeddings in six clusters (near and far prompts), their distance matrix, and one tree per prompt."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(6, dim))[rng.integers(0, 6, size)] + 0.15 * rng.normal(size=(size, dim))
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    d = np.sqrt(np.maximum(((e[:, None] - e[None]) ** 2).sum(-1), 0.0))
    return e, d, [RolloutTree(0, prompt=i) for i in range(size)]


class Lookup:
    def __init__(self, e):
        self.e, self.calls = e, 0

    def __call__(self, trees):
        self.calls += len(trees)
        return self.e[[t.prompt for t in trees]]


def roots(trees, idx):
    return [(trees[i], trees[i].root_id) for i in idx]


def logit(p):
    return np.log(p / (1 - p))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_port_is_upstreams_gpr_as_the_trainer_drives_it(seed):
    """15 steps: each fits a random batch's success rates (0 and 1 included: logits +-13.8) and predicts
    another batch; the logits agree to 1e-9 although upstream updates a dense mean and the port sums lazily."""
    e, d, trees = universe(seed)
    index = {i: i for i in range(60)}
    ref = upstream.GPR(d, reuse_covariance=False, reuse_mean=True, return_std=False, qid_to_idx=index, prior_value=-5)
    gp = GaussianProcessPredictor(Lookup(e))
    rng = np.random.default_rng(seed + 10)
    assert np.allclose(gp.predict(roots(trees, range(60))), 1 / (1 + np.exp(5)))  # the prior before any fit
    for _ in range(15):
        batch = rng.choice(60, size=12, replace=False)
        y = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=12)
        ref.fit_qids(list(batch), y)
        gp.update(roots(trees, batch), y)
        query = rng.choice(60, size=20, replace=False)
        want, _ = ref.predict_qids(list(query))
        got = gp.predict(roots(trees, query))
        assert np.max(np.abs(logit(got) - logit(want))) < 1e-9


def test_by_hand_one_fit_of_two_prompts():
    """Two prompts at distance 0.27 (k = exp(-0.5) = 0.6065), both at the prior -5, observe 0.5 and 0.9:
    g = [0, 2.1972]; alpha = (K + 1e-4 I)^-1 (g + 5). A third prompt 0.27 from the first and 0.54 from the second
    (k = 0.6065, 0.1353) gets -5 + k . alpha; the fitted ones take their observations."""
    x = np.array([[0.0, 0.0], [0.27, 0.0], [-0.27, 0.0]])  # on a line: d(0,1) = 0.27, d(2,1) = 0.54
    trees = [RolloutTree(0, prompt=i) for i in range(3)]
    gp = GaussianProcessPredictor(lambda ts: x[[t.prompt for t in ts]])
    loss = gp.update(roots(trees, [0, 1]), np.array([0.5, 0.9]))
    assert loss == pytest.approx(((1 / (1 + np.exp(5)) - 0.5) ** 2 + (1 / (1 + np.exp(5)) - 0.9) ** 2) / 2)
    k = np.array([[1 + 1e-4, np.exp(-0.5)], [np.exp(-0.5), 1 + 1e-4]])
    alpha = np.linalg.solve(k, np.array([0.0, np.log(9)]) + 5)
    third = -5 + np.array([np.exp(-0.5), np.exp(-0.5 * 4)]) @ alpha
    got = gp.predict(roots(trees, [0, 1, 2]))
    assert logit(got) == pytest.approx([0.0, np.log(9), third], abs=1e-9)


def test_prefixes_take_their_prompts_value_and_only_roots_train():
    e, _, trees = universe(0, size=4)
    tree = trees[0]
    child = tree.add_turn(tree.root_id, action="a")
    gp = GaussianProcessPredictor(Lookup(e))
    gp.update([(tree, child.node_id)], np.array([1.0]))  # a prefix example: VIP has no embedding for it
    assert gp.alpha.size == 0
    gp.update([(tree, tree.root_id), (trees[1], trees[1].root_id)], np.array([0.25, 0.75]))
    assert gp.predict([(tree, child.node_id)]) == pytest.approx(gp.predict([(tree, tree.root_id)]))
    assert gp.predict([(tree, tree.root_id)])[0] == pytest.approx(0.25)


def test_a_prompt_twice_in_one_fit_is_fitted_once_at_its_mean_and_embedded_once():
    e, _, trees = universe(0, size=4)
    embed = Lookup(e)
    gp = GaussianProcessPredictor(embed)
    gp.update(roots(trees, [0, 0, 1]), np.array([0.0, 1.0, 0.3]))
    assert gp.alpha.size == 2 and embed.calls == 2
    assert gp.predict(roots(trees, [0, 1])) == pytest.approx([0.5, 0.3])
    gp.predict(roots(trees, [0, 1, 2]))
    assert embed.calls == 3  # only the new prompt is embedded


def test_save_and_load_resume_the_same_predictions(tmp_path):
    e, _, trees = universe(3)
    gp = GaussianProcessPredictor(Lookup(e))
    rng = np.random.default_rng(0)
    for _ in range(4):
        batch = rng.choice(60, size=8, replace=False)
        gp.update(roots(trees, batch), rng.random(8))
    gp.save(tmp_path / "gp")
    other = GaussianProcessPredictor(Lookup(e), length_scale=1.0, prior=0.0)
    other.load(tmp_path / "gp")
    assert other.length_scale == 0.27 and other.prior == PRIOR
    assert np.array_equal(other.predict(roots(trees, range(60))), gp.predict(roots(trees, range(60))))
    batch = rng.choice(60, size=8, replace=False)
    y = rng.random(8)
    assert other.update(roots(trees, batch), y) == gp.update(roots(trees, batch), y)
    empty = GaussianProcessPredictor(Lookup(e))
    empty.save(tmp_path / "empty")
    empty.load(tmp_path / "empty.npz")
    assert empty.predict(roots(trees, [0])) == pytest.approx([1 / (1 + np.exp(5))])


def test_bad_settings_and_a_wrong_embedder_are_one_line():
    with pytest.raises(ValueError, match="length_scale > 0"):
        GaussianProcessPredictor(Lookup(np.eye(2)), length_scale=0.0)
    gp = GaussianProcessPredictor(lambda trees: np.zeros((len(trees) + 1, 3)))
    tree = RolloutTree(0, prompt=0)
    with pytest.raises(ValueError, match="the embedder returned shape"):
        gp.predict([(tree, tree.root_id)])
