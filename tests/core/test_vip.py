"""VIP's allocation (trace_rl.vip) against the verbatim copy of its authors' code (bench/vip_reference.py,
github.com/HieuNT91/VIP @ 87bedf7f874f1d61741268de28b4f48d39605b84) and against brute force.

The port's rounding is upstream's operation for operation, so fed upstream's SLSQP solution it must return
upstream's allocation exactly; its continuous solver is exact, so it must never score above SLSQP's
solution, and must match a brute-force search on small problems."""

import contextlib
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest

from trace_rl.vip import (
    LOWER,
    UPPER,
    allocate_vip,
    even_split,
    round_allocation,
    solve_continuous,
    vip_objective,
)

scipy = pytest.importorskip("scipy")  # upstream's SLSQP; scipy comes with the `plots` extra

_spec = importlib.util.spec_from_file_location(
    "vip_reference", Path(__file__).resolve().parents[2] / "bench" / "vip_reference.py"
)
upstream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(upstream)


def quiet(fn, *args, **kwargs):
    """Upstream's `solve` prints SLSQP's status on every call."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


_solved: dict = {}
_solve = upstream.solve


def cached_solve(a, question_accs, batch_budget, lower=4, upper=32, allocation_rule="rloo"):
    """Upstream's `solve`, each problem solved once: SLSQP takes ~0.3 s a batch here, and the tests ask for the
    same batches through upstream's allocate_rollout, through allocate_vip and for the objective."""
    key = (np.asarray(question_accs).tobytes(), batch_budget, lower, upper, allocation_rule)
    if key not in _solved:
        _solved[key] = quiet(_solve, a, question_accs, batch_budget, lower, upper, allocation_rule)
    return _solved[key].copy()


upstream.solve = cached_solve  # allocate_rollout looks `solve` up in its module at each call


def slsqp(p, budget, lower, upper, rule):
    """Upstream's continuous step (`solve`), as `allocate_vip(continuous=...)` takes it."""
    return upstream.solve(p * (1 - p), p, budget, lower=lower, upper=upper, allocation_rule=rule)


def random_batch(rng, trial):
    """Predicted success rates of the kinds a GP gives: uniform, a few repeated values, logit-normal, rounded."""
    n = int(rng.integers(2, 24))
    kind = trial % 4
    if kind == 0:
        return rng.random(n)
    if kind == 1:
        return rng.choice([0.0, 0.01, 0.3, 0.5, 0.9, 1.0], n)
    if kind == 2:
        return 1 / (1 + np.exp(-rng.normal(-2, 3, n)))
    return np.round(rng.random(n), 2)


def cases(count, seed=0):
    """(p, budget, lower, rule): the trainer's call (RLOO rule, lower 1) and allocate_rollout's own default
    (lower 4), both rules, 8 per prompt or a random budget within the bounds."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        p = random_batch(rng, trial)
        rule = "grpo" if trial % 3 == 0 else "rloo"
        lower = 4 if rule == "grpo" or trial % 2 else 1
        budget = 8 * p.size if trial % 5 else int(rng.integers(max(lower, 4) * p.size, UPPER * p.size + 1))
        yield p, budget, lower, rule


def test_with_upstreams_continuous_step_the_allocation_is_upstreams():
    """Whole pipeline: clip, the even split of near-equal predictions, SLSQP, floor, drop below 4, the greedy
    top-up scored by allocation_value, enforce_min_after_rounding."""
    for p, budget, lower, rule in cases(40):
        want = quiet(upstream.allocate_rollout, p, budget, lower=lower, upper=UPPER, allocation_rule=rule)
        got = allocate_vip(p, budget, lower=lower, rule=rule, continuous=slsqp)
        assert got.tolist() == want, (p.tolist(), budget, lower, rule)
        assert got.sum() == budget and not np.any((got > 0) & (got < 4))


def test_rounding_is_upstreams_on_any_continuous_input():
    """The rounding alone, on continuous allocations that need every branch: no top-up, a top-up into zeroed
    prompts, and the enforce_min_after_rounding pass."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(2, 20))
        budget = int(rng.integers(4 * n, 12 * n))
        x = rng.dirichlet(np.full(n, rng.choice([0.3, 1.0, 5.0]))) * budget
        x = np.minimum(x, UPPER)
        a = rng.random(n) * 0.25
        want = upstream.allocation_rounding(x, a, budget, UPPER)
        assert round_allocation(x, a, budget).tolist() == want


