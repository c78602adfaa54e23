"""Knapsack RL's allocation (trace_rl.knapsack) against its authors' code (github.com/liziniu/KnapsackRL @
ca5d5f5b7e933378d916d05d1aeb4ae9de929ee5, verl/trainer/ppo/exploration_utils.py `sampling_budget_by_knapsack`)
and the repaired allocator against brute force.

The repository ships no upstream code. Always: `allocate_knapsack_rl` against knapsack_rl_upstream.json, what
upstream's function returned (or that it failed its own budget assertion) with its cost fallback on and off for
207 instances (the file says which upstream file, numpy and python made it), the repaired allocator against
brute force, and hand-worked cases. With TRACE_RL_KNAPSACK_REFERENCE naming upstream's file (docs/baselines.md):
the same on fresh random instances, and a check that the recorded table is what that file computes here.
`python tests/core/test_knapsack.py`, with the variable set and PYTHONPATH=src:tests, rewrites the table."""

import contextlib
import io
import itertools
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from helpers_upstream import load_fixture, provenance, upstream_code, upstream_or_skip, write_fixture

from trace_rl.knapsack import allocate_knapsack_rl, allocate_knapsack_rl_repaired, knapsack_rl_dp, knapsack_rl_value

VAR = "TRACE_RL_KNAPSACK_REFERENCE"
FIXTURE = Path(__file__).with_name("knapsack_rl_upstream.json")
FAILED = "AssertionError"  # upstream's `assert np.sum(sampling_budget) == total_budget` failed
HAND = [  # (p, budget, max_n): the worked examples below and in docs/baselines.md
    ([0.5, 0.1], 6, 128),
    ([0.5, 0.5], 300, 128),
    ([0.5, 0.3, 0.6], 24, 128),
    ([0.5, 0.0], 32, 128),
    ([0.9, 1.0, 1.0], 40, 128),
    ([0.9375, 0.75], 16, 128),
    ([1.0, 1.0, 1.0], 23, 128),
]


def dp_only(p, budget, max_n=128):
    """The port's view of upstream with allow_fallback=False: min_n = 2 everywhere, its DP over the live prompts."""
    p = np.asarray(p, dtype=np.float64)
    live = (p > 0) & (p < 1)
    m = np.full(p.size, 2, dtype=np.int64)
    m[live] += knapsack_rl_dp(p[live], 2, max_n - 2, budget - 2 * p.size)
    return m


def brute_knapsack(p, budget, min_n, max_n, fixed_n=2):
    """Best stated-objective value over every allocation of the live prompts within the bounds."""
    live = [x for x in p if 0 < x < 1]
    spend = budget - fixed_n * (len(p) - len(live))
    best = -np.inf
    for ms in itertools.product(range(min_n, max_n + 1), repeat=len(live)):
        if sum(ms) == min(spend, len(live) * max_n):
            best = max(best, knapsack_rl_value(live, ms))
    return best


