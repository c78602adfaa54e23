"""Calibration of V~ and of the flip probability: the binning and ECE against hand computations, the tables of a
hand-built tree, and the claim of the module docstring (a calibrated V~ that cannot tell states apart
over-predicts flips by twice the variance it leaves unexplained; recalibrating V~ does not close that gap, it
closes a miscalibrated one)."""

import numpy as np
import pytest

from trace_rl.predictors.calibration import (
    calibration_tables,
    depth_names,
    ece,
    flip_share_interval,
    gap_verdict,
    reliability,
    step_calibration,
    summary,
)
from trace_rl.predictors.diagnostics import calibration_error, flip_rows, node_records
from trace_rl.tree import BRANCH, RolloutTree


def test_reliability_bins_and_ece_by_hand():
    pred = [0.05, 0.15, 0.12, 0.95, 1.0]  # 1.0 falls in the last bin, not an eleventh
    outcome = [0, 1, 0, 1, 0]
    rows = reliability(pred, outcome)
    assert [(r["lo"], r["hi"], r["n"]) for r in rows] == [(0.0, 0.1, 1), (0.1, 0.2, 2), (0.9, 1.0, 2)]
    assert [r["pred"] for r in rows] == pytest.approx([0.05, 0.135, 0.975])
    assert [r["real"] for r in rows] == pytest.approx([0.0, 0.5, 0.5])
    # (1 * 0.05 + 2 * 0.365 + 2 * 0.475) / 5
    assert ece(rows) == pytest.approx(1.73 / 5)
    assert calibration_error(pred, outcome) == pytest.approx(1.73 / 5)  # the older tables bin the same way
    # a weight counts as that many samples: the first prediction twice
    assert ece(reliability(pred, outcome, weight=[2, 1, 1, 1, 1])) == pytest.approx(1.78 / 6)
    s = summary(pred, outcome, bins=2)  # two bins: [0, 0.5) holds three, [0.5, 1] two
    assert s["n"] == 5 and s["pred"] == pytest.approx(np.mean(pred)) and s["real"] == pytest.approx(0.4)
    assert s["ece"] == pytest.approx((3 * abs(0.32 / 3 - 1 / 3) + 2 * abs(0.975 - 0.5)) / 5)
    assert np.isnan(ece([])) and summary([], []) == {}


def test_reliability_refuses_what_is_not_a_probability():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        reliability([0.2, 1.5], [0, 1])
    with pytest.raises(ValueError, match="shape"):
        reliability([0.2, 0.5], [0])
    with pytest.raises(ValueError, match="bins"):
        reliability([0.2], [0], bins=0)
    with pytest.raises(ValueError, match="max_depth"):
        depth_names(0)


def hand_tree() -> RolloutTree:
    """Root V~ 0.6; bare rollout 0: a0 (V~ 0.7) -> success; bare rollout 1: a1 (V~ 0.2) -> a1b (V~ 0.4) -> failure.
    Continuations: from a0 a failure and a success (one flip), from a1b a success (a flip)."""
    t = RolloutTree(0, predicted=0.6)
    a0 = t.add_turn("0", predicted=0.7)
    t.add_turn(a0.node_id, terminal=True, reward=1.0)
    a1 = t.add_turn("0", predicted=0.2)
    a1b = t.add_turn(a1.node_id, predicted=0.4)
    t.add_turn(a1b.node_id, terminal=True, reward=0.0)
    t.add_turn(a0.node_id, terminal=True, reward=0.0, origin=BRANCH)
    t.add_turn(a0.node_id, terminal=True, reward=1.0, origin=BRANCH)
    t.add_turn(a1b.node_id, terminal=True, reward=1.0, origin=BRANCH)
    t.compute_targets()
    return t


def test_node_records_carry_the_outcomes_no_choice_biased():
    recs = {r["depth"]: r for r in node_records([hand_tree()]) if r["predicted"] != 0.2}
    assert recs[0]["bare_rollouts"] == 2 and recs[0]["bare_successes"] == 1  # continuations are not bare
    assert recs[1]["bare_reward"] == 1.0 and recs[1]["continuations"] == 2 and recs[1]["flips"] == 1
    unchosen = next(r for r in node_records([hand_tree()]) if r["predicted"] == 0.2)
    assert unchosen["bare_reward"] == 0.0 and "continuations" not in unchosen  # every anchor, chosen or not


