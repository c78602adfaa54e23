"""Root objectives weighted by what a group teaches, and the exact allocator for any of them (stage 1).

TRACE's root objective f(v, m) = 1 - v^m - (1-v)^m counts mixed groups: a prompt's second rollout is worth as much
as its eighth is not, so the optimum spreads the budget thin (about 4 rollouts a prompt on the testbed, where
PCL gives 8). What a group teaches is its policy-gradient step. In a one-logit model of prompt i (success
probability v = sigma(theta)), rollout j's score is d log pi(y_j) / d theta = r_j - v, so a group of m rollouts
with k successes and advantages A_j moves theta by sum_j A_j (r_j - v). With A_j = r_j - mean r (no scaling) that
is sum_j (r_j - mean r)^2 = k(m-k)/m; with A_j = (r_j - mean r) / std r (GRPO's and trace-rl's default scale) it is
m std r = sqrt(k(m-k)). One family covers both, and the mixed-group count's neighbour:

    teach_alpha(v, m) = E_{k ~ Bin(m, v)} [ m (p^(1-p^))^alpha ],  p^ = k/m   (0 when k = 0 or m)

- alpha = 0:   m f(v, m), the expected rows with a non-zero advantage; also E[sum_j A_j^2] under std scaling.
- alpha = 1/2: E[sqrt(k(m-k))], the expected std-scaled step along the prompt's success logit (per rollout,
  about sqrt(v(1-v)) once m is large: the "sqrt(p(1-p)) per sample" weight).
- alpha = 1:   (m-1) v (1-v), the unscaled (Dr. GRPO) step; linear in m, so its optimum gives max_per_prompt
  rollouts to the prompts with the largest v(1-v): PCL's selection with TRACE's skipping.

Limits, stated: the one-logit model ignores that prompts share parameters (a tabular or neural policy couples
them) and the variance of the step (VIP's objective is the variance); the objective sees the bare rollouts only,
not the continuations stage 2 adds below them; v is the predictor's point estimate, so a miscalibrated V~ is
taken at its word, as in TRACE's own objective.

None of these is concave in m (for alpha < 1 the per-rollout value rises with m before it flattens), so the
threshold routine of `allocation.allocate_roots` is not exact here. `allocate_by_value` solves any separable
objective sum_i F_i(m_i), m_i in {0} U {2..m_max}, sum m_i = M exactly by dynamic programming over the budget:
O(n M m_max) time (numpy over the budget axis, one pass per prompt) and O(n M) memory for the back-pointers.
That is 2 ms at a step's size (128 candidates, M = 128, m_max = 8) and 0.6 s at 1,000 prompts, M = 4,096,
m_max = 16, where the threshold allocator takes under a millisecond: it stays the one for f. Between allocations
of equal total the prompts earlier in a seeded order take the budget, so runs reproduce and no index is favoured.
"""

from __future__ import annotations

import math

import numpy as np

from ..allocation import check_budget, check_probabilities, check_seed, spendable_root_budget, tie_order

# alpha of each named objective (methods pick them by name)
TEACH_ALPHA = {"rows": 0.0, "grad": 0.5, "grad_unscaled": 1.0}


def _check_max(max_per_prompt) -> int:
    if isinstance(max_per_prompt, bool) or not isinstance(max_per_prompt, (int, np.integer)) or max_per_prompt < 2:
        raise ValueError(f"max_per_prompt must be an integer >= 2 (m = 1 gives no contrast), got {max_per_prompt!r}")
    return int(max_per_prompt)


