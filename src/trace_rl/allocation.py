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
taking the `budget` largest marginals q(1-q)^k is exact. We find their threshold by bisection on the log gain
(64 steps of O(n) each, so the cost does not grow with the budget); units at the threshold go to the anchor
with fewer continuations first, then in a seeded order. A marginal below the smallest positive double counts
as zero (it has underflowed), and budget left once every gain is zero spreads evenly the same way, so runs
reproduce.

Prefix problem under a cost budget (`allocate_prefixes_under_cost`): the same objective with sum c_j K_j <= budget,
where c_j is what a continuation from anchor j costs (the tokens or turns left of its rollout). Unequal costs make
it a knapsack, so the largest marginals are no longer exact; a dynamic programme over the budget is (integer
costs; the caller quantises tokens, `quantise_costs`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

REPAIR_WINDOW = 4  # a repair moves one prompt by at most this many units
REPAIR_CANDIDATES = 4  # prompts kept per (offset) in the repair search


def check_probabilities(name: str, x) -> np.ndarray:
    """x as a 1-D float array of probabilities, or a ValueError naming `name` (shared by the allocators)."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 1-D array of probabilities, got {x!r:.80}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of probabilities, got shape {arr.shape}")
    if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0.0 or arr.max() > 1.0):
        bad = arr[~(np.isfinite(arr) & (arr >= 0) & (arr <= 1))][:3]
        raise ValueError(f"{name} must hold probabilities in [0, 1]; found {bad.tolist()}")
    return arr


def check_budget(name: str, budget) -> int:
    """budget as a non-negative int, or a ValueError naming `name`."""
    if isinstance(budget, (bool, np.bool_)) or not isinstance(budget, (int, np.integer)):
        raise ValueError(f"{name} must be a non-negative integer, got {budget!r}")
    if budget < 0:
        raise ValueError(f"{name} must be non-negative, got {budget}")
    return int(budget)


def check_seed(seed) -> int:
    """seed as a non-negative int, or a ValueError."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


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


def unit_gains(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """gains[i, u-1-lo] for units u = lo+1..hi of prompt i under the linear extension f(1) = v(1-v).

    Rows are non-increasing within the block; `top_units` keeps them so across blocks.
    """
    lam = v * (1.0 - v)
    u = np.arange(lo + 1, hi + 1)
    powers = np.clip(u - 2, 0, None)
    scale = v[:, None] ** powers + (1.0 - v[:, None]) ** powers
    scale[:, u <= 3] = 1.0  # units 1-3 are exactly v(1-v); keep the float ties exact
    gains = lam[:, None] * np.minimum(scale, 1.0)
    return np.minimum.accumulate(gains, axis=1)


def tie_order(n: int, seed: int) -> np.ndarray:
    """rank[i]: position of prompt i among equals; a seeded permutation so ties reproduce yet carry no bias."""
    rank = np.empty(n, dtype=np.int64)
    rank[np.random.default_rng(seed).permutation(n)] = np.arange(n)
    return rank


GainBlock = Callable[[int, int], np.ndarray]  # (lo, hi) -> gains of units lo+1..hi, one row per item
FIRST_BLOCK = 16  # columns built before the first check; doubled until the threshold is provably inside


def top_units(block: GainBlock, n: int, width: int, count: int, rank: np.ndarray) -> np.ndarray:
    """Per row, how many of its leading units fall among the `count` largest of n rows x `width` unit gains.

    Rows must be non-increasing. Columns are built in doubling blocks and the search stops as soon as the
    count-th largest gain built so far beats every gain of the next column (then no later unit can enter),
    so a wide cap (a large max_per_prompt) costs memory only when the threshold really lies that deep.
    Units equal to the threshold go prompt by prompt in seeded order, so at most one prompt is cut mid-tie.
    """
    if count == 0 or n == 0:
        return np.zeros(n, dtype=np.int64)
    built = min(width, max(FIRST_BLOCK, -(-count // n)))
    gains = block(0, built)
    while True:
        flat = gains.ravel()
        threshold = np.partition(flat, flat.size - count)[flat.size - count] if count <= flat.size else -np.inf
        if built == width:
            rest = 0
            break
        nxt = np.minimum(block(built, built + 1)[:, 0], gains[:, -1])
        if threshold > nxt.max():
            rest = 0
            break
        if threshold == 0.0 and not nxt.any():
            rest = width - built  # every unbuilt gain is zero: count those ties without building them
            break
        hi = min(width, 2 * built)
        more = np.minimum(block(built, hi), gains[:, -1:])  # keep rows non-increasing across blocks
        gains = np.concatenate([gains, np.minimum.accumulate(more, axis=1)], axis=1)
        built = hi
    m = (gains > threshold).sum(axis=1)
    need = count - int(m.sum())
    if need:
        at = (gains == threshold).sum(axis=1) + np.where(gains[:, -1] == threshold, rest, 0)
        tied = np.flatnonzero(at)
        tied = tied[np.argsort(rank[tied], kind="stable")]
        before = np.concatenate(([0], np.cumsum(at[tied])[:-1]))
        m[tied] += np.minimum(at[tied], np.maximum(need - before, 0))
    return m


def allocate_roots(v, budget: int, max_per_prompt: int, seed: int = 0, skip: bool = True) -> np.ndarray:
    """Exact optimum of TRACE's root allocation; m_i = 0 skips prompt i.

    Spends `spendable_root_budget(len(v), budget, max_per_prompt)` rollouts (= budget whenever feasible).
    With skip=False every prompt gets at least 2 and the budget must cover that (TRACE's objective
    without skipping; Knapsack RL's own weighted objective is `trace_rl.knapsack.allocate_knapsack_rl`).
    No prompt can take more than the budget, so max_per_prompt is capped there: memory and time follow
    min(max_per_prompt, budget), and the columns of unit gains are built only as deep as the threshold.
    """
    v = check_probabilities("v", v)
    budget = check_budget("budget", budget)
    seed = check_seed(seed)
    if isinstance(max_per_prompt, bool) or not isinstance(max_per_prompt, (int, np.integer)) or max_per_prompt < 2:
        raise ValueError(f"max_per_prompt must be an integer >= 2 (m = 1 gives no contrast), got {max_per_prompt!r}")
    max_per_prompt = int(min(max_per_prompt, max(budget, 2)))
    n = v.size
    rank = tie_order(n, seed)
    if not skip:
        if budget < 2 * n:
            raise ValueError(f"budget {budget} cannot give each of the {n} prompts 2 rollouts (skip=False)")
        spend = min(budget, n * max_per_prompt)
        extra = top_units(lambda lo, hi: unit_gains(v, lo + 2, hi + 2), n, max_per_prompt - 2, spend - 2 * n, rank)
        return 2 + extra
    spend = spendable_root_budget(n, budget, max_per_prompt)
    m = np.zeros(n, dtype=np.int64)
    if spend == 0:
        return m
    if max_per_prompt == 2:  # every prompt is 0 or 2: take the spend/2 best prompts
        order = np.lexsort((rank, -v * (1.0 - v)))
        m[order[: spend // 2]] = 2
        return m
    m = top_units(lambda lo, hi: unit_gains(v, lo, hi), n, max_per_prompt, spend, rank)
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


LOG_TINY = float(np.log(np.nextafter(0.0, 1.0)))  # log of the smallest positive double: below it a gain is 0


def _prefix_counts(log_q: np.ndarray, slope: np.ndarray, mu: float) -> np.ndarray:
    """K_j(mu) = #{k >= 0 : log q_j + k log(1 - q_j) > mu}, the units of anchor j whose log gain beats mu."""
    with np.errstate(invalid="ignore", divide="ignore"):
        x = (mu - log_q) / slope  # > 0 where the first unit beats mu; slope = -inf (q = 1) gives 0 -> 1 unit
    k = np.ceil(np.clip(np.where(np.isnan(x), 0.0, x), 0.0, 2.0**62)).astype(np.int64)
    k = np.where(slope == -np.inf, 1, k)
    return np.where(log_q > mu, np.maximum(k, 1), 0)


def _water_fill(k: np.ndarray, cap: np.ndarray, units: int, rank: np.ndarray) -> np.ndarray:
    """Add `units` one at a time, each to the anchor with the fewest so far among those under their cap, ties
    by seeded rank, in O(n) per step of a bisection on the final level (so not per unit)."""
    if units == 0:
        return k
    hi_cap = k + cap  # cap may be huge (int64): no overflow because both stay below 2**62 + budget

    def placed(level: int) -> int:
        return int(np.sum(np.clip(np.minimum(level, hi_cap) - k, 0, None)))

    open_ = cap > 0
    if not open_.any():
        raise RuntimeError("prefix allocation has budget left and no anchor to take it; please report this instance")
    # placed(lo) = 0 <= units and placed(hi + 1) > units: find the largest level that places at most `units`
    lo, hi = int(k[open_].min()), int(k[open_].max()) + units
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if placed(mid) <= units else (lo, mid - 1)
    out = np.maximum(k, np.minimum(lo, hi_cap))
    left = units - int(np.sum(out - k))
    if left:  # anchors that sit at the level and can take one more, in seeded order
        room = np.flatnonzero((out == lo) & (hi_cap > lo))
        room = room[np.argsort(rank[room], kind="stable")][:left]
        out[room] += 1
    return out


def allocate_prefixes(flip_prob, budget: int, seed: int = 0) -> np.ndarray:
    """Exact optimum of TRACE's prefix allocation: K_j >= 0, sum K_j = budget, max sum 1 - (1 - q_j)^K_j.

    Takes the `budget` largest marginal gains q_j (1 - q_j)^k, found through a threshold on their logarithm,
    so time is O(n) per bisection step (at most 64 steps on the bits of a double), whatever the budget.
    Units at the threshold (within a double's resolution) go first to the anchor with fewer continuations,
    then in a seeded order; a gain below the smallest positive double counts as zero, and budget left once
    every gain is zero spreads evenly by the same rule (fewest continuations first, then seeded order).
    With no anchors the budget cannot be spent and all-zero (empty) is returned; callers account for it.
    """
    q = check_probabilities("flip_prob", flip_prob)
    budget = check_budget("budget", budget)
    seed = check_seed(seed)
    if q.size == 0 or budget == 0:
        return np.zeros(q.size, dtype=np.int64)
    rank = tie_order(q.size, seed)
    with np.errstate(divide="ignore"):
        log_q, slope = np.log(q), np.log1p(-q)  # q = 0: no positive gain; q = 1: one unit of gain 1
    positive = _prefix_counts(log_q, slope, LOG_TINY)
    total = int(np.minimum(positive, budget + 1).sum())  # clipped: an anchor with a tiny q holds ~1/q units
    if total <= budget:
        return _water_fill(positive, np.full(q.size, 2**62, dtype=np.int64), budget - total, rank)
    # Bisection on the log threshold: counts(lo) > budget >= counts(hi). Non-positive doubles order inversely
    # to their bit patterns, so bisect on -mu's bits, which converges to adjacent doubles in <= 64 steps.
    lo_bits = int(np.float64(-LOG_TINY).view(np.int64))
    hi_bits = int(np.float64(max(-float(log_q.max()), 0.0)).view(np.int64))
    while lo_bits - hi_bits > 1:
        mid = (lo_bits + hi_bits) // 2
        count = int(np.minimum(_prefix_counts(log_q, slope, -np.int64(mid).view(np.float64)), budget + 1).sum())
        if count > budget:
            lo_bits = mid
        else:
            hi_bits = mid
            if count == budget:
                break
    k = np.minimum(_prefix_counts(log_q, slope, -np.int64(hi_bits).view(np.float64)), budget)
    tied = np.minimum(_prefix_counts(log_q, slope, -np.int64(lo_bits).view(np.float64)), budget) - k
    return _water_fill(k, tied, budget - int(k.sum()), rank)


def prefix_value(flip_prob, counts) -> float:
    """Objective of the prefix problem: expected number of anchors with at least one flipped continuation."""
    q = np.asarray(flip_prob, dtype=np.float64)
    return float(np.sum(1.0 - (1.0 - q) ** np.asarray(counts)))


def allocate_tree_mixing(flip_probs, agree, budget: int, seed: int = 0) -> list[np.ndarray]:
    """Stage 2 pooled over a step's trees (`trace_mix`): continuations per anchor of each tree.

    Maximises the expected number of trees whose bare rollouts agreed (all failed or all succeeded) that end
    with both outcomes, sum_t 1 - prod_j (1 - q_tj)^K_tj over the agreeing trees, sum K = budget. For a tree's
    count k_t the product is smallest with every unit on its likeliest flip q*_t (ties: the first anchor), so the
    problem is the prefix problem on the q*_t and `allocate_prefixes` solves it exactly. Trees that disagree
    already get nothing: their contrast needs no continuation. When no agreeing tree has an anchor that can flip
    (q > 0), every anchor of every tree competes under stage 2's own objective (`allocate_prefixes` on them
    all). `flip_probs[t]` holds tree t's anchors' flip probabilities (maybe none); `agree[t]` whether its bare
    rollouts agreed.
    """
    qs = [check_probabilities(f"flip_probs[{t}]", q) for t, q in enumerate(flip_probs)]
    agree = np.asarray(agree, dtype=bool)
    if agree.shape != (len(qs),):
        raise ValueError(f"agree must hold one flag per tree ({len(qs)}), got shape {agree.shape}")
    budget = check_budget("budget", budget)
    out = [np.zeros(q.size, dtype=np.int64) for q in qs]
    targets = [t for t, q in enumerate(qs) if agree[t] and q.size and q.max() > 0]
    if targets:
        best = [int(np.argmax(qs[t])) for t in targets]
        k = allocate_prefixes([qs[t][j] for t, j in zip(targets, best)], budget, seed=seed)
        for t, j, kt in zip(targets, best, k):
            out[t][j] = kt
        return out
    if not qs:
        return out
    k = allocate_prefixes(np.concatenate(qs), budget, seed=seed)
    return np.split(k, np.cumsum([q.size for q in qs])[:-1])


def tree_mixing_value(flip_probs, agree, counts) -> float:
    """The objective of `allocate_tree_mixing`: expected agreeing trees made mixed by `counts` (per anchor)."""
    total = 0.0
    for q, a, k in zip(flip_probs, agree, counts):
        if a and len(q):
            total += 1.0 - float(np.prod((1.0 - np.asarray(q, dtype=np.float64)) ** np.asarray(k)))
    return total


COST_UNITS = 512  # budget units of the cost-budget stage 2: its dynamic programme is O(anchors * units^2 / min cost)


def quantise_costs(cost, budget: int, units: int = COST_UNITS) -> tuple[np.ndarray, int]:
    """Costs and budget in units of ceil(budget / units): costs round up and the budget down, so an allocation
    within the quantised budget stays within the real one. Returns (costs in units, at least 1; budget in units)."""
    c = np.asarray(cost, dtype=np.int64)
    budget = check_budget("budget", budget)
    if c.size and c.min() < 1:
        raise ValueError(f"cost must hold positive integers; found {c[c < 1][:3].tolist()}")
    unit = max(1, -(-budget // units))
    return -(-c // unit), budget // unit


def allocate_prefixes_under_cost(flip_prob, cost, budget: int, seed: int = 0) -> np.ndarray:
    """Exact optimum of stage 2 under a cost budget: K_j >= 0, sum c_j K_j <= budget, max sum 1 - (1 - q_j)^K_j.

    f_j(b), the best value of anchors 1..j within b, is max over K <= b / c_j of f_(j-1)(b - K c_j) + g_j(K): time
    O(n * budget^2 / min c), memory n * budget (so callers quantise, `quantise_costs`). Anchors are taken in a
    seeded order and a unit is added only where it raises the value, so ties go to anchors earlier in that order
    and a unit of zero gain (q = 0, or a gain below a double's resolution) is not spent: budget the objective
    cannot use stays unspent. With no anchors, or nothing affordable, all-zero is returned.
    """
    q = check_probabilities("flip_prob", flip_prob)
    c = np.asarray(cost)
    if c.shape != q.shape or (c.size and (not np.issubdtype(c.dtype, np.integer) or c.min() < 1)):
        raise ValueError(f"cost must hold one positive integer per anchor ({q.size}), got {np.asarray(cost)!r}")
    budget = check_budget("budget", budget)
    seed = check_seed(seed)
    k = np.zeros(q.size, dtype=np.int64)
    if q.size == 0 or budget == 0:
        return k
    order = np.random.default_rng(seed).permutation(q.size)
    best = np.zeros(budget + 1)  # f over budgets 0..budget (at most b spent)
    choice = np.zeros((q.size, budget + 1), dtype=np.int64)
    for step, j in enumerate(order):
        cj = int(c[j])
        prev, new = best, best.copy()
        for units in range(1, budget // cj + 1):
            gain = 1.0 - (1.0 - q[j]) ** units
            cand = prev[: budget + 1 - units * cj] + gain
            better = cand > new[units * cj :]
            new[units * cj :][better] = cand[better]
            choice[step, units * cj :][better] = units
        best = new
    b = budget
    for step in range(q.size - 1, -1, -1):
        j = order[step]
        k[j] = choice[step, b]
        b -= k[j] * int(c[j])
    return k