def test_tables_of_a_hand_built_tree():
    tab = calibration_tables(node_records([hand_tree()]), max_depth=2)
    assert tab["roots"]["n"] == 2 and tab["roots"]["pred"] == 0.6 and tab["roots"]["real"] == 0.5
    assert tab["roots"]["ece"] == pytest.approx(0.1)
    d1, d2, every = tab["prefixes"]["1"], tab["prefixes"]["2+"], tab["prefixes"]["all"]
    assert d1["n"] == 2 and d1["pred"] == pytest.approx(0.45) and d1["real"] == 0.5
    assert d1["ece"] == pytest.approx((0.2 + 0.3) / 2)  # V~ 0.2 -> failure, V~ 0.7 -> success
    assert d2["n"] == 1 and d2["ece"] == pytest.approx(0.4)
    assert every["n"] == 3 and every["ece"] == pytest.approx((0.2 + 0.4 + 0.3) / 3)
    f1, f2, fall = tab["flips"]["1"], tab["flips"]["2+"], tab["flips"]["all"]
    # a0 after a success: q = 1 - 0.7, two continuations, one flip; its bin at depth 1 realised 1, so recal q = 0
    assert f1 == pytest.approx(
        {
            "chosen": 1,
            "continuations": 2,
            "pred": 0.3,
            "raw": 0.3,  # no flip_pred on the nodes: stage 2 read q from V~
            "recal": 0.0,
            "real": 0.5,
            "real_lo": flip_share_interval([1], [2])[0],  # one anchor: Wilson's on its two continuations
            "real_hi": flip_share_interval([1], [2])[1],
            "anchors_pred": (0.3 + 0.2) / 2,
        }
    )
    # a1b after a failure: q = V~ = 0.4, one continuation, one flip; its bin realised 0, so recal q = 0
    lo, hi = flip_share_interval([1], [1])
    assert f2 == pytest.approx(
        {"chosen": 1, "continuations": 1, "pred": 0.4, "raw": 0.4, "recal": 0.0, "real": 1.0, "anchors_pred": 0.4}
        | {"real_lo": lo, "real_hi": hi}
    )
    assert 0.2 < lo < 0.21 and hi == 1.0  # one flip in one continuation: Wilson's [0.207, 1]
    assert fall["continuations"] == 3 and fall["pred"] == pytest.approx((0.3 * 2 + 0.4) / 3)
    assert fall["real"] == pytest.approx(2 / 3) and fall["anchors_pred"] == pytest.approx(0.3)
    assert [(b["lo"], b["n"], b["real"]) for b in tab["flips_by_q"]] == [(0.3, 2, 0.5), (0.4, 1, 1.0)]
    # by the bare outcome: a0 is the only chosen anchor after a success, a1b the only one after a failure
    by_r = tab["flips_by_outcome"]
    assert sorted(by_r["success"]) == ["1", "all"] and sorted(by_r["failure"]) == ["2+", "all"]
    for outcome, depth, ref in (("success", "1", f1), ("failure", "2+", f2)):
        for key in ("continuations", "pred", "real", "real_lo", "real_hi"):
            assert by_r[outcome][depth][key] == pytest.approx(ref[key])
            assert by_r[outcome]["all"][key] == pytest.approx(ref[key])


def test_the_flip_stage_2_allocated_on_is_what_the_tables_predict_and_q_of_v_stays_beside_it():
    tree = hand_tree()
    tree["0.0"].flip_predicted, tree["0.1"].flip_predicted, tree["0.1.0"].flip_predicted = 0.1, 0.05, 0.6
    recs = node_records([tree])
    assert sorted(r["flip_pred"] for r in recs if "bare_reward" in r) == [0.05, 0.1, 0.6]
    tab = calibration_tables(recs, max_depth=2)
    f1, f2, fall = tab["flips"]["1"], tab["flips"]["2+"], tab["flips"]["all"]
    assert (f1["pred"], f1["raw"], f1["anchors_pred"]) == pytest.approx((0.1, 0.3, (0.1 + 0.05) / 2))
    assert (f2["pred"], f2["raw"]) == pytest.approx((0.6, 0.4))
    assert fall["pred"] == pytest.approx((0.1 * 2 + 0.6) / 3) and fall["raw"] == pytest.approx((0.3 * 2 + 0.4) / 3)
    assert [(b["lo"], b["n"]) for b in tab["flips_by_q"]] == [(0.1, 2), (0.6, 1)]  # binned by what it allocated on
    step = step_calibration(recs)
    assert step["flip_pred"] == pytest.approx(fall["pred"]) and step["flip_raw"] == pytest.approx(fall["raw"])
    assert flip_rows(recs)["prefixes"]["pred_flip"] == pytest.approx(fall["pred"])  # the older table agrees


def test_step_metrics_name_depth_bins_and_leave_out_what_a_step_lacks():
    out = step_calibration(node_records([hand_tree()]))
    assert out["calib_root_n"] == 2 and out["calib_root_ece"] == pytest.approx(0.1)
    assert out["calib_prefix_n"] == 3 and out["calib_prefix_d1_n"] == 2 and out["calib_prefix_d2_real"] == 0.0
    assert out["flip_d1_pred"] == pytest.approx(0.3) and out["flip_d2_real"] == 1.0 and out["flip_chosen"] == 2
    assert not any(k.startswith(("calib_prefix_d3", "flip_d3", "calib_prefix_d4plus")) for k in out)
    assert "flip_recal" not in out  # in-sample on one step's anchors: left to diagnose
    assert all(isinstance(v, (int, float)) for v in out.values())
    roots_only = step_calibration([r for r in node_records([hand_tree()]) if r["depth"] == 0])
    assert set(roots_only) == {"calib_root_n", "calib_root_pred", "calib_root_real", "calib_root_ece"}
    assert step_calibration([]) == {}


