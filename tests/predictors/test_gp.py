"""VIP's Gaussian-process predictor against upstream's `GPR` (github.com/HieuNT91/VIP @
dc365c3af3f5ce24dbe9126c81e4fe52fe640b44, src/vip/success_rate_prediction/gaussian_process.py), driven as VIP's
trainer drives it: one fit per step on the last step's prompts, the mean kept between fits, prior -5.

The repository ships no upstream code. Always: the port against vip_gp_upstream.json, the logits upstream's GPR
predicted over 15 recorded steps on 60 recorded embeddings (the file says which upstream file, numpy and scipy
made it), and a fit worked by hand. With TRACE_RL_VIP_GP_REFERENCE naming upstream's file (docs/baselines.md):
the same on fresh random sequences, and a check that the recorded table is what that file computes here.
`python tests/predictors/test_gp.py`, with the variable set and PYTHONPATH=src:tests, rewrites the table."""

import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from helpers_upstream import load_fixture, provenance, upstream_code, upstream_or_skip, write_fixture

from trace_rl.predictors.gp import PRIOR, GaussianProcessPredictor
from trace_rl.tree import RolloutTree

VAR = "TRACE_RL_VIP_GP_REFERENCE"
FIXTURE = Path(__file__).with_name("vip_gp_upstream.json")


def universe(seed: int, size: int = 60, dim: int = 16):
    """Unit embeddings in six clusters (near and far prompts), their distance matrix, and one tree per prompt."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(6, dim))[rng.integers(0, 6, size)] + 0.15 * rng.normal(size=(size, dim))
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    return e, distances(e), [RolloutTree(0, prompt=i) for i in range(size)]


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


def distances(e):
    return np.sqrt(np.maximum(((e[:, None] - e[None]) ** 2).sum(-1), 0.0))


def steps(seed: int, count: int = 15):
    """(fitted prompts, their success rates, prompts to predict) per step: a random batch of 12 (0 and 1 included:
    logits +-13.8), then 20 others."""
    rng = np.random.default_rng(seed + 10)
    for _ in range(count):
        batch = rng.choice(60, size=12, replace=False)
        y = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=12)
        yield batch, y, rng.choice(60, size=20, replace=False)


def upstream_logits(module, e, sequence):
    """Upstream's GPR as the trainer builds it, over the prompts with embeddings e: the predicted logits per step."""
    index = {i: i for i in range(len(e))}
    ref = module.GPR(
        distances(e), reuse_covariance=False, reuse_mean=True, return_std=False, qid_to_idx=index, prior_value=-5
    )
    out = []
    for batch, y, query in sequence:
        ref.fit_qids(list(batch), y)
        out.append(logit(ref.predict_qids(list(query))[0]))
    return out


def port_logits(e, sequence):
    trees = [RolloutTree(0, prompt=i) for i in range(len(e))]
    gp = GaussianProcessPredictor(Lookup(e))
    assert np.allclose(gp.predict(roots(trees, range(len(e)))), 1 / (1 + np.exp(5)))  # the prior before any fit
    out = []
    for batch, y, query in sequence:
        gp.update(roots(trees, batch), y)
        out.append(logit(gp.predict(roots(trees, query))))
    return out


@cache
def recorded() -> dict:
    return load_fixture(FIXTURE)


def recorded_sequence():
    return [(np.array(s["fit"]), np.array(s["y"]), np.array(s["query"])) for s in recorded()["steps"]]


def test_the_port_is_upstreams_gpr_on_the_recorded_steps():
    """The logits agree to 1e-9 although upstream updates a dense mean and the port sums lazily."""
    e = np.array(recorded()["embeddings"])
    want = [np.array(s["logits"]) for s in recorded()["steps"]]
    assert e.shape == (60, 16) and len(want) == 15
    assert {0.0, 1.0} <= {y for s in recorded()["steps"] for y in s["y"]}  # the clipped logits +-13.8 too
    for got, w in zip(port_logits(e, recorded_sequence()), want):
        assert np.max(np.abs(got - w)) < 1e-9


@pytest.fixture(scope="module")
def upstream():
    pytest.importorskip("scipy")  # upstream's Cholesky; scipy comes with the `plots` extra
    return upstream_or_skip(VAR)


def test_the_recorded_table_is_what_upstream_computes(upstream):
    e = np.array(recorded()["embeddings"])
    for got, s in zip(upstream_logits(upstream, e, recorded_sequence()), recorded()["steps"]):
        assert got == pytest.approx(s["logits"], abs=1e-10), recorded()["provenance"]["versions"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_port_is_upstreams_gpr_as_the_trainer_drives_it(upstream, seed):
    e, _, _ = universe(seed)
    sequence = list(steps(seed))
    for got, want in zip(port_logits(e, sequence), upstream_logits(upstream, e, sequence)):
        assert np.max(np.abs(got - want)) < 1e-9


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


# ---------------------------------------------------------------------------------------------------------
# the recorded table: `python tests/predictors/test_gp.py` with TRACE_RL_VIP_GP_REFERENCE set


def main() -> None:
    module = upstream_code.load(VAR)
    if module is None:
        sys.exit(upstream_code.unset_line(VAR))
    e = np.round(universe(0)[0], 6)  # the recorded embeddings are exactly what upstream was given
    sequence = list(steps(0))
    import numpy
    import scipy

    what = (
        "GPR(Euclidean distances of the embeddings, reuse_covariance=False, reuse_mean=True, "
        "return_std=False, prior_value=-5): per step fit_qids(fit, y), then the logit of predict_qids(query)"
    )
    versions = f"numpy {numpy.__version__}, scipy {scipy.__version__}"
    rows = [
        {"fit": b.tolist(), "y": y.tolist(), "query": q.tolist(), "logits": lg.tolist()}
        for (b, y, q), lg in zip(sequence, upstream_logits(module, e, sequence))
    ]
    write_fixture(
        FIXTURE,
        provenance(VAR, "tests/predictors/test_gp.py", versions, what),
        {"embeddings": e.tolist(), "steps": rows},
    )
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
