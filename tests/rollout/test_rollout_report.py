"""The one report of methods x seeds at equal cost: curves, the equal-cost reading, intervals and their text,
the table; by hand, on records built here."""

import math

import numpy as np
import pytest

from trace_rl.rollout.report import (
    accuracy_at,
    accuracy_curve,
    at_equal_cost,
    cost_points,
    cost_to_target,
    format_interval,
    format_over_seeds,
    format_table,
    interval,
    paired_at_equal_cost,
    paired_interval,
    run_means,
    summarize_over_seeds,
)


def _records(costs, accs, total_key=None):
    """One record per step: `cost` spent that step (and its running total under total_key), an evaluation
    where accs has a value."""
    recs, spent = [], 0
    for c, a in zip(costs, accs):
        spent += c
        r = {"cost": c}
        if total_key:
            r[total_key] = spent
        if a is not None:
            r["eval/accuracy"] = a
        recs.append(r)
    return recs


def test_a_curve_starts_at_zero_and_sums_or_reads_the_cost():
    recs = _records([10, 10, 5, 5], [None, 0.4, None, 0.5], total_key="total")
    xs, ys = accuracy_curve(recs, 0.2, "cost")
    assert xs.tolist() == [0, 20, 30] and ys.tolist() == [0.2, 0.4, 0.5]
    assert accuracy_curve(recs, 0.2, "total", running_total=True)[0].tolist() == [0, 20, 30]
    assert accuracy_curve(recs, 0.2, "total")[0].tolist() == [0, 30, 85]  # a running total summed is wrong
    assert accuracy_at((xs, ys), 25) == pytest.approx(0.45)


def test_equal_cost_reads_both_curves_at_the_smaller_final_cost():
    cheap = (np.array([0.0, 50.0]), np.array([0.2, 0.6]))
    dear = (np.array([0.0, 100.0]), np.array([0.2, 1.0]))
    assert at_equal_cost(cheap, dear) == pytest.approx((0.6, 0.6))  # dear read half way: 0.2 + 0.4
    assert at_equal_cost(dear, cheap) == pytest.approx((0.6, 0.6))
    pair = paired_at_equal_cost([cheap, cheap], [dear, (np.array([0.0, 50.0]), np.array([0.2, 0.4]))])
    assert pair["per_seed"] == pytest.approx([0.0, 0.2]) and pair["mean"] == pytest.approx(0.1)
    assert pair["lo"] == pytest.approx(0.0) and pair["hi"] == pytest.approx(0.2)  # resampled means 0, 0.1, 0.2
    with pytest.raises(ValueError, match="same seeds"):
        paired_at_equal_cost([cheap], [])


def test_intervals_are_the_stats_figures_as_dicts():
    t = interval([0.7, 0.5])
    assert t["mean"] == pytest.approx(0.6) and t["hi"] - 0.6 == pytest.approx(1.27062, rel=1e-4)  # t, 1 df
    assert math.isnan(interval([0.5])["lo"])
    assert paired_interval([0.5, 0.7], [0.5, 0.5])["mean"] == pytest.approx(0.1)
    curves = [(np.array([0.0, 10.0, 20.0]), np.array([0.2, 0.5, 0.7])), (np.array([0.0, 10.0]), np.array([0.2, 0.3]))]
    reach = cost_to_target(curves, [0.6, 0.6])
    assert reach["reached"] == 1 and reach["mean"] == pytest.approx(15.0)
    assert run_means([[{"k": 1.0}, {"k": 3.0}, {}], [{}]], "k")[0] == 2.0 and math.isnan(run_means([[{}]], "k")[0])


def test_one_text_form_of_an_interval():
    v = {"mean": 0.05, "lo": 0.0, "hi": 0.1}
    assert format_interval(v) == "0.050 [0.000, 0.100]"
    assert format_interval(v, signed=True) == "+0.050 [+0.000, +0.100]"
    assert format_interval({"mean": 0.5, "lo": math.nan, "hi": math.nan}) == "0.500"  # one seed: no interval
    assert format_interval(None) == "-" and format_interval({"mean": math.nan, "lo": 0, "hi": 0}) == "-"
    cost = {"mean": 1234.4, "lo": 1000.0, "hi": 1500.0, "reached": 2}
    assert format_interval(cost, 0) == "1234 [1000, 1500] (2 seeds)"
    assert format_interval({**cost, "seeds": 3}, 0, sep=",") == "1,234 [1,000, 1,500] (2/3)"


def test_one_table_right_aligned_with_a_rule_or_plain():
    rows = [{"method": "grpo", "x": 0.5, "n": 12}, {"method": "trace_long", "x": 0.25}]
    assert format_table(rows).splitlines() == [
        "method          x   n",
        "----------  -----  --",
        "grpo        0.500  12",
        "trace_long  0.250    ",
    ]
    assert format_table(rows, right_align=False, rule=False).splitlines() == [
        "method      x      n ",
        "grpo        0.500  12",
        "trace_long  0.250    ",
    ]


def test_cost_points_place_every_seed_at_the_mean_cost_of_its_evaluation():
    pts = cost_points([(np.array([0.0, 100.0]), np.array([0.4, 0.6])), (np.array([0.0, 120.0]), np.array([0.5, 0.7]))])
    assert [[p["step"] for p in seed] for seed in pts] == [[-1, 109], [-1, 109]]
    assert [p["eval/accuracy"] for p in pts[1]] == [0.5, 0.7]


def test_rollout_figures_over_seeds_by_hand():
    def rec(er, continuations=0, flips=0):
        return {
            "rollout/effective_ratio": er,
            "rollout/contrast_groups": 1,
            "rollout/rollouts": 10,
            "rollout/continuations": continuations,
            "rollout/flips": flips,
            "rollout/generated_tokens": 100,
        }

    def seed(s, *records):
        return {"seed": s, "pair": f"seed{s}", "records": list(records)}

    runs = {
        "grpo": [seed(0, rec(0.2), rec(0.4)), seed(1, rec(0.4), rec(0.4))],
        "trace": [seed(0, rec(0.6, 4, 1), rec(0.8, 4, 3)), seed(1, rec(0.6, 4, 2), rec(0.6, 4, 0))],
    }
    rows = {r["method"]: r for r in summarize_over_seeds(runs)}
    t = rows["trace"]
    assert t["baseline"] == "grpo" and t["effective_ratio"]["per_seed"] == pytest.approx([0.7, 0.6])
    # t interval over two seeds: 0.65 +- t(0.975, 1) * std(0.7, 0.6) / sqrt(2) = 0.65 +- 12.706 * 0.05
    assert t["effective_ratio"]["hi"] - 0.65 == pytest.approx(12.7062 * 0.05, rel=1e-4)
    # paired with GRPO's 0.3 and 0.4 on the same seeds: differences 0.4 and 0.2
    assert t["effective_ratio_diff"]["mean"] == pytest.approx(0.3) and t["effective_ratio_diff"]["seeds"] == 2
    assert t["er_ratio"] == pytest.approx(0.65 / 0.35)
    assert t["flip_rate"]["per_seed"] == pytest.approx([0.5, 0.25]) and math.isnan(rows["grpo"]["flip_rate"]["mean"])
    assert t["groups_per_1k"]["mean"] == pytest.approx(100.0) and t["tokens"] == pytest.approx(200.0)
    table = format_over_seeds(list(rows.values()))
    assert "er_diff_vs_grpo" in table and "+0.300 [" in table and "1.86" in table
