"""The maximum-a-posteriori fit of a binomial logistic model under a Gaussian prior, with weighted rows, and the
online layer around it that ages its rows by a half-life: what both calibration layers share (`experimental.flip`
for stage 2's flip, `experimental.root_calibration` for V~ at the roots). numpy only.

    minimise  sum_j w_j (k_j log(1 + e^eta_j) - f_j eta_j) + 1/2 sum_i prec_i (theta_i - mean_i)^2,
    eta = offset + X theta

k_j trials with f_j successes (f_j may be fractional: a mean reward times its trials), w_j >= 0 a row's weight
(its age's discount). Strictly convex for prec > 0, so Newton's method with a backtracking (Armijo) line search
reaches the unique minimum; it starts from the prior mean, so the same rows always give the same numbers.
"""

from __future__ import annotations

import numpy as np

Z_CLIP = 6.0  # |logit p| is clipped here (p in [0.0025, 0.9975]): a probability of exactly 0 or 1 stays finite
MAX_NEWTON = 50
MAX_HALF_LIVES = 10.0  # rows older than this many half-lives weigh below 2^-10 and are dropped


def logit(p) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1 - 1e-12)
    return np.clip(np.log(p) - np.log1p(-p), -Z_CLIP, Z_CLIP)


def expit(x) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))  # no overflow warning for large |x|


def positive(name: str, x) -> float:
    """`x` as a float when it is a positive finite number, else one line naming `name`."""
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) or not np.isfinite(x) or x <= 0:
        raise ValueError(f"{name} must be a positive number, got {x!r}")
    return float(x)


def binomial_counts(trials, hits, shape: tuple, names: tuple[str, str], of: str) -> tuple[np.ndarray, np.ndarray]:
    """(trials, hits) as float arrays of `shape`, whole numbers with 0 <= hits <= trials and trials >= 1; else one
    line naming them (`names`) and what they belong to (`of`)."""
    k = np.asarray(trials, dtype=np.float64)
    f = np.asarray(hits, dtype=np.float64)
    if not k.shape == f.shape == shape:
        raise ValueError(f"{names[0]} and {names[1]} must match {of}, got {k.shape}, {f.shape}, {shape}")
    whole = np.all(k == np.round(k)) and np.all(f == np.round(f))
    if k.size and (not whole or k.min() < 1 or f.min() < 0 or np.any(f > k)):
        raise ValueError(f"{names[0]} must be integers >= 1 and {names[1]} integers in 0..{names[0]}")
    return k, f


def fit_map_logistic(
    x: np.ndarray,
    offset: np.ndarray,
    k: np.ndarray,
    f: np.ndarray,
    w: np.ndarray,
    precision: np.ndarray,
    mean: np.ndarray,
) -> np.ndarray:
    """theta minimising the objective above. Shapes: x (rows, params), offset, k, f, w (rows,), precision and
    mean (params,)."""
    theta = mean.copy()
    if not len(k):
        return theta

    def objective(t: np.ndarray) -> float:
        eta = offset + x @ t
        return float(np.sum(w * (k * np.logaddexp(0.0, eta) - f * eta)) + 0.5 * np.sum(precision * (t - mean) ** 2))

    value = objective(theta)
    for _ in range(MAX_NEWTON):
        p = expit(offset + x @ theta)
        grad = x.T @ (w * (k * p - f)) + precision * (theta - mean)
        hess = (x * (w * k * p * (1.0 - p))[:, None]).T @ x + np.diag(precision)
        step = -np.linalg.solve(hess, grad)
        t = 1.0
        while True:  # backtracking: Newton's full step can overshoot where p is near 0 or 1
            new = objective(theta + t * step)
            if new <= value + 1e-4 * t * float(grad @ step) or t < 1e-8:
                break
            t *= 0.5
        theta, done = theta + t * step, value - new < 1e-12
        value = new
        if done:
            break
    return theta


class AgedLogisticLayer:
    """A layer refitted once a step on rows that age: each row's last column is its age in steps, and it weighs
    0.5^(age / half_life) in the MAP fit; rows older than MAX_HALF_LIVES half-lives are dropped, which bounds
    memory. A subclass sets `half_life`, `prior_mean`, `theta`, `name` and `_rows` (an empty array of its row
    width), and says how its rows enter the model (`_data`: design, offset, trials, hits), its prior's precision
    (`_precision`) and its settings (`_settings`, which a checkpoint's state must match)."""

    name = "layer"
    half_life: float
    prior_mean: np.ndarray
    theta: np.ndarray
    _rows: np.ndarray
    steps_seen: int = 0

    def _data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _precision(self) -> np.ndarray:
        raise NotImplementedError

    def _settings(self) -> dict:
        raise NotImplementedError

    def _fit(self) -> np.ndarray:
        """MAP theta on the rows (always from the prior mean, so a restored state refits to the same numbers)."""
        if not len(self._rows):
            return self.prior_mean.copy()
        x, offset, k, f = self._data()
        w = 0.5 ** (self._rows[:, -1] / self.half_life)
        return fit_map_logistic(x, offset, k, f, w, self._precision(), self.prior_mean)

    def _add_step(self, new_rows: np.ndarray) -> None:
        """Age the rows seen so far by one step, drop the oldest, add this step's (age 0), refit."""
        rows = self._rows.copy()
        rows[:, -1] += 1.0
        rows = rows[rows[:, -1] <= MAX_HALF_LIVES * self.half_life]
        self._rows = np.concatenate([rows, new_rows])
        self.steps_seen += 1
        self.theta = self._fit()

    def state_dict(self) -> dict:
        """What a checkpoint needs (JSON-safe: floats written by json round-trip exactly)."""
        return {
            "settings": self._settings(),
            "steps_seen": self.steps_seen,
            "rows": self._rows.tolist(),
            "theta": self.theta.tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` wrote; a state of other settings is refused in one line."""
        if state.get("settings") != self._settings():
            raise ValueError(f"{self.name}: the saved settings {state.get('settings')} differ from this one's")
        self._rows = np.asarray(state["rows"], dtype=np.float64).reshape(-1, self._rows.shape[1])
        self.steps_seen = int(state["steps_seen"])
        self.theta = np.asarray(state["theta"], dtype=np.float64)
