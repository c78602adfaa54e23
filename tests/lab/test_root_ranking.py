"""lab/scripts/root_ranking.py: disagreement estimates exact on the samples and unbiased, the greedy split of the extra
rollouts equal to brute force, a fit that recovers its weights, folds that never see their own targets, and the
whole study on a hand-built checkpoint and eval whose two halves mirror each other."""

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("scipy")

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "scripts" / "root_ranking.py"
_spec = importlib.util.spec_from_file_location("root_ranking", SCRIPT)
root_ranking = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root_ranking)


def test_the_disagreement_estimates_are_exact_on_the_samples_and_unbiased():
    import itertools
    from math import comb

    for k in range(9):
        outcomes = [1] * k + [0] * (8 - k)
        for m in (2, 3, 8):  # every group of m of the 8 outcomes, drawn without replacement
            groups = list(itertools.combinations(outcomes, m))
            want = np.mean([len(set(g)) == 2 for g in groups])
            assert root_ranking.mixed_prob(np.array([k]), np.array([m]))[0] == pytest.approx(want)
        for first, e in ((1, 3), (0, 2)):  # the e extra rollouts all repeat the probe's outcome, or not
            want = 1 - np.mean([all(x == first for x in g) for g in itertools.combinations(outcomes, e)])
            assert root_ranking.probe_mixed(np.array([k]), np.array([first]), np.array([e]))[0] == pytest.approx(want)
    assert root_ranking.mixed_prob(np.array([4]), np.array([1]))[0] == 0.0  # one rollout never disagrees
    assert root_ranking.probe_mixed(np.array([4]), np.array([1]), np.array([0]))[0] == 0.0  # nor does a probe alone
    with pytest.raises(ValueError, match="more than 8"):
        root_ranking.mixed_prob(np.array([4]), np.array([9]))
    v = 0.3  # unbiased: the mean over k ~ Binomial(8, v) is the group's true chance of disagreeing
    pk = np.array([comb(8, k) * v**k * (1 - v) ** (8 - k) for k in range(9)])
    ks = np.arange(9)
    assert pk @ root_ranking.mixed_prob(ks, np.full(9, 3)) == pytest.approx(1 - v**3 - (1 - v) ** 3)
    assert pk @ root_ranking.probe_mixed(ks, np.ones(9, int), np.full(9, 4)) == pytest.approx(1 - v**4)


def test_probe_then_extend_is_the_best_split_of_the_extra_rollouts_by_brute_force():
    import itertools

    from scipy.special import betaln

    v, first = np.array([0.5, 0.9, 0.2, 0.6, 0.05]), np.array([1, 1, 0, 0, 1])
    probes, budget = 4, 9
    extra = root_ranking.probe_extend(v, first, probes, budget, strength=2.0)
    assert extra[4] == -1 and (extra[:4] >= 0).all()  # v = 0.05 is the least likely to disagree: not probed

    def value(e):  # sum over probed candidates of P(one of e extra differs from the probe) under its prior
        total = 0.0
        for i, ei in zip(range(4), e):
            a, b = 2.0 * v[i] + first[i], 2.0 * (1 - v[i]) + 1 - first[i]
            # P(all ei extra rollouts repeat the probe's outcome): E v^ei after a success, E (1-v)^ei after a failure
            same, other = (a, b) if first[i] else (b, a)
            total += 1.0 - np.exp(betaln(same + ei, other) - betaln(same, other))
        return total

    best = max(value(e) for e in itertools.product(range(8), repeat=4) if sum(e) <= budget - probes)
    assert sum(extra[:4]) == budget - probes and value(extra[:4]) == pytest.approx(best)


def test_the_logistic_fit_recovers_its_weights_and_the_folds_never_see_their_own_targets():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4000, 2))
    k = rng.binomial(8, 1 / (1 + np.exp(-(x @ [1.5, -0.5] + 0.3))))
    w, b = root_ranking.fit_logistic(x, k, 8, lam=1e-6)
    assert np.allclose(w, [1.5, -0.5], atol=0.08) and b == pytest.approx(0.3, abs=0.08)
    folds = np.arange(len(k)) % 4
    out = root_ranking.cross_validated(x, k, folds)
    changed = k.copy()
    changed[folds == 2] = 8 - changed[folds == 2]  # other targets in fold 2 only
    again = root_ranking.cross_validated(x, changed, folds)
    assert np.array_equal(out[folds == 2], again[folds == 2]) and not np.allclose(out[folds != 2], again[folds != 2])


def test_the_study_runs_on_a_checkpoint_and_an_eval_of_16_samples(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from trace_rl.envs.registry import get_env
    from trace_rl.experimental.root_calibration import RootCalibrator
    from trace_rl.lm.models import create_tiny_model
    from trace_rl.predictors.text import light_text_predictor

    ckpt = tmp_path / "global_step_1"
    model, tok = create_tiny_model(seed=0)
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    with open(ckpt / "predictor.pkl", "wb") as fh:
        pickle.dump(light_text_predictor(seed=0), fh)
    layer = RootCalibrator()
    layer.observe(np.array([0.3, 0.6]), np.array([4, 4]), np.array([3, 1]))
    (ckpt / "trainer_state.json").write_text(json.dumps({"root_model": layer.state_dict()}))
    run = tmp_path / "eval"
    run.mkdir()
    cfg = {"env": {"name": "calculator", "calculator": {"preset": "train"}}, "policy": {"model": str(ckpt)}}
    (run / "config.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    tasks = get_env("calculator", preset="train").benchmarks["calculator"](40)
    rng = np.random.default_rng(2)
    lines = []
    for i, task in enumerate(tasks):
        p = 0.9 if task["steps"] == 3 else 0.2  # the chain length decides half A; half B is its mirror image
        half_a = [float(rng.random() < p) for _ in range(8)]
        scores = half_a + [1.0 - x for x in half_a]
        lines += [json.dumps({"index": i, "sample": s, "score": x}) for s, x in enumerate(scores)]
    (run / "samples.jsonl").write_text("\n".join(lines))
    pytest.importorskip("matplotlib")
    root_ranking.main(
        [str(run), "--pools", "20", "--out", str(tmp_path / "out.json"), "--plot", str(tmp_path / "r.png")]
    )
    (res,) = json.loads((tmp_path / "out.json").read_text())
    rho = res["spearman_vs_half_b"]
    assert set(rho) == {
        "oracle, in-sample (optimistic)",
        "oracle (half A)",
        "V~ raw",
        "V~ root layer",
        "CV: policy hidden states",
        "CV: hashed n-grams",
        "CV: chain length",
        "all equal (0.5)",
    }
    # which half each value comes from: fitted on half A, scored against half B (here the reverse of A)
    assert rho["oracle, in-sample (optimistic)"] == pytest.approx(1.0) and rho["oracle (half A)"] == pytest.approx(-1.0)
    assert rho["CV: chain length"] < -0.5 and rho["all equal (0.5)"] == 0.0
    pools = res["pools"]
    assert pools["GRPO (8 x 8)"]["prompts"] == 8
    assert all(0.0 <= p["ratio"] <= 1.0 and p["prompts"] <= 16 for p in pools.values())
    assert {f"probe {k}, extend {32 - k} (V~ raw)" for k in (8, 12, 16)} <= set(pools)
    assert "stage-1 ER" in capsys.readouterr().out and (tmp_path / "r.png").stat().st_size > 0
