"""A learnable testbed policy: softmax logits per (task kind, turn), trained by policy gradient on tree rows.

Tabular on purpose: the gradient of a row is exact and cheap, so differences between methods come from the
samples and advantages they produce, not from optimiser noise.
"""

from __future__ import annotations

import numpy as np

from .env import TestbedConfig, TestbedTask, value_table


class SoftmaxPolicy:
    def __init__(self, config: TestbedConfig, warm_start: float = 1.5):
        """warm_start: logit bonus on the right action at every state, standing in for an SFT'd policy."""
        self.config = config
        self.right = config.right_actions()
        self.theta = np.zeros((config.num_kinds, config.max_turns, config.num_actions))
        k, t = np.meshgrid(np.arange(config.num_kinds), np.arange(config.max_turns), indexing="ij")
        self.theta[k, t, self.right] = warm_start

    def probs(self, kind: int, turn: int) -> np.ndarray:
        z = self.theta[kind, turn]
        e = np.exp(z - z.max())
        return e / e.sum()

    def act(self, task: TestbedTask, turn: int, rng: np.random.Generator) -> tuple[int, float]:
        p = self.probs(task.kind, turn)
        a = int(rng.choice(p.size, p=p))
        return a, float(np.log(p[a]))

    def turn_success(self, task: TestbedTask) -> np.ndarray:
        """Per-turn chance that the turn succeeds under this policy."""
        z = self.theta[task.kind, : task.horizon]
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        return p[np.arange(task.horizon), self.right[task.kind, : task.horizon]] * (1.0 - task.slip)

    def value(self, task: TestbedTask, turn: int = 0, mistakes: int = 0) -> float:
        """Exact V(H) of the prefix (turn, mistakes) of `task`."""
        if mistakes > task.tolerance:
            return 0.0
        return float(value_table(task, self.turn_success(task))[turn, mistakes])

    def accuracy(self, tasks: list[TestbedTask]) -> float:
        """Exact expected success rate over `tasks` (no sampling noise)."""
        return float(np.mean([self.value(t) for t in tasks]))

    def update(
        self, kinds: np.ndarray, turns: np.ndarray, actions: np.ndarray, advantages: np.ndarray, lr: float, scale: float
    ) -> None:
        """theta += lr * sum_rows A * grad log pi(a | kind, turn) / scale."""
        if len(kinds) == 0:
            return
        z = self.theta[kinds, turns]
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        grad = -p * advantages[:, None]
        grad[np.arange(len(actions)), actions] += advantages
        np.add.at(self.theta, (kinds, turns), lr * grad / scale)
