import itertools

import numpy as np
import pytest

from trace_rl.allocation import (
    allocate_prefixes,
    allocate_roots,
    prefix_flip_prob,
    prefix_value,
    root_value,
    spendable_root_budget,
)


def knapsack_dp(v, budget, max_per_prompt, skip=True):
    """Brute-force exact DP over m_i in {0, 2..max} (or {2..max}): best value with exactly b rollouts."""
    choices = ([0] if skip else []) + list(range(2, max_per_prompt + 1))
    best = np.full(budget + 1, -np.inf)
    best[0] = 0.0
    for vi in v:
        nxt = np.full(budget + 1, -np.inf)
        for m in choices:
            if m <= budget:
                nxt[m:] = np.maximum(nxt[m:], best[: budget + 1 - m] + root_value(vi, m))
        best = nxt
    return best


def random_probs(rng, n):
    kind = rng.integers(5)
    if kind == 0:
        return rng.random(n)
    if kind == 1:
        return rng.choice([0.0, 1.0, 0.5, 0.3, 0.7], n)  # exact ties and hopeless / trivial prompts
    if kind == 2:
        return np.round(rng.random(n), 1)
    if kind == 3:
        return rng.choice([0.2, 0.8], n)  # v and 1-v give equal gains
    return rng.beta(0.3, 0.3, n)


def test_root_value_and_flip_prob():
    assert root_value(0.5, 2) == pytest.approx(0.5)
    assert root_value(0.5, 1) == 0.0 and root_value(0.5, 0) == 0.0
    assert root_value(0.0, 8) == 0.0 and root_value(1.0, 8) == 0.0
    assert prefix_flip_prob(1, 0.9) == pytest.approx(0.1)
    assert prefix_flip_prob(0, 0.9) == pytest.approx(0.9)


def test_roots_match_brute_force_dp_on_thousands_of_instances():
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(3000):
        n = int(rng.integers(0, 8))
        mmax = int(rng.integers(2, 7))
        budget = int(rng.integers(0, n * mmax + 5))  # includes budgets the pool cannot absorb
        v = random_probs(rng, n)
        m = allocate_roots(v, budget, mmax, seed=trial)
        spend = spendable_root_budget(n, budget, mmax)
        assert m.dtype.kind == "i" and m.shape == (n,)
        assert m.sum() == spend
        assert not np.any(m == 1) and m.min(initial=0) >= 0 and m.max(initial=0) <= mmax
        best = knapsack_dp(v, spend, mmax)[spend]
        assert root_value(v, m).sum() == pytest.approx(best, abs=1e-9), (v, budget, mmax, m)
        checked += 1
    assert checked == 3000


def test_roots_exact_on_larger_pools():
    rng = np.random.default_rng(1)
    for trial in range(40):
        v = random_probs(rng, 40)
        mmax = int(rng.integers(3, 9))
        budget = int(rng.integers(0, 40 * mmax))
        m = allocate_roots(v, budget, mmax, seed=trial)
        assert root_value(v, m).sum() == pytest.approx(knapsack_dp(v, int(m.sum()), mmax)[-1], abs=1e-9)


def test_budget_rule_when_exact_spend_is_impossible():
    assert spendable_root_budget(5, 1, 8) == 0  # one rollout alone is never allowed
    assert spendable_root_budget(5, 7, 2) == 6  # every prompt takes 0 or 2
    assert spendable_root_budget(3, 100, 4) == 12  # the pool absorbs at most B * m_max
    assert allocate_roots([0.5] * 5, 7, 2).sum() == 6
    assert allocate_roots([0.5, 0.5], 100, 4).tolist() == [4, 4]


def test_roots_skip_hopeless_and_trivial_prompts():
    m = allocate_roots([0.0, 1.0, 0.5, 0.4, 0.6, 1.0], 8, 8)
    assert m[0] == 0 and m[1] == 0 and m[5] == 0
    assert m[2:5].sum() == 8


def test_roots_ties_are_seeded_and_reproducible():
    v = np.full(10, 0.5)
    a = allocate_roots(v, 9, 4, seed=3)
    assert np.array_equal(a, allocate_roots(v, 9, 4, seed=3))
    picks = {tuple(allocate_roots(v, 9, 4, seed=s)) for s in range(20)}
    assert len(picks) > 1  # different seeds break the ties differently


def test_roots_without_skipping_give_everyone_two():
    rng = np.random.default_rng(2)
    for _ in range(200):
        v = random_probs(rng, 6)
        budget = int(rng.integers(12, 6 * 6 + 1))
        m = allocate_roots(v, budget, 6, skip=False)
        assert m.min() >= 2 and m.sum() == budget
        assert root_value(v, m).sum() == pytest.approx(knapsack_dp(v, budget, 6, skip=False)[budget], abs=1e-9)
    with pytest.raises(ValueError, match="budget"):
        allocate_roots([0.5, 0.5], 3, 4, skip=False)


def brute_prefix(q, budget):
    best = -1.0
    for counts in itertools.product(range(budget + 1), repeat=len(q)):
        if sum(counts) == budget:
            best = max(best, prefix_value(q, counts))
    return best


