"""Exact TRACE allocators: root rollouts across prompts (stage 1) and continuations across prefixes (stage 2).

Root problem: maximise sum_i f(v_i, m_i), f(v, m) = 1 - v^m - (1-v)^m, with m_i in {0} U {2..m_max} and
sum m_i = M. Per unit, the gains are v(1-v) for units 1, 2 and 3 and then v(1-v)(v^(u-2) + (1-v)^(u-2)),
non-increasing, so the problem is a concave resource allocation except that m = 1 is forbidden. We solve the
concave relaxation by a threshold on the unit gains (O(B * m_max), no sort of the whole pool), and when the
threshold cuts a prompt to m = 1 we repair with a small exact search over the few prompts whose allocation
can change by at most REPAIR_WINDOW units. Exactness against a brute-force knapsack DP is what the tests
check, on thousands of random instances.

Budget rule: when sum m_i = M has no feasible solution (M = 1, M odd with m_max = 2, M > B * m_max), we
spend the largest total below M that is feasible; `spendable_root_budget` says what that is.

Prefix problem: maximise sum 1 - (1-q_j)^K_j with sum K_j = budget, K_j >= 0. Each term is concave, so
greedy on the marginal q(1-q)^k is exact; at equal marginal the anchor with fewer continuations wins, then a
seeded order, so budget left after every gain is zero spreads evenly and runs reproduce.
"""

from __future__ import annotations

import heapq

import numpy as np

REPAIR_WINDOW = 4  # a repair moves one prompt by at most this many units
REPAIR_CANDIDATES = 4  # prompts kept per (offset) in the repair search


def _probabilities(name: str, x) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of probabilities, got shape {arr.shape}")
    if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0.0 or arr.max() > 1.0):
        bad = arr[~(np.isfinite(arr) & (arr >= 0) & (arr <= 1))][:3]
        raise ValueError(f"{name} must hold probabilities in [0, 1]; found {bad.tolist()}")
    return arr


def _budget(name: str, budget) -> int:
    if isinstance(budget, (bool, np.bool_)) or not isinstance(budget, (int, np.integer)):
        raise ValueError(f"{name} must be a non-negative integer, got {budget!r}")
    if budget < 0:
        raise ValueError(f"{name} must be non-negative, got {budget}")
    return int(budget)


def root_value(v, m):
    """Probability that m rollouts of a prompt with success probability v hold a success and a failure."""
    v = np.asarray(v, dtype=np.float64)
    m = np.asarray(m)
    out = 1.0 - v**m - (1.0 - v) ** m
    return np.where(m >= 2, out, 0.0)