def _anchor_records(v_true: np.ndarray, v_pred: float, rng: np.random.Generator) -> list[dict]:
    """One chosen anchor per true V: its rollout's outcome r and one continuation, both drawn from V."""
    r = rng.uniform(size=v_true.size) < v_true
    c = rng.uniform(size=v_true.size) < v_true
    return [
        {"depth": 1, "predicted": v_pred, "bare_reward": float(ri), "continuations": 1, "flips": int(ri != ci)}
        for ri, ci in zip(r, c)
    ]


def test_a_calibrated_v_that_sees_nothing_over_predicts_flips_by_twice_the_variance():
    rng = np.random.default_rng(0)
    v = rng.choice([0.1, 0.9], size=20_000)  # V(H) far from 1/2 either way; V~ = 1/2 is its mean: calibrated
    tab = calibration_tables(_anchor_records(v, 0.5, rng), max_depth=1)
    assert tab["prefixes"]["all"]["ece"] < 0.02
    flips = tab["flips"]["all"]
    assert flips["pred"] == 0.5
    assert flips["real"] == pytest.approx(2 * 0.1 * 0.9, abs=0.015)  # 2 V (1 - V), not 2 V~ (1 - V~)
    assert flips["pred"] - flips["real"] == pytest.approx(2 * np.var([0.1, 0.9]), abs=0.015)
    assert flips["recal"] == pytest.approx(0.5, abs=0.02)  # recalibrating V~ cannot see the states either


def test_recalibration_closes_a_gap_that_is_miscalibration():
    rng = np.random.default_rng(1)
    tab = calibration_tables(_anchor_records(np.full(20_000, 0.2), 0.5, rng), max_depth=1)
    flips = tab["flips"]["all"]
    assert tab["prefixes"]["all"]["ece"] == pytest.approx(0.3, abs=0.01)
    assert flips["pred"] == 0.5 and flips["real"] == pytest.approx(0.32, abs=0.015)
    assert flips["recal"] == pytest.approx(flips["real"], abs=0.015)


def test_flip_share_interval_is_wilsons_on_independent_continuations():
    # 5 flips in 10 single continuations: Wilson's 95% interval is [0.2366, 0.7634] (textbook value); 0 of 20 keeps a
    # non-empty interval (a bin with no flip does not prove a rate of 0)
    lo, hi = flip_share_interval(np.r_[np.ones(5), np.zeros(5)], np.ones(10))
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    lo, hi = flip_share_interval(np.zeros(20), np.ones(20))
    assert lo == 0.0 and hi == pytest.approx(3.8415 / (20 + 3.8415), abs=1e-4)
    assert flip_share_interval([], []) == (0.0, 1.0)


def test_flip_share_interval_widens_when_an_anchors_continuations_agree():
    # 40 anchors x 3 continuations, 60 flips: all-or-nothing per anchor is worth 40 draws, not 120
    c = np.full(40, 3.0)
    together = flip_share_interval(np.r_[np.full(20, 3.0), np.zeros(20)], c)
    spread = flip_share_interval(np.r_[np.full(20, 1.0), np.full(20, 2.0)], c)
    independent = flip_share_interval(np.r_[np.ones(60), np.zeros(60)], np.ones(120))
    assert together[1] - together[0] > 1.5 * (independent[1] - independent[0])
    assert spread == pytest.approx(independent, abs=0.02)  # less spread than binomial: never narrower than Wilson's


def test_flip_share_interval_covers_the_true_rate_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    covered = 0
    # depth bins of 30-150 anchors with 1-5 continuations and anchor-level rates around 0.25, spread enough that an
    # interval that ignored the anchors (plain Wilson on continuations) covers about 85% of the time
    for _ in range(2000):
        k = int(rng.integers(30, 150))
        c = rng.integers(1, 6, size=k).astype(float)
        p = rng.beta(0.5, 1.5, size=k)
        f = rng.binomial(c.astype(int), p).astype(float)
        lo, hi = flip_share_interval(f, c)
        covered += lo <= 0.25 <= hi
    assert 0.93 <= covered / 2000 <= 0.97


def test_gap_verdict_says_what_a_bin_of_its_size_can_show():
    # a depth bin of 62 continuations realising 0.32 where 0.22 was predicted cannot say whether the gap is under 5
    lo, hi = flip_share_interval(np.r_[np.ones(20), np.zeros(42)], np.ones(62))
    assert gap_verdict(0.22, lo, hi) == "too few"
    big = np.ones(2000)
    lo, hi = flip_share_interval(np.r_[np.ones(640), np.zeros(1360)], big)  # 0.32 on 2,000
    assert gap_verdict(0.22, lo, hi) == "misses" and gap_verdict(0.32, lo, hi) == "holds"
    assert gap_verdict(0.40, lo, hi) == "misses" and gap_verdict(0.34, lo, hi, bound=0.01) == "too few"
