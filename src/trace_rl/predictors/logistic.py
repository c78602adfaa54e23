"""Online logistic regression over feature vectors: a light, CPU-cheap V~.

Trained on soft targets in [0, 1] (`training_examples`: the mean reward of the rollouts started at a node)
with cross-entropy, a replay window of recent steps and a few Adam epochs per step. The featuriser
decides what the model sees; the model is the same for every env.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

import numpy as np

from .base import Prefix


class OnlineLogisticPredictor:
    def __init__(
        self,
        featurize: Callable[[Sequence[Prefix]], np.ndarray],
        dim: int,
        lr: float = 0.05,
        epochs: int = 4,
        replay_steps: int = 8,
        l2: float = 1e-4,
        seed: int = 0,
    ):
        self.featurize = featurize
        self.w = np.zeros(dim)
        self.lr, self.epochs, self.l2 = lr, epochs, l2
        self.replay: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=replay_steps)
        self._m = np.zeros(dim)
        self._v = np.zeros(dim)
        self._t = 0
        self.rng = np.random.default_rng(seed)

    def _prob(self, x: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-np.clip(x @ self.w, -30, 30)))

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        if not len(prefixes):
            return np.zeros(0)
        return self._prob(self.featurize(prefixes))

    def update(self, prefixes: Sequence[Prefix], targets: np.ndarray) -> float:
        if not len(prefixes):
            return 0.0
        x = self.featurize(prefixes)
        self.replay.append((x, np.asarray(targets, dtype=float)))
        X = np.concatenate([r[0] for r in self.replay])
        Y = np.concatenate([r[1] for r in self.replay])
        for _ in range(self.epochs):
            for idx in np.array_split(self.rng.permutation(len(Y)), max(1, len(Y) // 64)):
                p = self._prob(X[idx])
                g = X[idx].T @ (p - Y[idx]) / len(idx) + self.l2 * self.w
                self._adam(g)
        p = self._prob(x)
        eps = 1e-9
        return float(np.mean(-(targets * np.log(p + eps) + (1 - targets) * np.log(1 - p + eps))))

    def save(self, path) -> None:
        """Weights and optimiser state (the replay window is not saved: it refills in a few steps)."""
        np.savez(path, w=self.w, m=self._m, v=self._v, t=self._t)

    def load(self, path) -> None:
        data = np.load(path if str(path).endswith(".npz") else f"{path}.npz")
        if data["w"].shape != self.w.shape:
            raise ValueError(f"{path}: predictor has {data['w'].shape[0]} weights, this one needs {self.w.shape[0]}")
        self.w, self._m, self._v, self._t = data["w"], data["m"], data["v"], int(data["t"])

    def _adam(self, g: np.ndarray, b1: float = 0.9, b2: float = 0.999) -> None:
        self._t += 1
        self._m = b1 * self._m + (1 - b1) * g
        self._v = b2 * self._v + (1 - b2) * g * g
        mhat = self._m / (1 - b1**self._t)
        vhat = self._v / (1 - b2**self._t)
        self.w -= self.lr * mhat / (np.sqrt(vhat) + 1e-8)