def prefix_flip_prob(reward, v):
    """q = r(1 - V(H)) + (1 - r)V(H): the chance one continuation from H flips the observed outcome r."""
    r = np.asarray(reward, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    return r * (1.0 - v) + (1.0 - r) * v


def spendable_root_budget(num_prompts: int, budget: int, max_per_prompt: int) -> int:
    """The largest total <= budget that some m in {0, 2..max_per_prompt}^num_prompts sums to."""
    cap = num_prompts * max_per_prompt
    spend = min(budget, cap)
    if spend == 1:
        return 0
    if max_per_prompt == 2 and spend % 2:
        return spend - 1
    return spend


def _unit_gains(v: np.ndarray, max_per_prompt: int) -> np.ndarray:
    """gains[i, u-1] = value of the u-th rollout of prompt i under the linear extension f(1) = v(1-v)."""
    lam = v * (1.0 - v)
    u = np.arange(1, max_per_prompt + 1)
    powers = np.clip(u - 2, 0, None)
    scale = v[:, None] ** powers + (1.0 - v[:, None]) ** powers
    scale[:, :3] = 1.0  # units 1-3 are exactly v(1-v); keep the float ties exact
    gains = lam[:, None] * np.minimum(scale, 1.0)
    return np.minimum.accumulate(gains, axis=1)


def _tie_order(n: int, seed: int) -> np.ndarray:
    """rank[i]: position of prompt i among equals; a seeded permutation so ties reproduce yet carry no bias."""
    rank = np.empty(n, dtype=np.int64)
    rank[np.random.default_rng(seed).permutation(n)] = np.arange(n)
    return rank


def _top_units(gains: np.ndarray, count: int, rank: np.ndarray) -> np.ndarray:
    """Per row, how many of its leading units fall among the `count` largest unit gains (rows non-increasing).

    Units equal to the threshold go prompt by prompt in seeded order, so at most one prompt is cut mid-tie.
    """
    if count == 0:
        return np.zeros(gains.shape[0], dtype=np.int64)
    flat = gains.ravel()
    threshold = np.partition(flat, flat.size - count)[flat.size - count]
    m = (gains > threshold).sum(axis=1)
    need = count - int(m.sum())
    if need:
        at = (gains == threshold).sum(axis=1)
        tied = np.flatnonzero(at)
        tied = tied[np.argsort(rank[tied], kind="stable")]
        before = np.concatenate(([0], np.cumsum(at[tied])[:-1]))
        m[tied] += np.minimum(at[tied], np.maximum(need - before, 0))
    return m


def allocate_roots(v, budget: int, max_per_prompt: int, seed: int = 0, skip: bool = True) -> np.ndarray:
    """Exact optimum of TRACE's root allocation; m_i = 0 skips prompt i.

    Spends `spendable_root_budget(len(v), budget, max_per_prompt)` rollouts (= budget whenever feasible).
    With skip=False (Knapsack RL's setting) every prompt gets at least 2 and the budget must cover that.
    """
    v = _probabilities("v", v)
    budget = _budget("budget", budget)
    if isinstance(max_per_prompt, bool) or not isinstance(max_per_prompt, (int, np.integer)) or max_per_prompt < 2:
        raise ValueError(f"max_per_prompt must be an integer >= 2 (m = 1 gives no contrast), got {max_per_prompt!r}")
    max_per_prompt = int(max_per_prompt)
    n = v.size
    rank = _tie_order(n, seed)
    if not skip:
        if budget < 2 * n:
            raise ValueError(f"budget {budget} cannot give each of the {n} prompts 2 rollouts (skip=False)")
        spend = min(budget, n * max_per_prompt)
        return 2 + _top_units(_unit_gains(v, max_per_prompt)[:, 2:], spend - 2 * n, rank)
    spend = spendable_root_budget(n, budget, max_per_prompt)
    m = np.zeros(n, dtype=np.int64)
    if spend == 0:
        return m
    if max_per_prompt == 2:  # every prompt is 0 or 2: take the spend/2 best prompts
        order = np.lexsort((rank, -v * (1.0 - v)))
        m[order[: spend // 2]] = 2
        return m
    m = _top_units(_unit_gains(v, max_per_prompt), spend, rank)
    for p in np.flatnonzero(m == 1):  # at most one: the threshold cut a prompt after its first unit
        _repair(m, v, int(p), max_per_prompt, rank)
    return m


def _repair(m: np.ndarray, v: np.ndarray, p: int, max_per_prompt: int, rank: np.ndarray) -> None:
    """Move prompt p off m = 1 at the least loss, changing a few prompts by at most REPAIR_WINDOW units each.

    The relaxed solution is optimal for the linear extension, so the true optimum only moves a handful of
    units near the threshold; an exact DP over the best candidates for each offset finds it.
    """
    w = REPAIR_WINDOW
    offsets = np.arange(-w, w + 1)
    new = m[:, None] + offsets[None, :]
    ok = (new >= 0) & (new <= max_per_prompt) & (new != 1)
    cur_val = root_value(v, m)
    delta = np.where(ok, root_value(v[:, None], np.clip(new, 0, None)) - cur_val[:, None], -np.inf)
    delta[:, w] = np.where(np.arange(len(m)) == p, -np.inf, 0.0)  # p must move
    # Keep the best few prompts per offset (ties by seeded rank), plus p itself.
    cands = {p}
    for j, d in enumerate(offsets):
        if d == 0:
            continue
        col = delta[:, j]
        finite = np.flatnonzero(np.isfinite(col))
        if finite.size == 0:
            continue
        k = min(REPAIR_CANDIDATES, finite.size)
        part = finite[np.argpartition(-col[finite], k - 1)[:k]] if finite.size > k else finite
        cands.update(int(i) for i in part)
    cands = sorted(cands, key=lambda i: rank[i])
    # DP over net offset: best[s] = (value, choices) after the candidates seen so far.
    best: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for i in cands:
        nxt: dict[int, tuple[float, tuple[int, ...]]] = {}
        for s, (val, ch) in best.items():
            for j, d in enumerate(offsets):
                g = delta[i, j]
                if not np.isfinite(g):
                    continue
                key, cand = s + int(d), val + g
                if key not in nxt or cand > nxt[key][0] + 1e-15:
                    nxt[key] = (cand, ch + (int(d),))
        best = {s: t for s, t in nxt.items() if abs(s) <= w * 2}
    if 0 not in best:
        raise RuntimeError("root allocation repair found no feasible move; please report this instance")
    for i, d in zip(cands, best[0][1]):
        m[i] += d


def allocate_prefixes(flip_prob, budget: int, seed: int = 0) -> np.ndarray:
    """Exact optimum of TRACE's prefix allocation: K_j >= 0, sum K_j = budget, max sum 1 - (1 - q_j)^K_j.

    With no anchors the budget cannot be spent and all-zero (empty) is returned; callers account for it.
    """
    q = _probabilities("flip_prob", flip_prob)
    budget = _budget("budget", budget)
    k = np.zeros(q.size, dtype=np.int64)
    if q.size == 0 or budget == 0:
        return k
    rank = _tie_order(q.size, seed)
    heap = [(-float(qj), 0, int(rank[j]), j) for j, qj in enumerate(q)]
    heapq.heapify(heap)
    for _ in range(budget):
        neg_gain, kj, r, j = heapq.heappop(heap)
        k[j] = kj + 1
        heapq.heappush(heap, (neg_gain * (1.0 - q[j]), kj + 1, r, j))
    return k


def prefix_value(flip_prob, counts) -> float:
    """Objective of the prefix problem: expected number of anchors with at least one flipped continuation."""
    q = np.asarray(flip_prob, dtype=np.float64)
    return float(np.sum(1.0 - (1.0 - q) ** np.asarray(counts)))
