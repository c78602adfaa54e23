import itertools

import numpy as np
import pytest

from trace_rl.advantages import EPS
from trace_rl.allocation import root_value, spendable_root_budget, tie_order
from trace_rl.experimental.root_objectives import TEACH_ALPHA, allocate_by_value, allocate_roots_teach, teach_value


def outcomes(m):
    """Every outcome vector of m rollouts, as a (2^m, m) array of rewards."""
    return np.array(list(itertools.product([0.0, 1.0], repeat=m)))


def expected_over_outcomes(v, m, per_group):
    """E over the 2^m outcome vectors of per_group(rewards), with Bernoulli(v) rollouts (brute force)."""
    r = outcomes(m)
    prob = np.prod(np.where(r == 1.0, v, 1.0 - v), axis=1)
    return float(sum(p * per_group(x) for p, x in zip(prob, r)))


def step_along_logit(r, v, scale):
    """sum_j A_j (r_j - v) with GRPO's advantages (the centring and scale of trace_rl.advantages.grpo)."""
    a = r - r.mean()
    if scale == "std":
        a = a / (r.std() + EPS)
    return float(np.dot(a, r - v))


@pytest.mark.parametrize("v", [0.0, 0.03, 0.3, 0.5, 0.81, 1.0])
@pytest.mark.parametrize("m", [2, 3, 5, 8])
def test_teach_value_is_the_expected_step_it_claims(v, m):
    table = teach_value([v], m, 0.5)
    want = expected_over_outcomes(v, m, lambda r: step_along_logit(r, v, "std"))
    assert table[0, m] == pytest.approx(want, rel=1e-4, abs=1e-12)  # EPS on the std: equal to ~1e-5
    want = expected_over_outcomes(v, m, lambda r: step_along_logit(r, v, "none"))
    assert teach_value([v], m, 1.0)[0, m] == pytest.approx(want, abs=1e-12)
    assert teach_value([v], m, 1.0)[0, m] == pytest.approx((m - 1) * v * (1 - v), abs=1e-12)
    # alpha = 0: rows in mixed groups, m f(v, m), which is also E[sum_j A_j^2] under std scaling
    assert teach_value([v], m, 0.0)[0, m] == pytest.approx(m * float(root_value(v, m)), abs=1e-12)
    sq = expected_over_outcomes(v, m, lambda r: float(np.sum(((r - r.mean()) / (r.std() + EPS)) ** 2)))
    assert teach_value([v], m, 0.0)[0, m] == pytest.approx(sq, rel=1e-4, abs=1e-12)
    assert np.all(teach_value([v], m, 0.5)[0, :2] == 0.0)


def brute_force(values, budget):
    """Best sum_i values[i, m_i] over m_i in {0, 2..m_max} with sum m_i = the spendable budget, by enumeration."""
    n, mmax = values.shape[0], values.shape[1] - 1
    spend = spendable_root_budget(n, budget, mmax)
    if n == 0:
        return spend, 0.0
    grid = np.array(list(itertools.product([0, *range(2, mmax + 1)], repeat=n)), dtype=np.int64)
    grid = grid[grid.sum(axis=1) == spend]
    scores = values[np.arange(n)[None, :], grid].sum(axis=1)
    return spend, float(scores.max())


def random_table(rng, n, mmax):
    kind = rng.integers(4)
    if kind == 0:  # arbitrary values: no concavity, no monotonicity
        return rng.normal(size=(n, mmax + 1))
    if kind == 1:  # many exact ties
        return rng.integers(0, 3, size=(n, mmax + 1)).astype(float)
    v = rng.choice([0.0, 1.0, 0.5, 0.2, 0.8, rng.random()], n)
    return teach_value(v, mmax, float(rng.choice([0.0, 0.5, 1.0, rng.random()])))


