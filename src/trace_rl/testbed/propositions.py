"""Numerical checks of the paper's two propositions on the testbed, exactly and by Monte Carlo.

Proposition 1: the best MSE of predicting the terminal reward R from the prefix H_t, E[(R - V(H_t))^2] =
E[V(H_t)(1 - V(H_t))], does not grow with the depth t (V is a martingale, so its variance only resolves).
Proposition 2: the expected quadratic variation of V along the suffix from H_t, E[sum_{s>=t}
(V_{s+1} - V_s)^2 | H_t] with V_T = R, equals V(H_t)(1 - V(H_t)).

Exact values come from forward recursions over the testbed's (turn, mistakes) states; Monte Carlo values from
sampled episodes, so the check also exercises the environment, not just the algebra.

`verdicts` turns a `check_propositions` result into pass/fail lines, with these thresholds:
- Proposition 1, exact: the largest rise of E[(R - V_t)^2] from one depth to the next <= 1e-12 (float noise).
- Proposition 1, Monte Carlo: at every depth, |sampled - exact| <= 4 standard errors of the sampled mean (4, not
  3, because up to ~10 depths are tested at once: a false alarm stays near 0.1% per depth, ~1% per run).
  A depth whose samples do not vary (the last, where V_T = R) must match exactly (within 1e-12).
- Proposition 2, exact: the largest |E[QV] - V(1-V)| over all states <= 1e-9.
- Proposition 2, Monte Carlo: |mean QV from the root - V0(1-V0)| <= 3 standard errors.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def monte_carlo(
    policy: SoftmaxPolicy, task: TestbedTask, episodes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Sampled E[(R - V_t)^2] per depth, its standard error, and the QV of each sampled episode from the root."""
    V = _values(policy, task)
    sq = np.zeros(task.horizon + 1)
    sq2 = np.zeros(task.horizon + 1)
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
        err = (reward - np.array(path)) ** 2
        sq += err
        sq2 += err**2
        qv[i] = float(np.sum(np.diff(path) ** 2))
    mean = sq / episodes
    stderr = np.sqrt(np.maximum(sq2 / episodes - mean**2, 0.0) / episodes)
    return mean, stderr, qv


def check_propositions(
    config: TestbedConfig | None = None, tasks: int = 64, episodes: int = 4000, seed: int = 0, warm_start: float = 1.0
) -> dict:
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
    mc_mse, mc_se, mc_qv = monte_carlo(policy, task, episodes, rng)
    exact_mse = depth_mse(policy, task)
    v0 = policy.value(task)
    return {
        "tasks": tasks,
        "prop1_max_rise_exact": worst_rise,
        "prop1_mean_curve_exact": np.mean(curves[longest], axis=0).round(4).tolist(),
        "prop1_curve_mc": mc_mse.round(4).tolist(),
        "prop1_curve_exact_same_task": exact_mse.round(4).tolist(),
        "prop1_mc_max_z": _max_z(mc_mse - exact_mse, mc_se),
        "prop2_max_abs_gap_exact": worst_qv,
        "prop2_mc_qv": float(mc_qv.mean()),
        "prop2_mc_stderr": float(mc_qv.std() / np.sqrt(episodes)),
        "prop2_v0_1_minus_v0": v0 * (1 - v0),
        "horizon_of_curve": longest,
        "episodes": episodes,
    }


def _max_z(gap: np.ndarray, stderr: np.ndarray) -> float:
    """Largest |gap| in standard errors; a zero standard error allows float noise only (inf beyond it)."""
    z = np.where(stderr > 0, np.abs(gap) / np.where(stderr > 0, stderr, 1.0), 0.0)
    z = np.where((stderr == 0) & (np.abs(gap) > 1e-12), np.inf, z)
    return float(z.max(initial=0.0))


PROP1_MAX_RISE = 1e-12
PROP1_MC_Z = 4.0
PROP2_MAX_GAP = 1e-9
PROP2_MC_Z = 3.0


@dataclass(frozen=True)
class Verdict:
    """One check: what was measured, against which threshold, and whether it passed."""

    name: str
    value: float
    threshold: float
    passed: bool

    def line(self) -> str:
        return f"  {'PASS' if self.passed else 'FAIL'}  {self.name}: {self.value:.3g} <= {self.threshold:g}"


def verdicts(r: dict) -> list[Verdict]:
    """Pass/fail per check of a `check_propositions` result, by the thresholds in the module docstring."""
    qv_z = abs(r["prop2_mc_qv"] - r["prop2_v0_1_minus_v0"]) / max(r["prop2_mc_stderr"], 1e-300)
    checks = [
        ("Proposition 1, exact: largest rise of the best MSE with depth", r["prop1_max_rise_exact"], PROP1_MAX_RISE),
        (
            "Proposition 1, Monte Carlo: largest |sampled - exact| MSE, in standard errors",
            r["prop1_mc_max_z"],
            PROP1_MC_Z,
        ),
        ("Proposition 2, exact: largest |E[QV] - V(1-V)|", r["prop2_max_abs_gap_exact"], PROP2_MAX_GAP),
        ("Proposition 2, Monte Carlo: |E[QV] - V0(1-V0)| at the root, in standard errors", qv_z, PROP2_MC_Z),
    ]
    return [Verdict(name, float(value), limit, bool(value <= limit)) for name, value, limit in checks]


def report_lines(r: dict) -> list[str]:
    """What `trace-rl propositions` prints: the measured values, then one PASS/FAIL line per check and a total."""
    out = [
        f"Proposition 1 (best MSE does not grow with depth), {r['tasks']} tasks:",
        f"  largest rise of E[(R - V_t)^2] from one depth to the next (exact): {r['prop1_max_rise_exact']:.2e}",
        f"  mean curve over horizon-{r['horizon_of_curve']} tasks, t = 0..T (exact): {r['prop1_mean_curve_exact']}",
        f"  one task, exact:        {r['prop1_curve_exact_same_task']}",
        f"  same task, Monte Carlo: {r['prop1_curve_mc']}  ({r['episodes']} episodes)",
        "Proposition 2 (expected quadratic variation of V along a suffix = V(1-V)):",
        f"  largest |E[QV] - V(1-V)| over all states (exact): {r['prop2_max_abs_gap_exact']:.2e}",
        (
            f"  Monte Carlo from the root: E[QV] = {r['prop2_mc_qv']:.4f} +- {r['prop2_mc_stderr']:.4f}, "
            f"V(1-V) = {r['prop2_v0_1_minus_v0']:.4f}"
        ),
        "Verdicts:",
    ]
    checks = verdicts(r)
    out += [v.line() for v in checks]
    failed = sum(not v.passed for v in checks)
    out.append("all checks passed" if not failed else f"{failed} of {len(checks)} checks FAILED")
    return out
