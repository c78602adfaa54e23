"""stats.py on hand-computed cases: t intervals against table values, the paired bootstrap on differences whose
bootstrap distribution can be enumerated, and the first crossing of a target by linear interpolation."""

import math

import pytest

from trace_rl.stats import cost_to_target, cost_to_target_ci, mean_ci, paired_bootstrap_ci, t_quantile


@pytest.mark.parametrize(
    "q, df, table",
    [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 7, 2.3646), (0.95, 4, 2.1318), (0.975, 1000, 1.9623)],
)
def test_t_quantile_matches_the_printed_table(q, df, table):
    assert t_quantile(q, df) == pytest.approx(table, abs=1e-4)
    assert t_quantile(1 - q, df) == pytest.approx(-table, abs=1e-4)


def test_mean_ci_is_the_t_interval():
    # mean 2, sd 1, n 3: half width = 4.3027 / sqrt(3) = 2.4841
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0
    assert lo == pytest.approx(2.0 - 2.48414, abs=1e-4) and hi == pytest.approx(2.0 + 2.48414, abs=1e-4)
    # 90%: t(0.95, 2) = 2.9200 -> half 1.6859
    _, lo, hi = mean_ci([1.0, 2.0, 3.0], level=0.9)
    assert hi - 2.0 == pytest.approx(1.68587, abs=1e-4)


def test_mean_ci_of_one_value_has_nan_bounds_and_equal_values_a_point():
    m, lo, hi = mean_ci([0.7])
    assert m == 0.7 and math.isnan(lo) and math.isnan(hi)
    assert mean_ci([0.5, 0.5, 0.5]) == (0.5, 0.5, 0.5)
    assert all(math.isnan(v) for v in mean_ci([]))
    with pytest.raises(ValueError, match="level"):
        mean_ci([1.0, 2.0], level=95)


def test_paired_bootstrap_uses_the_differences_not_the_means():
    # the methods' values vary a lot across seeds, their difference does not: the interval is the point 0.02
    a = [0.30, 0.52, 0.71, 0.90]
    b = [0.28, 0.50, 0.69, 0.88]
    m, lo, hi = paired_bootstrap_ci(a, b)
    assert m == pytest.approx(0.02) and lo == pytest.approx(0.02) and hi == pytest.approx(0.02)


def test_paired_bootstrap_on_two_pairs_spans_the_two_differences():
    # differences (0, 1): resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the 2.5% and
    # 97.5% percentiles of 10,000 draws are 0 and 1; a 40% interval lies inside the middle value 0.5
    m, lo, hi = paired_bootstrap_ci([1.0, 2.0], [1.0, 1.0])
    assert (m, lo, hi) == (0.5, 0.0, 1.0)
    _, lo, hi = paired_bootstrap_ci([1.0, 2.0], [1.0, 1.0], level=0.4)
    assert lo == hi == 0.5


def test_paired_bootstrap_matches_the_enumerated_bootstrap_distribution():
    # differences (0, 1, 3): the 27 equally likely resamples have means 0 (1 of 27), 1/3 (3), 2/3 (3), 1 (4),
    # 4/3 (6), 5/3 (3), 2 (3), 7/3 (3), 3 (1); cumulative 0.037, 0.148, 0.259, 0.407, 0.630, 0.741, 0.852,
    # 0.963, 1. So the 10% / 90% percentiles are 1/3 and 7/3, the 25% / 75% ones 2/3 and 2.
    d, zero = [0.0, 1.0, 3.0], [0.0, 0.0, 0.0]
    m, lo, hi = paired_bootstrap_ci(d, zero, level=0.8, n_boot=50_000)
    assert m == pytest.approx(4 / 3) and lo == pytest.approx(1 / 3) and hi == pytest.approx(7 / 3)
    _, lo, hi = paired_bootstrap_ci(d, zero, level=0.5, n_boot=50_000)
    assert lo == pytest.approx(2 / 3) and hi == pytest.approx(2.0)
    assert paired_bootstrap_ci(d, zero, seed=3) == paired_bootstrap_ci(d, zero, seed=3)


def test_paired_bootstrap_rejects_unpaired_input_and_gives_nan_bounds_for_one_pair():
    with pytest.raises(ValueError, match="one length"):
        paired_bootstrap_ci([1.0, 2.0], [1.0])
    m, lo, hi = paired_bootstrap_ci([0.6], [0.5])
    assert m == pytest.approx(0.1) and math.isnan(lo) and math.isnan(hi)


def test_cost_to_target_interpolates_the_first_crossing():
    costs, acc = [0, 100, 200, 300], [0.40, 0.50, 0.70, 0.60]
    # 0.6 is crossed between 100 (0.5) and 200 (0.7): halfway, 150; the later dip back to 0.6 does not count
    assert cost_to_target(costs, acc, 0.6) == pytest.approx(150.0)
    assert cost_to_target(costs, acc, 0.65) == pytest.approx(175.0)
    assert cost_to_target(costs, acc, 0.7) == pytest.approx(200.0)  # reached exactly at an evaluation
    assert cost_to_target(costs, acc, 0.3) == 0.0  # the start already reaches it
    assert math.isnan(cost_to_target(costs, acc, 0.8))  # never reached
    # token costs work the same way
    assert cost_to_target([0, 5000, 12000], [0.1, 0.1, 0.3], 0.2) == pytest.approx(8500.0)


def test_cost_to_target_ci_averages_the_seeds_that_reached_it_and_counts_them():
    curves = [([0, 100, 200], [0.4, 0.5, 0.7]), ([0, 100, 200], [0.4, 0.6, 0.7]), ([0, 100], [0.1, 0.2])]
    m, lo, hi, n = cost_to_target_ci(curves, 0.6)
    # crossings 150 and 100 (the third never gets there): mean 125, sd 35.355, t(0.975, 1) = 12.7062
    assert n == 2 and m == pytest.approx(125.0)
    assert hi - m == pytest.approx(12.7062 * 35.3553 / math.sqrt(2), rel=1e-4)
    assert lo == 0.0  # the t interval reaches 125 - 317.7: a cost is cut at 0
    _, lo, hi, _ = cost_to_target_ci([([0, 200], [0.4, 0.8]), ([0, 220], [0.4, 0.8])], 0.6)  # 100 and 110
    half = 12.7062 * 7.0711 / math.sqrt(2)
    assert (lo, hi) == pytest.approx((105.0 - half, 105.0 + half), rel=1e-4)  # above 0: left as it is
    # per-seed targets (e.g. GRPO's final accuracy on each seed)
    m, _, _, n = cost_to_target_ci(curves, [0.5, 0.7, 0.1])
    assert n == 3 and m == pytest.approx((100 + 200 + 0) / 3)
    with pytest.raises(ValueError, match="targets"):
        cost_to_target_ci(curves, [0.5, 0.6])
