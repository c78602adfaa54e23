"""VIP's allocation (trace_rl.vip) against its authors' code (github.com/HieuNT91/VIP @
87bedf7f874f1d61741268de28b4f48d39605b84, src/vip/allocation/bernoulli_allocation.py) and against brute force.

The port's rounding is upstream's operation for operation, so fed upstream's SLSQP solution it must return
upstream's allocation exactly; its continuous solver is exact, so it must never score above SLSQP's solution, and
must match a brute-force search on small problems.

The repository ships no upstream code. Always: the port against vip_upstream.json, upstream's recorded outputs
(SLSQP's solution and the final allocation of 42 batches, the rounding of 80 continuous allocations; the file
says which upstream file, numpy and scipy made it), brute force, the KKT conditions and hand-worked cases. With
TRACE_RL_VIP_REFERENCE naming upstream's file (docs/baselines.md): the same comparisons on fresh random inputs,
and a check that the recorded table is what that file computes here. `python tests/core/test_vip.py`, with the
variable set and PYTHONPATH=src:tests, rewrites the table."""

import contextlib
import io
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from helpers_upstream import load_fixture, provenance, upstream_code, upstream_or_skip, write_fixture

from trace_rl.vip import (
    LOWER,
    UPPER,
    allocate_vip,
    even_split,
    round_allocation,
    solve_continuous,
    vip_objective,
)

VAR = "TRACE_RL_VIP_REFERENCE"
FIXTURE = Path(__file__).with_name("vip_upstream.json")
HAND = ([0.5, 0.5, 0.01, 0.999], 32, 1, "rloo")  # the worked example of docs/baselines.md
EVEN = ([0.3, 0.3005, 0.3], 20, 1, "rloo")  # allocate_rollout's even-split branch


def quiet(fn, *args, **kwargs):
    """Upstream's `solve` prints SLSQP's status on every call."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def recorded_slsqp(x):
    """The continuous step `allocate_vip(continuous=...)` takes: upstream's recorded SLSQP solution."""
    return lambda p, budget, lower, upper, rule: np.array(x)


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