def random_instances(count, seed, digits=None):
    """(p, budget, max_n): up to 5 prompts mixing p = 0, 1 and typical rates, max_n 2..9 or upstream's 128."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        n = int(rng.integers(1, 6))
        p = rng.choice([0.0, 1.0, 0.5, 0.3, 0.1, 0.9, 0.75, 0.9375, float(rng.random())], n)
        if digits:
            p = np.array([float(f"{x:.{digits}g}") for x in p])
        max_n = int(rng.integers(2, 10)) if trial % 2 else 128
        yield p, int(rng.integers(2 * n, 2 * n + 40)), max_n


def check_against_upstream(p, budget, max_n, r) -> str:
    """allocate_knapsack_rl against upstream's outputs r for one instance; which case it was."""
    p = np.asarray(p, dtype=np.float64)
    m = allocate_knapsack_rl(p, budget, max_n=max_n)
    live = (p > 0) & (p < 1)
    assert m.sum() == budget
    if live.any():  # the port's DP alone is upstream's with the fallback off
        assert dp_only(p, budget, max_n).tolist() == r["no_fallback"], r
    if r["fallback"] != FAILED:
        assert m.tolist() == r["fallback"], r
        return "compared"
    if live.all():  # the fallback lost the excess: the DP takes the whole budget
        assert m.tolist() == r["no_fallback"], r
        return "kept"
    # no 0 < p < 1 prompt and none at p = 0: upstream gives each budget // P and fails; the port splits evenly
    assert not live.any() and not np.any(p == 0), r
    assert m.tolist() == [budget // p.size + (i < budget % p.size) for i in range(p.size)], r
    return "split"


@cache
def recorded() -> dict:
    return load_fixture(FIXTURE)


def row(p, budget, max_n=128) -> dict:
    """The recorded upstream outputs for one instance."""
    key = [p, budget, max_n]
    (found,) = [r for r in recorded()["sampling_budget_by_knapsack"] if [r["p"], r["budget"], r["max_n"]] == key]
    return found


# ---------------------------------------------------------------------------------------------------------
# against upstream's recorded outputs (no upstream code needed)


def test_knapsack_rl_faithful_matches_upstreams_recorded_allocations():
    """Same allocation as upstream's function with its defaults (fallback on), wherever upstream returned one;
    where it failed its assertion (every prompt 0 < p < 1 and the fallback fires), the DP takes the budget, as
    upstream's allow_fallback=False does; where no prompt has 0 < p < 1 or p = 0 (upstream: budget // P each, and
    its assertion fails unless P divides the budget) the budget is split evenly: p = [1, 1, 1], budget 23 gives
    [8, 8, 7]. The port's DP alone matches upstream's with the fallback off."""
    rows = recorded()["sampling_budget_by_knapsack"]
    seen = Counter(check_against_upstream(r["p"], r["budget"], r["max_n"], r) for r in rows)
    assert len(rows) == len(HAND) + 200 and seen["compared"] > 100 and seen["kept"] > 10 and seen["split"] >= 1
    split = row([1.0, 1.0, 1.0], 23)
    assert split["fallback"] == split["no_fallback"] == FAILED
    assert allocate_knapsack_rl([1.0, 1.0, 1.0], 23).tolist() == [8, 8, 7]


def test_knapsack_rl_repaired_by_hand_where_upstream_dp_departs():
    """p = [0.5, 0.1], budget 6 (2 extra). Stated objective: [4, 2] scores 0.875*0.125 + 0.18*0.081 = 0.12396,
    [3, 3] scores 0.75*0.125 + 0.271*0.081 = 0.11570. Upstream's DP scores a prompt left at 2 as 0, so it
    compares f(0.5, 4) w = 0.10938 with f(0.5, 3) w + f(0.1, 3) w = 0.11570 and picks [3, 3] (upstream ca5d5f5
    returns [3, 3], fallback on or off: the costs 3 and 21 exceed the 2 extra)."""
    w5, w1 = 0.5 * 0.25, 0.1 * 0.81
    assert allocate_knapsack_rl_repaired([0.5, 0.1], 6).tolist() == [4, 2]
    assert knapsack_rl_value([0.5, 0.1], [4, 2]) == pytest.approx(0.875 * w5 + 0.18 * w1)
    assert row([0.5, 0.1], 6)["fallback"] == row([0.5, 0.1], 6)["no_fallback"] == [3, 3]
    assert allocate_knapsack_rl([0.5, 0.1], 6).tolist() == [3, 3]
    assert knapsack_rl_value([0.5, 0.1], [3, 3]) == pytest.approx(0.75 * w5 + 0.27 * w1)


def test_knapsack_rl_repaired_budget_past_the_bounds():
    """Upstream spreads what its DP cannot place over the 0 < p < 1 prompts past max_n (ca5d5f5 returns
    [150, 150] for p = [0.5, 0.5], budget 300, fallback off); with no other prompt so do we. With p = 0 prompts
    present the excess goes to them (upstream's fallback target)."""
    assert row([0.5, 0.5], 300)["no_fallback"] == [150, 150]
    assert allocate_knapsack_rl([0.5, 0.5], 300).tolist() == [150, 150]
    assert allocate_knapsack_rl_repaired([0.5, 0.5], 300).tolist() == [150, 150]
    # 8 + 2 + 2 + 2 = 14 within the bounds; 17 left: 9 and 8 to the p = 0 prompts, the first takes the odd one
    assert allocate_knapsack_rl_repaired([0.5, 0.0, 1.0, 0.0], 31, max_n=8).tolist() == [8, 11, 2, 10]
    assert allocate_knapsack_rl_repaired([0.5, 1.0], 20, max_n=8).tolist() == [8, 12]


def test_knapsack_rl_upstream_fallback_drops_budget_when_every_prompt_is_live():
    """Upstream's cost fallback (on by default) hands the budget beyond its cost estimate to the p = 0 or 1
    prompts; with none it divides by zero (numpy: 0), loses that budget and fails its own assertion (ca5d5f5 on
    p = [0.5, 0.3, 0.6], budget 24: "Budget mismatch"). trace-rl keeps the budget."""
    assert row([0.5, 0.3, 0.6], 24)["fallback"] == FAILED
    for m in (allocate_knapsack_rl_repaired([0.5, 0.3, 0.6], 24), allocate_knapsack_rl([0.5, 0.3, 0.6], 24)):
        assert m.sum() == 24 and m.min() >= 2


def test_knapsack_rl_repaired_exact_against_brute_force_and_never_below_upstreams_dp():
    """Against brute force, and never below upstream's DP (`dp_only`, pinned to upstream's code by the recorded
    table above)."""
    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(1, 5))
        p = rng.choice([0.0, 1.0, 0.5, 0.3, 0.1, 0.9, float(rng.random())], n)
        max_n = int(rng.integers(2, 6))
        live = int(((p > 0) & (p < 1)).sum())
        floor = 2 * n
        budget = int(rng.integers(floor, floor + live * (max_n - 2) + 3))
        m = allocate_knapsack_rl_repaired(p, budget, max_n=max_n, seed=trial)
        assert m.sum() == budget and m.min() >= 2
        assert np.all(m[(p == 0) | (p == 1)] >= 2)
        if budget <= floor + live * (max_n - 2):
            assert np.all(m[(p > 0) & (p < 1)] <= max_n)
            assert np.all(m[(p == 0) | (p == 1)] == 2)
            value = knapsack_rl_value(p, m)
            assert value == pytest.approx(brute_knapsack(p, budget, 2, max_n), abs=1e-12)
            if live:
                assert value >= knapsack_rl_value(p, dp_only(p, budget, max_n)) - 1e-12


