"""VIP's rollout allocation (Nguyen et al., "Adaptive Rollout Allocation for Online RLVR", ICLR 2026), as its
authors' code computes it, with the continuous step solved exactly.

VIP spends a batch's budget G over its P prompts to minimise the policy gradient's variance:

    minimise  sum_i a_i / (n_i - 1) + gamma log(p_i) n_i     (the RLOO rule, gamma = 0.0007)
    or        sum_i a_i (n_i - 1) / n_i^2 + gamma log(p_i) n_i   (the GRPO rule, gamma = 0.0004)
    subject to sum_i n_i = G,  lower <= n_i <= upper,   a_i = p_i (1 - p_i),  p clipped to [1e-6, 1 - 1e-6],

then floors the n_i, sets every floor below 4 to 0 (the prompt is dropped from the batch), hands the budget
this frees out one rollout at a time to the largest gain of a(n + 3)/(n + 4)^2 (a leftover of an earlier
objective that upstream's rounding still scores with), and, if that leaves a prompt at 1 to 3, zeroes it and
gives its rollouts one by one to the prompt holding the most. When the predictions barely differ
(std < 1e-3) it splits the budget evenly instead (or, below 4 per prompt, in units of 4 to random prompts).
The log(p) term is negative, so for equal variance the allocation leans to the prompts predicted to be hard.

Reference: github.com/HieuNT91/VIP (the repository now holds only a README; its history is public):
src/vip/allocation/bernoulli_allocation.py @ 87bedf7f874f1d61741268de28b4f48d39605b84 (`allocate_rollout`,
`solve`, `allocation_rounding`, `enforce_min_after_rounding`, `allocation_value`), called by
train/vip/vip_ray_trainer.py at the same commit as `allocate_rollout(preds, batch_budget, lower=1, upper=32)`:
the RLOO rule (the call passes none) and lower = 1, so trace-rl's defaults are those. The repository ships no
upstream code: the tests hold upstream's recorded outputs, and run it side by side where the developer names its
file (TRACE_RL_VIP_REFERENCE); docs/baselines.md says how, and lists where trace-rl departs.

The one departure in this module: upstream solves the continuous problem with scipy's SLSQP at its default
tolerance, which reports success short of the optimum (on bench/bench_vip_faithful.py's batches of 32 prompts
its objective sits a median 0.8% above it, at most 15% on smaller ones), so its floors, and the final
allocation, often differ from the optimum's (5 of 30 such batches end identical; 8.6 of 256 rollouts move).
Both rules are separable and convex on [lower, upper] (the GRPO rule from n = 3 on, so it needs lower >= 3),
so the KKT conditions give n_i(lambda) = the root of f_i'(n) = -lambda clipped to the bounds, decreasing in
lambda; bisection on lambda (and, for the GRPO rule, on n) solves it to float precision in numpy, with no
scipy in the core. Values within 1e-9 of an integer are snapped to it, so an optimum at exactly 8 floors to 8.
Given the same continuous solution the rounding here is upstream's, operation for operation (the tests feed
both SLSQP's output and compare allocations exactly).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .allocation import check_budget, check_probabilities

GAMMA = {"rloo": 0.0007, "grpo": 0.0004}  # `solve`'s gamma per allocation rule
RULES = tuple(GAMMA)
LOWER, UPPER = 1, 32  # the trainer's call: allocate_rollout(preds, batch_budget, lower=1, upper=32)
MIN_KEEP = 4  # allocations below this are dropped (allocation_rounding, enforce_min_after_rounding)
CLIP = 1e-6  # predictions clipped to [CLIP, 1 - CLIP] before a and log(p)
UNIFORM_STD = 1e-3  # below this std of the predictions, an even split (allocate_rollout's first branch)
SNAP = 1e-9  # a continuous n this close to an integer is that integer

ContinuousSolver = Callable[[np.ndarray, int, int, int, str], np.ndarray]


def _terms(p: np.ndarray, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """(a, b): a = p(1 - p) and b = gamma log p, on p clipped as upstream clips it."""
    p = np.clip(p, CLIP, 1 - CLIP)
    return p * (1 - p), GAMMA[rule] * np.log(p)


def vip_objective(p, n, rule: str = "rloo") -> float:
    """The continuous objective of `rule` at allocation n (p clipped as upstream clips it)."""
    _check_rule(rule)
    a, b = _terms(np.asarray(p, dtype=np.float64), rule)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore"):  # the RLOO rule is +inf at n = 1, as upstream's is
        var = a / (n - 1) if rule == "rloo" else a * (n - 1) / n**2
    return float(np.sum(var + b * n))


def _check_rule(rule: str) -> None:
    if rule not in GAMMA:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")


def _n_at(a: np.ndarray, b: np.ndarray, lam: float, lower: int, upper: int, rule: str) -> np.ndarray:
    """Each prompt's minimiser of f_i(n) + lam n on [lower, upper] (f_i convex there)."""
    c = b + lam
    if rule == "rloo":  # f' = -a/(n-1)^2 + b: the root is 1 + sqrt(a / (b + lam)); none (so upper) when b + lam <= 0
        with np.errstate(divide="ignore", invalid="ignore"):
            n = np.where(c > 0, 1.0 + np.sqrt(a / np.where(c > 0, c, 1.0)), np.inf)
        return np.clip(n, lower, upper)
    # grpo: f' = a(2 - n)/n^3 + b, increasing for n >= 3; bisect f'(n) + lam = 0 on [lower, upper]
    lo, hi = np.full(a.size, float(lower)), np.full(a.size, float(upper))
    for _ in range(64):
        mid = (lo + hi) / 2
        up = a * (2 - mid) / mid**3 + c < 0  # still descending: the minimiser lies above mid
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    n = (lo + hi) / 2
    n = np.where(a * (2 - upper) / upper**3 + c <= 0, upper, n)
    return np.where(a * (2 - lower) / lower**3 + c >= 0, lower, n)