def test_prefixes_match_brute_force():
    rng = np.random.default_rng(3)
    for trial in range(1500):
        n = int(rng.integers(1, 5))
        budget = int(rng.integers(0, 7))
        q = random_probs(rng, n)
        k = allocate_prefixes(q, budget, seed=trial)
        assert k.sum() == budget and k.min() >= 0
        assert prefix_value(q, k) == pytest.approx(brute_prefix(q, budget), abs=1e-12)


def test_prefixes_spread_zero_gain_budget_and_handle_empty():
    k = allocate_prefixes([0.0, 0.0, 0.0], 6)
    assert k.tolist() == [2, 2, 2]
    k = allocate_prefixes([1.0, 0.0], 3)
    assert k[0] >= 1 and k.sum() == 3
    assert allocate_prefixes([], 5).size == 0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: allocate_roots([0.5, np.nan], 4, 4), "v must hold probabilities"),
        (lambda: allocate_roots([0.5, 1.2], 4, 4), "v must hold probabilities"),
        (lambda: allocate_roots([[0.5]], 4, 4), "v must be a 1-D"),
        (lambda: allocate_roots([0.5], -1, 4), "budget must be non-negative"),
        (lambda: allocate_roots([0.5], 2.5, 4), "budget must be a non-negative integer"),
        (lambda: allocate_roots([0.5], 4, 1), "max_per_prompt"),
        (lambda: allocate_prefixes([-0.1], 3), "flip_prob"),
        (lambda: allocate_prefixes([0.5], -2), "budget"),
        (lambda: allocate_roots(["a", 0.5], 4, 4), "v must be a 1-D array"),
        (lambda: allocate_roots([0.5, 0.5], 4, 4, seed=-1), "seed"),
        (lambda: allocate_prefixes([0.5], 3, seed=1.5), "seed"),
        (lambda: allocate_prefixes([0.5], 3, seed="a"), "seed"),
        (lambda: allocate_prefixes("abc", 3), "flip_prob"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_prefix_budget_does_not_loop_per_unit():
    """A budget of 10^9 or 10^12 is allocated by threshold, not unit by unit (the old greedy ran for minutes)."""
    assert sorted(allocate_prefixes([0.5, 0.5, 0.5], 10**9, seed=4).tolist()) == [333333333, 333333333, 333333334]
    k = allocate_prefixes([0.9, 0.1], 10**12)
    assert k.tolist() == [5 * 10**11, 5 * 10**11]  # both long past underflow: an even spread
    k = allocate_prefixes([1e-20, 0.5, 0.0], 10**9)  # a tiny q keeps a positive gain for ~1e22 units
    assert k.sum() == 10**9 and k[2] == 0 and 0 < k[1] < 2000


def test_prefix_budget_after_underflow_spreads_evenly():
    """q = 0.5 has 1073 units with q(1-q)^k above the smallest positive double; q = 0 has none. The rest of a
    budget of 10,000 goes first to the anchor with fewer continuations, then evenly: 5,000 each."""
    assert allocate_prefixes([0.5, 0.0], 1073).tolist() == [1073, 0]
    assert allocate_prefixes([0.5, 0.0], 10_000).tolist() == [5000, 5000]
    assert allocate_prefixes([0.5, 0.5], 3, seed=0).sum() == 3  # at equal gain, fewer continuations first
    assert sorted(allocate_prefixes([0.5, 0.5], 3, seed=0).tolist()) == [1, 2]


def test_roots_cap_max_per_prompt_at_the_budget():
    """max_per_prompt = 10^9 used to ask numpy for B x 10^9 gains; no prompt can take more than the budget."""
    v = np.array([0.5, 0.3, 0.9, 0.0])
    for skip in (True, False):
        m = allocate_roots(v, 40, 10**9, seed=2, skip=skip)
        assert m.tolist() == allocate_roots(v, 40, 40, seed=2, skip=skip).tolist()
        assert root_value(v, m).sum() == pytest.approx(knapsack_dp(v, 40, 40, skip=skip)[40], abs=1e-12)
    m = allocate_roots([0.0, 1.0, 0.0], 100, 10**6)  # every gain is zero: ties go prompt by prompt
    assert m.sum() == 100 and m.max() == 100 and not np.any(m == 1)


def test_roots_exact_when_the_threshold_lies_deep():
    """Budgets far above 16 per prompt make the allocator build more gain columns (doubling); still exact."""
    rng = np.random.default_rng(8)
    for trial in range(12):
        v = random_probs(rng, 12)
        mmax = int(rng.integers(20, 70))
        budget = int(rng.integers(12 * 16, 12 * mmax + 1))
        m = allocate_roots(v, budget, mmax, seed=trial)
        assert m.sum() == budget and m.max() <= mmax and not np.any(m == 1)
        assert root_value(v, m).sum() == pytest.approx(knapsack_dp(v, budget, mmax)[budget], abs=1e-9)


def test_tree_mixing_matches_brute_force_over_every_anchor():
    from trace_rl.allocation import allocate_tree_mixing, tree_mixing_value

    rng = np.random.default_rng(7)
    for trial in range(400):
        trees = int(rng.integers(1, 4))
        qs = [random_probs(rng, int(rng.integers(0, 3))) for _ in range(trees)]
        agree = rng.random(trees) < 0.6
        budget = int(rng.integers(0, 6))
        k = allocate_tree_mixing(qs, agree, budget, seed=trial)
        flat = np.concatenate(qs)
        spent = budget if flat.size else 0  # no anchor anywhere: nothing can be spent (callers count it)
        assert [x.size for x in k] == [q.size for q in qs] and sum(int(x.sum()) for x in k) == spent
        if not any(a and q.size and q.max() > 0 for q, a in zip(qs, agree)):  # none can become mixed: stage 2's own
            if flat.size:
                assert prefix_value(flat, np.concatenate(k)) == pytest.approx(brute_prefix(flat, budget), abs=1e-12)
            continue
        best = -1.0  # every way to place the budget on every anchor of every tree (mixed trees' too)
        for counts in itertools.product(range(budget + 1), repeat=flat.size):
            if sum(counts) == budget:
                parts = np.split(np.array(counts), np.cumsum([q.size for q in qs])[:-1])
                best = max(best, tree_mixing_value(qs, agree, parts))
        assert tree_mixing_value(qs, agree, k) == pytest.approx(best, abs=1e-12)
        for q, a, x in zip(qs, agree, k):  # units sit on a tree's likeliest flip, never in a mixed tree
            assert not x.sum() or (a and x[int(np.argmax(q))] == x.sum())
    # agreeing trees that cannot flip (q = 0) leave the budget to stage 2's own objective on the others
    assert [x.tolist() for x in allocate_tree_mixing([[0.0, 0.0], [0.4, 0.3]], [True, False], 3)] == [[0, 0], [2, 1]]


def test_tree_mixing_refuses_mismatched_flags():
    from trace_rl.allocation import allocate_tree_mixing

    with pytest.raises(ValueError, match="one flag per tree"):
        allocate_tree_mixing([[0.2], [0.3]], [True], 2)


def test_prefixes_under_cost_match_brute_force():
    from trace_rl.allocation import allocate_prefixes_under_cost

    rng = np.random.default_rng(11)
    for trial in range(1200):
        n = int(rng.integers(1, 5))
        budget = int(rng.integers(0, 10))
        q = random_probs(rng, n)
        cost = rng.integers(1, 5, n)
        k = allocate_prefixes_under_cost(q, cost, budget, seed=trial)
        assert k.min() >= 0 and int(k @ cost) <= budget
        best = max(
            prefix_value(q, counts)
            for counts in itertools.product(*(range(budget // c + 1) for c in cost))
            if int(np.dot(counts, cost)) <= budget
        )
        assert prefix_value(q, k) == pytest.approx(best, abs=1e-12)
        if q.min() > 0 and q.max() <= 0.9:  # every unit gains: what is left buys no continuation anywhere
            assert budget - int(k @ cost) < cost.min()


def test_prefixes_under_cost_with_equal_costs_is_stage_two_and_prefers_cheap_flips():
    from trace_rl.allocation import allocate_prefixes_under_cost

    rng = np.random.default_rng(5)
    for trial in range(200):
        q = rng.uniform(0.01, 0.99, int(rng.integers(1, 6)))
        budget = int(rng.integers(0, 12))
        k = allocate_prefixes_under_cost(q, np.full(q.size, 3), 3 * budget, seed=trial)
        assert prefix_value(q, k) == pytest.approx(prefix_value(q, allocate_prefixes(q, budget)), abs=1e-12)
    # a shallow anchor flips more often but costs four deep ones: the budget buys the deep ones
    assert allocate_prefixes_under_cost([0.5, 0.3], [4, 1], 4).tolist() == [0, 4]
    # nothing affordable, no anchors, zero gain: nothing spent
    assert allocate_prefixes_under_cost([0.5], [5], 4).tolist() == [0]
    assert allocate_prefixes_under_cost([], [], 4).size == 0
    assert allocate_prefixes_under_cost([0.0, 0.0], [1, 1], 4).tolist() == [0, 0]


def test_prefixes_under_cost_refuse_bad_costs_and_quantise_within_budget():
    from trace_rl.allocation import allocate_prefixes_under_cost, quantise_costs

    for cost in ([0, 1], [1.5, 1], [1]):
        with pytest.raises(ValueError, match="cost"):
            allocate_prefixes_under_cost([0.2, 0.3], np.asarray(cost), 4)
    rng = np.random.default_rng(2)
    for _ in range(300):
        tokens = rng.integers(1, 3000, int(rng.integers(1, 8)))
        budget = int(rng.integers(0, 20000))
        units, b = quantise_costs(tokens, budget, units=64)
        assert b <= 64 and units.min() >= 1
        k = allocate_prefixes_under_cost(rng.uniform(0.05, 0.9, tokens.size), units, b)
        assert int(k @ tokens) <= budget  # rounding costs up and the budget down never overspends
    with pytest.raises(ValueError, match="positive"):
        quantise_costs([0, 3], 10)