def test_the_exact_solver_never_scores_above_slsqp_and_meets_the_budget():
    gaps = []
    for p, budget, lower, rule in cases(40):  # the batches above: SLSQP's solutions are cached
        q = np.clip(p, 1e-6, 1 - 1e-6)
        if np.std(q) < 1e-3:
            continue
        n = solve_continuous(q, budget, lower, UPPER, rule)
        assert n.sum() == pytest.approx(budget, abs=1e-6)
        assert n.min() >= lower - 1e-12 and n.max() <= UPPER + 1e-12
        gaps.append(vip_objective(q, slsqp(q, budget, lower, UPPER, rule), rule) - vip_objective(q, n, rule))
    assert min(gaps) >= -1e-12
    assert max(gaps) > 1e-6  # SLSQP's default tolerance does stop short somewhere: the documented departure


def grid_objective(p, n, rule):
    """The objective at each row of n (vectorised vip_objective, for the brute force)."""
    q = np.clip(p, 1e-6, 1 - 1e-6)
    a, b = q * (1 - q), {"rloo": 7e-4, "grpo": 4e-4}[rule] * np.log(q)
    with np.errstate(divide="ignore"):
        var = a / (n - 1) if rule == "rloo" else a * (n - 1) / n**2
    return (var + b * n).sum(axis=1)


@pytest.mark.parametrize("rule,lower", [("rloo", 1), ("rloo", 4), ("grpo", 4)])
def test_the_exact_solver_against_brute_force(rule, lower):
    """Two or three prompts: every split of the budget on a 0.02 grid, then on a 0.001 grid around the best
    point, scores no better than the solver's, and comes within the grid's resolution of it."""
    rng = np.random.default_rng(5)
    for _ in range(10):
        k = int(rng.integers(2, 4))
        p = rng.choice([0.02, 0.2, 0.5, 0.7, 0.97, float(rng.random())], k)
        if np.std(p) < 1e-3:
            continue
        budget = int(rng.integers(lower * k + 1, min(UPPER * k, 12 * k)))
        best = None
        for step, span in ((0.02, None), (0.001, 0.05)):
            axes = [
                np.arange(lower, UPPER + 1e-9, step)
                if span is None
                else np.arange(max(lower, c - span), min(UPPER, c + span) + 1e-9, step)
                for c in ([0] * (k - 1) if best is None else best[:-1])
            ]
            head = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, k - 1)
            n = np.column_stack([head, budget - head.sum(1)])
            n = n[(n[:, -1] >= lower) & (n[:, -1] <= UPPER)]
            best = n[np.argmin(grid_objective(p, n, rule))]
        brute = vip_objective(p, best, rule)
        got = vip_objective(p, solve_continuous(p, budget, lower, UPPER, rule), rule)
        assert got <= brute + 1e-12
        assert got >= brute - 1e-5


def test_kkt_conditions_hold():
    """At the optimum, f_i'(n_i) is the same -lambda for every prompt strictly inside the bounds; a prompt at
    `upper` has f' <= -lambda, one at `lower` f' >= -lambda."""
    p = np.array([0.05, 0.2, 0.5, 0.5, 0.8, 0.999])
    n = solve_continuous(p, 48, 4, UPPER, "rloo")
    a, b = p * (1 - p), 7e-4 * np.log(p)
    d = -a / (n - 1) ** 2 + b
    inside = (n > 4 + 1e-9) & (n < UPPER - 1e-9)
    assert inside.sum() >= 2 and np.ptp(d[inside]) < 1e-9
    lam = -d[inside][0]
    assert np.all(d[n >= UPPER - 1e-9] <= -lam + 1e-9) and np.all(d[n <= 4 + 1e-9] >= -lam - 1e-9)


