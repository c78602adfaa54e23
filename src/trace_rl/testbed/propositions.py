"""Numerical checks of the paper's two propositions on the testbed, exactly and by Monte Carlo.

Proposition 1: the best MSE of predicting the terminal reward R from the prefix H_t, E[(R - V(H_t))^2] =
E[V(H_t)(1 - V(H_t))], does not grow with the depth t (V is a martingale, so its variance only resolves).
Proposition 2: the expected quadratic variation of V along the suffix from H_t, E[sum_{s>=t}
(V_{s+1} - V_s)^2 | H_t] with V_T = R, equals V(H_t)(1 - V(H_t)).

Exact values come from forward recursions over the testbed's (turn, mistakes) states; Monte Carlo values from
sampled episodes, so the check also exercises the environment, not just the algebra.
"""

from __future__ import annotations

import numpy as np

from .env import TestbedConfig, TestbedEnv, TestbedTask, make_tasks
from .policy import SoftmaxPolicy


def _values(policy: SoftmaxPolicy, task: TestbedTask) -> np.ndarray:
    """V[t, e] for every reachable state, e up to the horizon (V = 0 past the tolerance)."""
    p = policy.turn_success(task)
    T = task.horizon
    V = np.zeros((T + 1, T + 2))
    V[T, : task.tolerance + 1] = 1.0
    for t in range(T - 1, -1, -1):
        V[t, : T + 1] = p[t] * V[t + 1, : T + 1] + (1 - p[t]) * V[t + 1, 1 : T + 2]
    return V


def depth_mse(policy: SoftmaxPolicy, task: TestbedTask) -> np.ndarray:
    """Exact E[(R - V(H_t))^2] for t = 0..T."""
    p, T, V = policy.turn_success(task), task.horizon, _values(policy, task)
    dist = np.zeros(T + 2)
    dist[0] = 1.0
    out = []
    for t in range(T + 1):
        out.append(float(np.sum(dist * V[t] * (1 - V[t]))))
        if t < T:
            dist = np.concatenate(([dist[0] * p[t]], dist[1:] * p[t] + dist[:-1] * (1 - p[t])))
    return np.array(out)


def quadratic_variation(policy: SoftmaxPolicy, task: TestbedTask) -> tuple[np.ndarray, np.ndarray]:
    """(exact E[QV of the suffix | state], V(1-V)) for every state (t, e); they must be equal."""
    p, T, V = policy.turn_success(task), task.horizon, _values(policy, task)
    QV = np.zeros_like(V)
    for t in range(T - 1, -1, -1):
        up = (V[t + 1, : T + 1] - V[t, : T + 1]) ** 2 + QV[t + 1, : T + 1]
        down = (V[t + 1, 1 : T + 2] - V[t, : T + 1]) ** 2 + QV[t + 1, 1 : T + 2]
        QV[t, : T + 1] = p[t] * up + (1 - p[t]) * down
    return QV, V * (1 - V)


def monte_carlo(policy: SoftmaxPolicy, task: TestbedTask, episodes: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sampled E[(R - V_t)^2] per depth, and the QV of each sampled episode from the root."""
    V = _values(policy, task)
    sq = np.zeros(task.horizon + 1)
    qv = np.zeros(episodes)
    for i in range(episodes):
        env = TestbedEnv(policy.config, rng, policy.right)
        env.reset(task)
        path = [V[0, 0]]
        done, reward = False, 0.0
        while not done:
            action, _ = policy.act(task, env.turn, rng)
            _, reward, done, info = env.step(action)
            path.append(V[info["turn"], min(info["mistakes"], task.horizon + 1)])
        path[-1] = reward
        sq += (reward - np.array(path)) ** 2
        qv[i] = float(np.sum(np.diff(path) ** 2))
    return sq / episodes, qv


def check_propositions(config: TestbedConfig | None = None, tasks: int = 64, episodes: int = 4000, seed: int = 0, warm_start: float = 1.0) -> dict:
    """Both propositions over `tasks` testbed tasks: exact maxima of the violations plus a Monte Carlo sample."""
    config = config or TestbedConfig()
    policy = SoftmaxPolicy(config, warm_start)
    pool = make_tasks(config, tasks, seed=seed)
    rng = np.random.default_rng(seed)
    worst_rise, worst_qv = 0.0, 0.0
    curves = {}
    for task in pool:
        mse = depth_mse(policy, task)
        worst_rise = max(worst_rise, float(np.max(np.diff(mse), initial=0.0)))
        qv, target = quadratic_variation(policy, task)
        worst_qv = max(worst_qv, float(np.max(np.abs(qv - target))))
        curves.setdefault(task.horizon, []).append(mse)
    longest = max(curves)
    task = max(pool, key=lambda t: (t.horizon, t.tolerance, -abs(policy.value(t) - 0.5)))
    mc_mse, mc_qv = monte_carlo(policy, task, episodes, rng)
    v0 = policy.value(task)
    return {
        "tasks": tasks,
        "prop1_max_rise_exact": worst_rise,
        "prop1_mean_curve_exact": np.mean(curves[longest], axis=0).round(4).tolist(),
        "prop1_curve_mc": mc_mse.round(4).tolist(),
        "prop1_curve_exact_same_task": depth_mse(policy, task).round(4).tolist(),
        "prop2_max_abs_gap_exact": worst_qv,
        "prop2_mc_qv": float(mc_qv.mean()),
        "prop2_mc_stderr": float(mc_qv.std() / np.sqrt(episodes)),
        "prop2_v0_1_minus_v0": v0 * (1 - v0),
        "horizon_of_curve": longest,
        "episodes": episodes,
    }
