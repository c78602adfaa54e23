"""Reference copy of Knapsack RL's rollout allocator, for timing and for the tests that pin its behaviour.

Source: github.com/liziniu/KnapsackRL, commit ca5d5f5b7e933378d916d05d1aeb4ae9de929ee5,
file verl/trainer/ppo/exploration_utils.py (functions `sampling_budget_by_knapsack`, `dp_core_numba`,
`solve_by_dp`). Licensed under the Apache License, Version 2.0 (the repository's LICENSE); this is a
derivative copy: the algorithm, branches and arithmetic are kept line for line, while logging, the
`print_results` table and the timing calls are removed and the code is reformatted. Do not "fix" it: it is
here to measure the original against trace_rl.knapsack, including where the two differ (docs/baselines.md).

The numba kernel is used exactly when upstream uses it (numba importable and n_items * budget * max_n >
50,000); otherwise the pure-Python triple loop runs, as upstream's does.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit

    NUMBA_AVAILABLE = True
except ImportError:  # upstream falls back to the pure-Python DP in the same way
    NUMBA_AVAILABLE = False


def sampling_budget_by_knapsack(
    reward_states: np.ndarray,
    n: int,
    min_n: int = 2,
    max_n: int | None = None,
    alpha: float = 0.9,
    solver: str = "dp",
    allow_fallback: bool = True,
    negative_n: int | None = None,
    positive_n: int | None = None,
    total_budget: int | None = None,
    cost_estimation: str = "probability",
) -> tuple[np.ndarray, dict]:
    """Upstream's entry point. reward_states: rows of [validity, success_rate, count]."""
    batch_size = len(reward_states)
    if total_budget is None:
        total_budget = batch_size * n
    if negative_n is None:
        negative_n = min_n
    if positive_n is None:
        positive_n = min_n

    sampling_budget = np.zeros(batch_size, dtype=np.int32)
    costs = np.zeros(batch_size, dtype=np.float32)
    success_rates = np.zeros(batch_size, dtype=np.float32)
    effective_indices = []

    for i in range(batch_size):
        if reward_states[i][0] == 1:
            success_rate = reward_states[i][1]
            if 0 < success_rate < 1:
                if cost_estimation == "probability":
                    cost = np.log(1 - alpha) / np.log(max(success_rate, 1 - success_rate))
                elif cost_estimation == "expectation":
                    cost = 1 / (success_rate * (1 - success_rate)) - 1
                else:
                    raise ValueError(f"Unknown cost estimation method: {cost_estimation}")
                sampling_budget[i] += min_n
                effective_indices.append(i)
            elif success_rate == 0:
                cost = float("inf")
                sampling_budget[i] += int(negative_n)
            else:
                cost = 0
                sampling_budget[i] += int(positive_n)
            costs[i] = cost
            success_rates[i] = success_rate
        else:
            sampling_budget[i] += n

    total_budget_backup = total_budget
    total_budget -= sum(sampling_budget)

    fallback = False
    fallback_effective_ratio = 1.0

    if total_budget > 0 and len(effective_indices) == 0:
        zero_success_indices = np.where(success_rates == 0)[0]
        if len(zero_success_indices) > 0:
            budget_per_state = total_budget // len(zero_success_indices)
            remainder = total_budget % len(zero_success_indices)
            for idx, i in enumerate(zero_success_indices):
                extra_budget = budget_per_state + (1 if idx < remainder else 0)
                sampling_budget[i] += extra_budget
                total_budget -= extra_budget
        else:
            sampling_budget = np.zeros(batch_size, dtype=np.int32)
            sampling_budget[:] = n
    else:
        estimated_cost = 0
        for idx in effective_indices:
            estimated_cost += int(min(max_n, costs[idx]))

        if estimated_cost < total_budget and allow_fallback:
            fallback = True
            fallback_effective_ratio = estimated_cost / total_budget
            zero_success_indices = np.where(success_rates == 0)[0]
            abundant_budget = total_budget - estimated_cost
            if len(zero_success_indices) > 0:
                candidate_indices = zero_success_indices
            else:
                candidate_indices = [i for i in range(batch_size) if i not in effective_indices]
            budget_per_candidate = abundant_budget // len(candidate_indices)
            remainder = abundant_budget % len(candidate_indices)
            for idx, i in enumerate(candidate_indices):
                extra_budget = budget_per_candidate + (1 if idx < remainder else 0)
                sampling_budget[i] += extra_budget
            total_budget = total_budget - abundant_budget

        main_sampling_budget = solve_by_dp(
            success_rates,
            effective_indices,
            min_n,
            max_n - min_n,
            total_budget,
            solver=solver,
        )
        sampling_budget = sampling_budget + main_sampling_budget

    assert np.sum(sampling_budget) == total_budget_backup, (
        f"Budget mismatch: expected {total_budget_backup}, got {np.sum(sampling_budget)}"
    )
    return sampling_budget, {"fallback": fallback, "fallback_effective_ratio": fallback_effective_ratio}