def rounding_inputs(count, seed=3):
    """(x, a, budget): continuous allocations that need every branch of the rounding: no top-up, a top-up into
    zeroed prompts, and the enforce_min_after_rounding pass."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        n = int(rng.integers(2, 20))
        if trial % 8 == 0:  # floors of 4 or more that spend the budget exactly: nothing to top up
            x = rng.integers(4, 13, n) + 0.99 * rng.random(n)
            yield x, rng.random(n) * 0.25, int(np.floor(x).sum())
            continue
        budget = int(rng.integers(4 * n, 12 * n))
        x = np.minimum(rng.dirichlet(np.full(n, rng.choice([0.3, 1.0, 5.0]))) * budget, UPPER)
        yield x, rng.random(n) * 0.25, budget


# ---------------------------------------------------------------------------------------------------------
# against upstream's recorded outputs (no upstream code needed)


@cache
def recorded() -> dict:
    return load_fixture(FIXTURE)


def test_with_upstreams_recorded_continuous_step_the_allocation_is_upstreams():
    """Whole pipeline: clip, the even split of near-equal predictions, (SLSQP's recorded solution), floor, drop
    below 4, the greedy top-up scored by allocation_value, enforce_min_after_rounding."""
    rows = recorded()["allocate_rollout"]
    assert len(rows) == 42 and sum(r["slsqp"] is not None for r in rows) >= 35
    for r in rows:
        continuous = None if r["slsqp"] is None else recorded_slsqp(r["slsqp"])
        got = allocate_vip(r["p"], r["budget"], lower=r["lower"], rule=r["rule"], continuous=continuous)
        assert got.tolist() == r["allocation"], r
        assert got.sum() == r["budget"] and not np.any((got > 0) & (got < 4))


def test_rounding_is_upstreams_on_recorded_continuous_inputs():
    rows = recorded()["allocation_rounding"]
    assert len(rows) == 80
    branches = set()
    for r in rows:
        got = round_allocation(np.array(r["x"]), np.array(r["a"]), r["budget"])
        assert got.tolist() == r["allocation"], r
        floors = np.floor(r["x"]).astype(int)
        floors[floors < 4] = 0
        branches.add("top-up" if floors.sum() < r["budget"] else "none")
        if np.any((floors == 0) & (got > 0)):
            branches.add("into a dropped prompt")
    assert branches == {"top-up", "none", "into a dropped prompt"}  # the table reaches every branch


def test_the_exact_solver_never_scores_above_slsqp_and_meets_the_budget():
    gaps = []
    for r in recorded()["allocate_rollout"]:
        if r["slsqp"] is None:
            continue
        q = np.clip(r["p"], 1e-6, 1 - 1e-6)
        n = solve_continuous(q, r["budget"], r["lower"], UPPER, r["rule"])
        assert n.sum() == pytest.approx(r["budget"], abs=1e-6)
        assert n.min() >= r["lower"] - 1e-12 and n.max() <= UPPER + 1e-12
        gaps.append(vip_objective(q, r["slsqp"], r["rule"]) - vip_objective(q, n, r["rule"]))
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
    Upstream's SLSQP (87bedf7, scipy 1.17) reports success at [11.394, 11.394, 7.614, 1.599], objective 0.015670
    against the optimum's 0.014948 (5% above), and upstream allocates [13, 12, 7, 0]: the departure
    docs/baselines.md describes; fed that SLSQP solution the port allocates the same."""
    p = np.array([0.5, 0.5, 0.01, 0.999])
    n = solve_continuous(p, 32)
    lam = 0.25 / (n[0] - 1) ** 2 - 7e-4 * np.log(0.5)
    assert n == pytest.approx(1 + np.sqrt(p * (1 - p) / (7e-4 * np.log(p) + lam)))
    assert n == pytest.approx([10.338, 10.338, 9.778, 1.546], abs=1e-3)
    m = allocate_vip(p, 32)
    assert sorted(m[:2].tolist()) == [11, 12] and m[2:].tolist() == [9, 0]
    assert vip_objective(p, n) == pytest.approx(0.014948, abs=1e-6)
    (row,) = [r for r in recorded()["allocate_rollout"] if [r["p"], r["budget"], r["lower"], r["rule"]] == list(HAND)]
    assert row["slsqp"] == pytest.approx([11.394, 11.394, 7.614, 1.599], abs=1e-3)
    assert vip_objective(p, row["slsqp"]) == pytest.approx(0.015670, abs=1e-6)
    assert row["allocation"] == [13, 12, 7, 0]
    assert allocate_vip(p, 32, continuous=recorded_slsqp(row["slsqp"])).tolist() == [13, 12, 7, 0]


def test_near_equal_predictions_split_evenly():
    """allocate_rollout's first branch (std < 1e-3): budget // P each, the first prompts taking the remainder
    (upstream 87bedf7 returns [7, 7, 6] for the first case); below 4 per prompt, units of 4 to random prompts
    (trace-rl keeps a remainder upstream asserts away)."""
    assert allocate_vip([0.3, 0.3005, 0.3], 20).tolist() == [7, 7, 6]
    assert allocate_vip(np.full(5, 0.0067), 40).tolist() == [8] * 5  # the GP's prior for every prompt
    m = allocate_vip([0.5, 0.5, 0.5], 8, seed=4)
    assert m.sum() == 8 and set(m.tolist()) <= {0, 4, 8}
    m = even_split(3, 6, 4, np.random.default_rng(0))
    assert m.sum() == 6 and np.count_nonzero(m) == 1  # one unit of 4 and the remainder of 2 on it
    (row,) = [r for r in recorded()["allocate_rollout"] if [r["p"], r["budget"], r["lower"], r["rule"]] == list(EVEN)]
    assert row["slsqp"] is None and row["allocation"] == [7, 7, 6]


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


# ---------------------------------------------------------------------------------------------------------
# against upstream's own file, when TRACE_RL_VIP_REFERENCE names it


@pytest.fixture(scope="module")
def upstream():
    pytest.importorskip("scipy")  # upstream's SLSQP; scipy comes with the `plots` extra
    module = upstream_or_skip(VAR)
    solved: dict = {}
    solve = module.solve

    def cached_solve(a, question_accs, batch_budget, lower=4, upper=32, allocation_rule="rloo"):
        """Upstream's `solve`, each problem solved once: SLSQP takes ~0.3 s a batch here, and the tests ask for
        the same batches through upstream's allocate_rollout, through allocate_vip and for the objective."""
        key = (np.asarray(question_accs).tobytes(), batch_budget, lower, upper, allocation_rule)
        if key not in solved:
            solved[key] = quiet(solve, a, question_accs, batch_budget, lower, upper, allocation_rule)
        return solved[key].copy()

    module.solve = cached_solve  # allocate_rollout looks `solve` up in its module at each call
    return module


def upstream_rows(module, inputs):
    """Upstream's SLSQP solution (None where allocate_rollout splits evenly) and allocation for each input."""
    rows = []
    for p, budget, lower, rule in inputs:
        q = np.clip(p, 1e-6, 1 - 1e-6)
        x = None if np.std(q) < 1e-3 else module.solve(q * (1 - q), q, budget, lower, UPPER, rule).tolist()
        alloc = quiet(module.allocate_rollout, p, budget, lower=lower, upper=UPPER, allocation_rule=rule)
        rows.append(
            {
                "p": [float(v) for v in p],
                "budget": budget,
                "lower": lower,
                "rule": rule,
                "slsqp": x,
                "allocation": alloc,
            }
        )
    return rows


def test_the_recorded_table_is_what_upstream_computes(upstream):
    """If this fails after a scipy upgrade, SLSQP stops elsewhere now: rewrite the table (module docstring)."""
    rows = recorded()["allocate_rollout"]
    fresh = upstream_rows(upstream, [(np.array(r["p"]), r["budget"], r["lower"], r["rule"]) for r in rows])
    versions = recorded()["provenance"]["versions"]
    for r, f in zip(rows, fresh):
        assert f["allocation"] == r["allocation"], (r, versions)
        assert (f["slsqp"] is None) == (r["slsqp"] is None)
        if r["slsqp"] is not None:
            assert f["slsqp"] == pytest.approx(r["slsqp"], abs=1e-9), versions
    for r in recorded()["allocation_rounding"]:
        assert upstream.allocation_rounding(np.array(r["x"]), np.array(r["a"]), r["budget"], UPPER) == r["allocation"]


def test_with_upstreams_continuous_step_the_allocation_is_upstreams(upstream):
    for r in upstream_rows(upstream, cases(40, seed=1)):
        continuous = None if r["slsqp"] is None else recorded_slsqp(r["slsqp"])
        got = allocate_vip(r["p"], r["budget"], lower=r["lower"], rule=r["rule"], continuous=continuous)
        assert got.tolist() == r["allocation"], r


def test_rounding_is_upstreams_on_any_continuous_input(upstream):
    for x, a, budget in rounding_inputs(300, seed=4):
        assert round_allocation(x, a, budget).tolist() == upstream.allocation_rounding(x, a, budget, UPPER)


# ---------------------------------------------------------------------------------------------------------
# the recorded table: `python tests/core/test_vip.py` with TRACE_RL_VIP_REFERENCE set


def short(x: float) -> float:
    """4 significant digits: the recorded inputs are exactly what upstream was given, and stay short."""
    return float(f"{x:.4g}")


def main() -> None:
    module = upstream_code.load(VAR)
    if module is None:
        sys.exit(upstream_code.unset_line(VAR))
    solve = module.solve
    module.solve = lambda *a, **k: quiet(solve, *a, **k)
    inputs = [(np.array(p, dtype=float), b, lo, rule) for p, b, lo, rule in (HAND, EVEN)]
    inputs += [(np.array([short(v) for v in p]), b, lo, rule) for p, b, lo, rule in cases(40)]
    rounding = []
    for x, a, budget in rounding_inputs(80):
        x, a = np.array([short(v) for v in x]), np.array([short(v) for v in a])
        row = {"x": x.tolist(), "a": a.tolist(), "budget": budget}
        rounding.append(row | {"allocation": module.allocation_rounding(x, a, budget, UPPER)})
    import numpy
    import scipy

    what = (
        "allocate_rollout(p, budget, lower, upper=32, allocation_rule=rule) and its solve() (SLSQP; null "
        "where it splits evenly); allocation_rounding(x, a, budget, upper=32)"
    )
    versions = f"numpy {numpy.__version__}, scipy {scipy.__version__}"
    tables = {"allocate_rollout": upstream_rows(module, inputs), "allocation_rounding": rounding}
    write_fixture(FIXTURE, provenance(VAR, "tests/core/test_vip.py", versions, what), tables)
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