def test_knapsack_rl_faithful_sends_the_excess_to_prompts_without_contrast():
    """p = [0.5, 0], budget 32: minimums [2, 2], 28 left. The cost estimate of p = 0.5 is
    log(0.1) / log(0.5) = 3.32 -> 3 < 28, so upstream's fallback gives the other 25 to the p = 0 prompt and its
    DP the 3 to p = 0.5: [5, 27] (upstream ca5d5f5 returns [5, 27]). The repaired allocator puts everything the
    objective values on p = 0.5: [30, 2]."""
    assert row([0.5, 0.0], 32)["fallback"] == [5, 27]
    assert allocate_knapsack_rl([0.5, 0.0], 32).tolist() == [5, 27]
    assert allocate_knapsack_rl_repaired([0.5, 0.0], 32).tolist() == [30, 2]
    # with no p = 0 prompt the excess goes to the p = 1 ones: p = 0.9 costs log(0.1) / log(0.9) = 21.85 -> 21
    assert row([0.9, 1.0, 1.0], 40)["fallback"] == [23, 9, 8]
    assert allocate_knapsack_rl([0.9, 1.0, 1.0], 40).tolist() == [23, 9, 8]


def test_knapsack_rl_faithful_dp_at_four_and_eight_per_prompt():
    """p = [0.9375, 0.75], budget 16 (12 extra; costs 35 and 8 exceed them, no fallback). w(0.9375) = 0.003662,
    w(0.75) = 0.046875. Upstream's DP scores a prompt left at 2 as 0, so it compares [2, 14] at
    0 + f(0.75, 14) w = 0.982182 * 0.046875 = 0.046040 with [3, 13] at f(0.9375, 3) w + f(0.75, 13) w =
    0.000644 + 0.045761 = 0.046405 and picks [3, 13] (upstream ca5d5f5 returns [3, 13]). The stated objective adds
    f(0.9375, 2) w = 0.000429 to [2, 14]: 0.046469 > 0.046405, so the repaired allocator gives [2, 14]."""
    p = [0.9375, 0.75]
    assert row(p, 16)["fallback"] == [3, 13]
    assert allocate_knapsack_rl(p, 16).tolist() == [3, 13]
    assert allocate_knapsack_rl_repaired(p, 16).tolist() == [2, 14]
    assert knapsack_rl_value(p, [2, 14]) == pytest.approx(0.046469, abs=1e-6)
    assert knapsack_rl_value(p, [3, 13]) == pytest.approx(0.046405, abs=1e-6)