def solve_continuous(p, budget: int, lower: int = LOWER, upper: int = UPPER, rule: str = "rloo") -> np.ndarray:
    """The exact minimiser of upstream's continuous problem (see the module docstring), snapped to integers
    within 1e-9."""
    _check_rule(rule)
    p = check_probabilities("p", p)
    if rule == "grpo" and lower < 3:
        raise ValueError(f"the grpo rule is convex only from n = 3: lower must be >= 3, got {lower}")
    if not 1 <= lower <= upper or not lower * p.size <= budget <= upper * p.size:
        raise ValueError(f"budget {budget} must lie in [{lower * p.size}, {upper * p.size}] for {p.size} prompts")
    if p.size == 0:
        return np.zeros(0)
    a, b = _terms(p, rule)
    # n(lam) is non-increasing; find a bracket [lo, hi] with sum n(lo) >= budget >= sum n(hi)
    lo, hi = -1.0, 1.0
    while _n_at(a, b, lo, lower, upper, rule).sum() < budget:
        lo *= 2
        if lo < -1e300:
            break
    while _n_at(a, b, hi, lower, upper, rule).sum() > budget:
        hi *= 2
        if hi > 1e300:
            break
    for _ in range(200):  # to float precision on lam
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if _n_at(a, b, mid, lower, upper, rule).sum() > budget:
            lo = mid
        else:
            hi = mid
    n_lo, n_hi = _n_at(a, b, lo, lower, upper, rule), _n_at(a, b, hi, lower, upper, rule)
    s_lo, s_hi = n_lo.sum(), n_hi.sum()
    # between the two brackets the sum moves continuously (or jumps at a flat piece): interpolate to hit budget
    w = 0.0 if s_lo == s_hi else (s_lo - budget) / (s_lo - s_hi)
    n = (1 - w) * n_lo + w * n_hi
    near = np.round(n)
    return np.where(np.abs(n - near) < SNAP, near, n)


