"""Statistics for comparisons over seeds: a t interval for a mean, a paired bootstrap interval for a difference
of methods, and the cost (rollouts, turns or tokens) a run needs to reach a target accuracy.

Trade-offs and limits, stated plainly:
- `mean_ci` is Student's t interval: it assumes the per-seed values are roughly normal; with 5-10 seeds that is
  the usual choice and it is wider (more honest) than a normal interval. One value gives nan bounds.
- `paired_bootstrap_ci` resamples the per-seed differences a_i - b_i (percentile interval). With few seeds the
  bootstrap distribution is coarse (n distinct values when n = 2) and the percentile interval is somewhat too
  narrow; it needs no normality, which is why compare tables use it for method differences. It is seeded, so a
  table reproduces.
- `cost_to_target` reads the first crossing off a curve interpolated linearly between evaluations: it is
  exact at evaluation points and an estimate in between; a curve that dips and recovers counts its first
  crossing. nan when the target is never reached; `cost_to_target_ci` averages the seeds that reached it and
  says how many did.
- Numpy and the standard library only (the t quantile is computed here, not taken from scipy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(c) > tiny else 1.0 + aa / tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(c) > tiny else 1.0 + aa / tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t cumulative distribution function."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """Inverse of `t_cdf` in its first argument, by bisection (to 1e-12)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"t_quantile: q must lie in (0, 1), got {q}")
    if q == 0.5:
        return 0.0
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > q:
        lo *= 2.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
    while hi - lo > 1e-12 * max(1.0, abs(hi)):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return 0.5 * (lo + hi)


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")


def mean_ci(x: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): Student's t interval for the mean over seeds; nan bounds for a single value, all nan for
    none. Non-finite values (a seed that never reached a target) must be dropped by the caller."""
    _check_level(level)
    v = np.asarray(x, dtype=float)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    m = float(v.mean())
    if v.size == 1:
        return m, math.nan, math.nan
    half = t_quantile(0.5 + level / 2.0, v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return m, m - half, m + half


def paired_bootstrap_ci(
    a: Sequence[float], b: Sequence[float], level: float = 0.95, n_boot: int = 10000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean of a_i - b_i, lo, hi): percentile bootstrap interval over the per-seed paired differences. a and b
    are the same seeds in the same order; one pair gives nan bounds."""
    _check_level(level)
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")
    av, bv = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if av.shape != bv.shape or av.ndim != 1:
        raise ValueError(f"paired_bootstrap_ci: a and b must be 1-d and of one length, got {av.shape} and {bv.shape}")
    d = av - bv
    if d.size == 0:
        return math.nan, math.nan, math.nan
    m = float(d.mean())
    if d.size == 1:
        return m, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return m, float(lo), float(hi)


def cost_to_target(costs: Sequence[float], values: Sequence[float], target: float) -> float:
    """The cost at which `values` (evaluated at increasing `costs`) first reaches `target`, interpolating linearly
    between the evaluation before the crossing and the one at it; the first cost if the first value already
    reaches it; nan if no value does."""
    c, v = np.asarray(costs, dtype=float), np.asarray(values, dtype=float)
    if c.shape != v.shape or c.ndim != 1:
        raise ValueError(f"cost_to_target: costs and values must be 1-d and of one length, got {c.shape}, {v.shape}")
    hits = np.flatnonzero(v >= target)
    if hits.size == 0:
        return math.nan
    i = int(hits[0])
    if i == 0:
        return float(c[0])
    c0, c1, v0, v1 = c[i - 1], c[i], v[i - 1], v[i]  # v0 < target <= v1, so v1 > v0
    return float(c0 + (target - v0) / (v1 - v0) * (c1 - c0))


def cost_to_target_ci(
    curves: Sequence[tuple[Sequence[float], Sequence[float]]],
    targets: float | Sequence[float],
    level: float = 0.95,
) -> tuple[float, float, float, int]:
    """(mean, lo, hi, seeds that reached it): `cost_to_target` per seed's (costs, values) curve, against one
    target or one per seed (e.g. GRPO's final accuracy on the same seed), with `mean_ci` over the seeds that
    reached their target. A mean over the reaching seeds only flatters a method that often misses: read it with
    the count. A cost is never negative, so the t interval's lower end is cut at 0 (with 2-3 seeds it often
    falls below)."""
    tg = [float(targets)] * len(curves) if np.isscalar(targets) else [float(t) for t in targets]  # type: ignore[union-attr]
    if len(tg) != len(curves):
        raise ValueError(f"cost_to_target_ci: {len(curves)} curves but {len(tg)} targets")
    hit = [x for x in (cost_to_target(c, v, t) for (c, v), t in zip(curves, tg)) if not math.isnan(x)]
    m, lo, hi = mean_ci(hit, level)
    return m, (lo if math.isnan(lo) else max(lo, 0.0)), hi, len(hit)