def test_by_hand_the_hard_prompt_gets_more_and_floors_below_four_are_dropped():
    """p = [0.5, 0.5, 0.01, 0.999], 32 rollouts, the trainer's bounds 1..32: a = 0.25, 0.25, 0.0099, 0.000999 and
    b = 7e-4 log p = -4.85e-4, -4.85e-4, -3.22e-3, -7e-7. The optimum is n_i = 1 + sqrt(a_i / (b_i + lambda))
    with sum 32: [10.338, 10.338, 9.778, 1.546]; the log term lifts the p = 0.01 prompt close to the p = 0.5
    ones although its variance is 25 times smaller. Floors [10, 10, 9, 1]; the 1 is dropped, leaving 3 to hand
    out by allocation_value's gain a((n+3)/(n+4)^2 - (n+4)/(n+5)^2): 0.00103 for a p = 0.5 prompt at 10,
    0.00091 at 11, 0.00005 for the p = 0.01 prompt at 9, 0.00003 for the dropped one at 0. So the p = 0.5
    prompts take all three, one more to whichever upstream's argsort puts last among the two equal gains.
    Upstream's SLSQP reports success at [11.394, 11.394, 7.614, 1.599], objective 0.015670 against the
    optimum's 0.014948 (5% above), and so allocates [13, 12, 7, 0]: the departure docs/baselines.md describes."""
    p = np.array([0.5, 0.5, 0.01, 0.999])
    n = solve_continuous(p, 32)
    lam = 0.25 / (n[0] - 1) ** 2 - 7e-4 * np.log(0.5)
    assert n == pytest.approx(1 + np.sqrt(p * (1 - p) / (7e-4 * np.log(p) + lam)))
    assert n == pytest.approx([10.338, 10.338, 9.778, 1.546], abs=1e-3)
    m = allocate_vip(p, 32)
    assert sorted(m[:2].tolist()) == [11, 12] and m[2:].tolist() == [9, 0]
    assert vip_objective(p, n) == pytest.approx(0.014948, abs=1e-6)
    assert allocate_vip(p, 32, continuous=slsqp).tolist() == quiet(upstream.allocate_rollout, p, 32, lower=1)


def test_near_equal_predictions_split_evenly():
    """allocate_rollout's first branch (std < 1e-3): budget // P each, the first prompts taking the remainder;
    below 4 per prompt, units of 4 to random prompts (trace-rl keeps a remainder upstream asserts away)."""
    assert allocate_vip([0.3, 0.3005, 0.3], 20).tolist() == [7, 7, 6]
    assert allocate_vip(np.full(5, 0.0067), 40).tolist() == [8] * 5  # the GP's prior for every prompt
    m = allocate_vip([0.5, 0.5, 0.5], 8, seed=4)
    assert m.sum() == 8 and set(m.tolist()) <= {0, 4, 8}
    m = even_split(3, 6, 4, np.random.default_rng(0))
    assert m.sum() == 6 and np.count_nonzero(m) == 1  # one unit of 4 and the remainder of 2 on it
    want = quiet(upstream.allocate_rollout, [0.3, 0.3005, 0.3], 20, lower=1)
    assert want == [7, 7, 6]


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="exceeds upper=32"):
        allocate_vip([0.2, 0.6], 65)
    with pytest.raises(ValueError, match="below lower=4"):
        allocate_vip([0.2, 0.6], 7, lower=4)
    with pytest.raises(ValueError, match="rule must be one of"):
        allocate_vip([0.2, 0.6], 16, rule="dr_grpo")
    with pytest.raises(ValueError, match="lower must be >= 3"):
        solve_continuous(np.array([0.2, 0.6]), 16, 1, UPPER, "grpo")
    with pytest.raises(ValueError, match="probabilities"):
        allocate_vip([0.2, 1.5], 16)
    assert allocate_vip([], 0).tolist() == []
    assert LOWER == 1 and UPPER == 32  # the trainer's call