def _dp_core(success_rates, n_items, total_budget, max_n, min_n, solver):
    """Upstream's `dp_core_numba` body (jit-compiled below when numba is importable)."""
    dp = np.full((n_items + 1, total_budget + 1), -np.inf)
    dp[0, 0] = 0.0
    choice = np.full((n_items + 1, total_budget + 1, 2), -1, dtype=np.int32)
    for i in range(1, n_items + 1):
        success_rate = success_rates[i - 1]
        for w in range(total_budget + 1):
            if dp[i - 1, w] > dp[i, w]:
                dp[i, w] = dp[i - 1, w]
                choice[i, w, 0] = 0
                choice[i, w, 1] = 0
            for k in range(1, min(max_n + 1, w + 1)):
                if dp[i - 1, w - k] == -np.inf:
                    continue
                if success_rate == 0 or success_rate == 1:
                    value_gain = 0
                else:
                    if solver == "dp":
                        value_gain = (
                            (1 - (success_rate ** (k + min_n)) - ((1 - success_rate) ** (k + min_n)))
                            * success_rate
                            * ((1 - success_rate) ** 2)
                        )
                    else:
                        raise ValueError("Unknown solver")
                new_value = dp[i - 1, w - k] + value_gain
                if new_value > dp[i, w]:
                    dp[i, w] = new_value
                    choice[i, w, 0] = i - 1
                    choice[i, w, 1] = k
    return dp, choice


dp_core_numba = njit(_dp_core) if NUMBA_AVAILABLE else None


def solve_by_dp(
    success_rates: np.ndarray,
    effective_indices: list[int],
    min_n: int,
    max_n: int,
    total_budget: int,
    solver: str = "dp",
    force_python: bool = False,
) -> np.ndarray:
    """Upstream's `solve_by_dp`; max_n here is the number of rollouts a prompt may take beyond min_n.

    force_python=True runs the pure-Python path whatever the size (upstream picks it for small problems)."""
    batch_size = len(success_rates)
    sampling_budget = np.zeros(batch_size, dtype=np.int32)
    if total_budget <= 0:
        return sampling_budget
    if len(effective_indices) == 0:
        base_allocation = total_budget // batch_size
        remainder = total_budget % batch_size
        for i in range(batch_size):
            sampling_budget[i] += base_allocation
        for i in range(remainder):
            sampling_budget[i] += 1
        return sampling_budget

    n_items = len(effective_indices)
    use_numba = NUMBA_AVAILABLE and not force_python and (n_items * total_budget * max_n > 50000)
    if use_numba:
        effective_success_rates = np.array([success_rates[i] for i in effective_indices])
        dp, choice = dp_core_numba(effective_success_rates, n_items, total_budget, max_n, min_n, solver)
        if dp[n_items, total_budget] == -np.inf:
            max_usable_budget = total_budget
            while max_usable_budget > 0 and dp[n_items, max_usable_budget] == -np.inf:
                max_usable_budget -= 1
            if max_usable_budget > 0:
                w = max_usable_budget
                for i in range(n_items, 0, -1):
                    item_idx, allocation = choice[i, w, 0], choice[i, w, 1]
                    if allocation > 0:
                        sampling_budget[effective_indices[item_idx]] += allocation
                        w -= allocation
                remaining_budget = total_budget - max_usable_budget
            else:
                remaining_budget = total_budget
        else:
            w = total_budget
            for i in range(n_items, 0, -1):
                item_idx, allocation = choice[i, w, 0], choice[i, w, 1]
                if allocation > 0:
                    sampling_budget[effective_indices[item_idx]] += allocation
                    w -= allocation
            remaining_budget = 0
    else:
        dp = np.full((n_items + 1, total_budget + 1), -np.inf)
        dp[0][0] = 0.0
        choice = np.full((n_items + 1, total_budget + 1, 2), -1, dtype=int)
        for i in range(1, n_items + 1):
            success_rate = success_rates[effective_indices[i - 1]]
            for w in range(total_budget + 1):
                if dp[i - 1][w] > dp[i][w]:
                    dp[i][w] = dp[i - 1][w]
                    choice[i][w] = [0, 0]
                for k in range(1, min(max_n + 1, w + 1)):
                    if dp[i - 1][w - k] == -np.inf:
                        continue
                    if success_rate == 0 or success_rate == 1:
                        value_gain = 0
                    else:
                        if solver == "dp":
                            value_gain = (
                                (1 - (success_rate ** (k + min_n)) - ((1 - success_rate) ** (k + min_n)))
                                * success_rate
                                * ((1 - success_rate) ** 2)
                            )
                        else:
                            raise ValueError(f"Unknown solver: {solver}")
                    new_value = dp[i - 1][w - k] + value_gain
                    if new_value > dp[i][w]:
                        dp[i][w] = new_value
                        choice[i][w] = [i - 1, k]
        max_usable_budget = total_budget
        while max_usable_budget > 0 and dp[n_items][max_usable_budget] == -np.inf:
            max_usable_budget -= 1
        if max_usable_budget > 0:
            w = max_usable_budget
            for i in range(n_items, 0, -1):
                item_idx, allocation = choice[i][w]
                if allocation > 0:
                    sampling_budget[effective_indices[item_idx]] += allocation
                    w -= allocation
            remaining_budget = total_budget - max_usable_budget
        else:
            remaining_budget = total_budget

    # upstream: whatever the DP could not place is spread over the effective prompts, past max_n
    if remaining_budget > 0 and effective_indices:
        base_allocation = remaining_budget // len(effective_indices)
        remainder = remaining_budget % len(effective_indices)
        for idx in effective_indices:
            sampling_budget[idx] += base_allocation
        for i in range(remainder):
            sampling_budget[effective_indices[i]] += 1
    return sampling_budget