def test_allocate_by_value_matches_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(1500):
        n, mmax = int(rng.integers(0, 5)), int(rng.integers(2, 6))
        budget = int(rng.integers(0, n * mmax + 4))  # includes budgets the pool cannot absorb, and odd ones
        values = random_table(rng, n, mmax)
        m = allocate_by_value(values, budget, seed=trial)
        spend, best = brute_force(values, budget)
        assert m.dtype.kind == "i" and m.shape == (n,) and m.sum() == spend
        assert not np.any(m == 1) and m.min(initial=0) >= 0 and m.max(initial=0) <= mmax
        assert values[np.arange(n), m].sum() == pytest.approx(best, abs=1e-9), (values, budget, m)


def test_named_objectives_match_brute_force_and_follow_the_budget_rule():
    rng = np.random.default_rng(1)
    for trial in range(300):
        n, mmax = int(rng.integers(1, 6)), int(rng.integers(2, 6))
        v = rng.choice([0.0, 1.0, 0.5, rng.random(), rng.random()], n)
        budget = int(rng.integers(0, n * mmax + 3))
        for objective, alpha in TEACH_ALPHA.items():
            m = allocate_roots_teach(v, budget, mmax, objective, seed=trial)
            spend, best = brute_force(teach_value(v, mmax, alpha), budget)
            assert m.sum() == spend
            assert teach_value(v, mmax, alpha)[np.arange(n), m].sum() == pytest.approx(best, abs=1e-9)


def test_the_unscaled_step_concentrates_on_the_prompts_nearest_one_half():
    """(m - 1) v (1 - v) is linear in m: the optimum fills the prompts with the largest v(1 - v) to m_max,
    skipping hopeless and solved ones, where TRACE's mixed-group count spreads the budget."""
    v = np.array([0.0, 0.5, 0.45, 0.9, 1.0, 0.6, 0.2, 0.0])
    m = allocate_roots_teach(v, 16, 8, "grad_unscaled")
    assert m.tolist() == [0, 8, 8, 0, 0, 0, 0, 0]
    assert allocate_roots_teach(v, 16, 8, "grad").tolist() == [0, 8, 8, 0, 0, 0, 0, 0]
    assert allocate_roots_teach(v, 17, 8, "grad")[[0, 4, 7]].sum() == 0  # odd budgets too: no m = 1


def test_ties_are_seeded_and_reproducible():
    v = np.full(10, 0.5)
    a = allocate_roots_teach(v, 16, 8, "grad", seed=3)
    assert np.array_equal(a, allocate_roots_teach(v, 16, 8, "grad", seed=3))
    assert set(np.flatnonzero(a)) == set(np.argsort(tie_order(10, 3))[:2])  # the first two in seeded order
    picks = {tuple(allocate_roots_teach(v, 16, 8, "grad", seed=s)) for s in range(20)}
    assert len(picks) > 1 and all(sorted(p)[-2:] == [8, 8] for p in picks)


def test_max_per_prompt_above_the_budget_is_capped():
    v = np.array([0.5, 0.3])
    assert allocate_roots_teach(v, 6, 10**6, "grad").tolist() == allocate_roots_teach(v, 6, 6, "grad").tolist()
    assert allocate_roots_teach(v, 6, 10**6, "grad").sum() == 6


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: allocate_roots_teach([0.5, 0.5], 4, 4, "mixed"), "objective must be one of rows"),
        (lambda: allocate_roots_teach([0.5, 1.5], 4, 4, "grad"), "v must hold probabilities"),
        (lambda: allocate_roots_teach([0.5], 4, 1, "grad"), "max_per_prompt"),
        (lambda: allocate_roots_teach([0.5], -1, 4, "grad"), "budget must be non-negative"),
        (lambda: allocate_roots_teach([0.5], 4, 4, "grad", seed=-2), "seed"),
        (lambda: teach_value([0.5], 4, 2.0), "alpha must be a number in"),
        (lambda: allocate_by_value(np.zeros((3, 2)), 4), "values must be a finite"),
        (lambda: allocate_by_value([[0.0, 0.0, np.nan]], 2), "values must be a finite"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