def _allocation_value(a: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Upstream's allocation_value(a, n) = sum a(n + 3)/(n + 4)^2, per row of n (same float sums)."""
    return (a * (n + 3) / (n + 4) ** 2).sum(axis=-1)


def round_allocation(n_cont, a, budget: int, upper: int = UPPER, min_keep: int = MIN_KEEP) -> np.ndarray:
    """Upstream's allocation_rounding and enforce_min_after_rounding, operation for operation: floor, zero the
    floors below min_keep, hand the rest out by the gain of allocation_value, then move any 1..min_keep-1 left
    to the prompts holding the most."""
    a = np.asarray(a, dtype=np.float64)
    n = np.array([int(np.floor(x)) for x in n_cont], dtype=np.int64)
    n[n < min_keep] = 0
    remain = budget - int(n.sum())
    if remain < 0:
        raise ValueError(f"the floors of the continuous allocation sum to {int(n.sum())}, above the budget {budget}")
    if remain == 0:
        return n
    eye = np.eye(n.size)
    while remain > 0:
        gains = _allocation_value(a, n) - _allocation_value(a, n + eye)
        for idx in np.argsort(gains)[::-1]:
            if n[idx] < upper:
                n[idx] += 1
                break
        else:
            raise ValueError(f"budget {budget} does not fit {n.size} prompts at upper={upper}")
        remain -= 1
    if np.any((n > 0) & (n < min_keep)):
        small = n < min_keep
        freed = int(n[small].sum())
        n[small] = 0
        while freed > 0:
            for idx in np.argsort(n)[::-1]:
                if n[idx] < upper:
                    n[idx] += 1
                    break
            else:
                raise ValueError(f"budget {budget} does not fit {n.size} prompts at upper={upper}")
            freed -= 1
    return n


def even_split(num: int, budget: int, min_keep: int, rng: np.random.Generator) -> np.ndarray:
    """allocate_rollout's branch for near-equal predictions: budget // P each, the first prompts taking the
    remainder; below min_keep per prompt, budget // min_keep units of min_keep to prompts drawn with replacement.
    Upstream asserts that budget is then a multiple of min_keep; trace-rl keeps the remainder, giving it to the
    prompt drawn first (or, below one unit, all of the budget to one drawn prompt)."""
    if budget >= min_keep * num:
        m = np.full(num, budget // num, dtype=np.int64)
        m[: budget % num] += 1
        return m
    m = np.zeros(num, dtype=np.int64)
    units = budget // min_keep
    chosen = rng.choice(num, size=max(units, 1), replace=True)
    for idx in chosen[:units]:
        m[idx] += min_keep
    m[chosen[0]] += budget - units * min_keep
    return m


def allocate_vip(
    p,
    budget: int,
    lower: int = LOWER,
    upper: int = UPPER,
    rule: str = "rloo",
    min_keep: int = MIN_KEEP,
    seed: int = 0,
    continuous: ContinuousSolver | None = None,
) -> np.ndarray:
    """Rollouts per prompt (0: dropped) for predicted success rates p, as upstream's allocate_rollout computes
    them; `continuous` replaces the exact solver (the tests pass upstream's SLSQP)."""
    _check_rule(rule)
    p = check_probabilities("p", p)
    budget = check_budget("budget", budget)
    if p.size == 0:
        if budget:
            raise ValueError(f"budget {budget} cannot be spent on 0 prompts")
        return np.zeros(0, dtype=np.int64)
    if budget > upper * p.size:
        raise ValueError(f"budget {budget} exceeds upper={upper} rollouts for each of {p.size} prompts")
    clipped = np.clip(p, CLIP, 1 - CLIP)
    if np.std(clipped) < UNIFORM_STD:
        return even_split(p.size, budget, min_keep, np.random.default_rng(seed))
    if budget < lower * p.size:
        raise ValueError(f"budget {budget} is below lower={lower} rollouts for each of {p.size} prompts")
    solver = continuous or solve_continuous
    n = np.asarray(solver(clipped, budget, lower, upper, rule), dtype=np.float64)
    a, _ = _terms(clipped, rule)
    return round_allocation(n, a, budget, upper, min_keep)