def test_knapsack_rl_errors_name_the_argument():
    with pytest.raises(ValueError, match="budget"):
        allocate_knapsack_rl_repaired([0.5, 0.0], 3)
    with pytest.raises(ValueError, match="min_n"):
        allocate_knapsack_rl_repaired([0.5], 4, min_n=1)
    with pytest.raises(ValueError, match="max_n"):
        allocate_knapsack_rl_repaired([0.5], 4, min_n=3, max_n=2)
    with pytest.raises(ValueError, match="p must"):
        allocate_knapsack_rl_repaired([0.5, "x"], 4)
    with pytest.raises(ValueError, match="seed"):
        allocate_knapsack_rl_repaired([0.5], 4, seed=-3)
    with pytest.raises(ValueError, match="budget"):
        allocate_knapsack_rl([0.5, 0.0], 3)


# ---------------------------------------------------------------------------------------------------------
# against upstream's own file, when TRACE_RL_KNAPSACK_REFERENCE names it


@pytest.fixture(scope="module")
def upstream():
    return upstream_or_skip(VAR)


def upstream_allocation(module, p, budget, max_n=128, allow_fallback=True):
    """Upstream's allocation as a list, or FAILED where it fails its budget assertion (its [Info] lines muted)."""
    states = np.array([[1, x, 16] for x in p], dtype=object)
    try:
        with np.errstate(divide="ignore", invalid="ignore"), contextlib.redirect_stdout(io.StringIO()):
            m, _ = module.sampling_budget_by_knapsack(
                states, n=budget // len(p), max_n=max_n, total_budget=budget, allow_fallback=allow_fallback
            )
    except AssertionError as exc:
        assert "Budget mismatch" in str(exc)
        return FAILED
    return [int(x) for x in m]


def upstream_row(module, p, budget, max_n) -> dict:
    out = {"p": [float(x) for x in p], "budget": budget, "max_n": max_n}
    for key, fallback in (("fallback", True), ("no_fallback", False)):
        out[key] = upstream_allocation(module, p, budget, max_n, allow_fallback=fallback)
    return out


def test_the_recorded_table_is_what_upstream_computes(upstream):
    for r in recorded()["sampling_budget_by_knapsack"]:
        assert upstream_row(upstream, r["p"], r["budget"], r["max_n"]) == r


def test_knapsack_rl_faithful_matches_upstream_code_on_random_instances(upstream):
    seen = Counter()
    for p, budget, max_n in random_instances(400, seed=12):
        r = upstream_row(upstream, p, budget, max_n)
        seen[check_against_upstream(p, budget, max_n, r)] += 1
        live = (p > 0) & (p < 1)
        if live.any() and budget <= 2 * p.size + live.sum() * (max_n - 2):  # within the bounds
            repaired = allocate_knapsack_rl_repaired(p, budget, max_n=max_n)
            assert knapsack_rl_value(p, repaired) >= knapsack_rl_value(p, r["no_fallback"]) - 1e-12
    assert seen["compared"] > 200 and seen["kept"] > 20 and seen["split"] > 0


# ---------------------------------------------------------------------------------------------------------
# the recorded table: `python tests/core/test_knapsack.py` with TRACE_RL_KNAPSACK_REFERENCE set


def main() -> None:
    module = upstream_code.load(VAR)
    if module is None:
        sys.exit(upstream_code.unset_line(VAR))
    inputs = [(np.array(p), b, m) for p, b, m in HAND] + list(random_instances(200, seed=11, digits=4))
    import numpy

    numba = "used where upstream uses it" if module.NUMBA_AVAILABLE else "absent (its pure-Python DP)"
    what = (
        "sampling_budget_by_knapsack([[1, p_i, 16]], n=budget // P, max_n, total_budget=budget, "
        f"allow_fallback=True or False), other arguments at their defaults; {FAILED!r}: its budget assertion failed"
    )
    prov = provenance(VAR, "tests/core/test_knapsack.py", f"numpy {numpy.__version__}, numba {numba}", what)
    write_fixture(FIXTURE, prov, {"sampling_budget_by_knapsack": [upstream_row(module, *x) for x in inputs]})
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