def teach_value(v, max_per_prompt: int, alpha: float) -> np.ndarray:
    """table[i, m] = teach_alpha(v_i, m) for m = 0..max_per_prompt (see the module docstring); 0 for m < 2."""
    v = check_probabilities("v", v)
    mmax = _check_max(max_per_prompt)
    if not (isinstance(alpha, (int, float, np.floating)) and 0.0 <= float(alpha) <= 1.0):
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    table = np.zeros((v.size, mmax + 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        log_v, log_w = np.log(v), np.log1p(-v)
    for m in range(2, mmax + 1):
        k = np.arange(1, m)  # mixed groups only: k = 0 and k = m teach nothing
        log_binom = np.array([math.lgamma(m + 1) - math.lgamma(j + 1) - math.lgamma(m - j + 1) for j in k])
        with np.errstate(invalid="ignore"):  # 0 * -inf where v is 0 or 1: that group's probability is 0
            logp = log_binom[None, :] + k[None, :] * log_v[:, None] + (m - k)[None, :] * log_w[:, None]
        prob = np.where(np.isnan(logp), 0.0, np.exp(logp))
        table[:, m] = prob @ (m * (k / m * (1.0 - k / m)) ** float(alpha))
    return table


def allocate_by_value(values, budget: int, seed: int = 0) -> np.ndarray:
    """Exact argmax of sum_i values[i, m_i] over m_i in {0} U {2..m_max}, sum m_i = M; m_max = columns - 1.

    M = `allocation.spendable_root_budget(rows, budget, m_max)`, the same budget rule as TRACE's root allocator
    (budget whenever some allocation sums to it). m = 1 is forbidden, so values[i, 1] is never read; m = 0 (a
    skipped prompt) scores values[i, 0]. Between allocations of equal total, prompts earlier in a seeded order
    take the budget (a later prompt is used only where it strictly improves the total), reproducibly.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] < 3 or not np.all(np.isfinite(values)):
        raise ValueError(
            f"values must be a finite (prompts, max_per_prompt + 1) table with >= 3 columns, got {values.shape}"
        )
    budget = check_budget("budget", budget)
    seed = check_seed(seed)
    n, mmax = values.shape[0], values.shape[1] - 1
    spend = spendable_root_budget(n, budget, mmax)
    m = np.zeros(n, dtype=np.int64)
    if spend == 0:
        return m
    order = np.argsort(tie_order(n, seed), kind="stable")  # prompts in seeded order
    sizes = np.arange(2, mmax + 1)
    b_axis = np.arange(spend + 1)
    src = b_axis[:, None] - sizes[None, :]
    ok = src >= 0
    src = np.where(ok, src, 0)
    best = np.full(spend + 1, -np.inf)
    best[0] = 0.0
    choice = np.zeros((n, spend + 1), dtype=np.int64)
    for step, i in enumerate(order):
        gain = values[i, 2:] - values[i, 0]
        cand = np.where(ok, best[src] + gain[None, :], -np.inf)
        j = np.argmax(cand, axis=1)
        top = cand[b_axis, j]
        take = top > best  # only a strict gain over the earlier prompts' best: equal totals keep this one at 0
        choice[step] = np.where(take, sizes[j], 0)
        best = np.where(take, top, best)
    if not np.isfinite(best[spend]):  # spendable_root_budget promises a feasible total
        raise RuntimeError(f"no allocation sums to {spend}; please report this instance")
    left = spend
    for step in range(n - 1, -1, -1):
        m[order[step]] = choice[step, left]
        left -= choice[step, left]
    return m


def allocate_roots_teach(v, budget: int, max_per_prompt: int, objective: str, seed: int = 0) -> np.ndarray:
    """Root rollouts per prompt maximising sum_i teach_alpha(v_i, m_i) for the named objective exactly (a
    prompt at m = 0 is skipped); the objectives and their alpha are TEACH_ALPHA."""
    if objective not in TEACH_ALPHA:
        raise ValueError(f"objective must be one of {', '.join(TEACH_ALPHA)}, got {objective!r}")
    mmax = _check_max(max_per_prompt)
    budget = check_budget("budget", budget)
    mmax = min(mmax, max(budget, 2))  # no prompt can take more than the budget
    return allocate_by_value(teach_value(v, mmax, TEACH_ALPHA[objective]), budget, seed=seed)
