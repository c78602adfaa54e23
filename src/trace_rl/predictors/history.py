"""Reward-history predictor (Knapsack RL, GRESO): a prompt's success rate is its running mean reward.

Scores a prefix by its prompt's value alone (history knows nothing of turns). Cold start: a prompt never
seen gets the mean of all prompts seen so far (0.5 before the first update).
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from ..tree import RolloutTree
from .base import Prefix


def prompt_key(tree: RolloutTree):
    """A prompt's identity: its question (LM tasks are dicts), else the prompt itself, else the root id."""
    prompt = tree.prompt
    if isinstance(prompt, dict):
        return prompt.get("id") or prompt.get("question") or json.dumps(prompt, sort_keys=True, default=str)
    return prompt if prompt is not None else tree.root_id


class RewardHistoryPredictor:
    def __init__(self, decay: float = 0.5):
        """decay: weight of the old estimate when a prompt is seen again (0 = last step only)."""
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.values: dict[object, float] = {}

    def _key(self, prefix: Prefix):
        return prompt_key(prefix[0])

    def prior(self) -> float:
        return float(np.mean(list(self.values.values()))) if self.values else 0.5

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        prior = self.prior()
        return np.array([self.values.get(self._key(p), prior) for p in prefixes], dtype=np.float64)

    def update(self, prefixes: Sequence[Prefix], targets: np.ndarray) -> float:
        loss = float(np.mean((self.predict(prefixes) - targets) ** 2)) if len(prefixes) else 0.0
        for (tree, nid), y in zip(prefixes, targets):
            if nid != tree.root_id:
                continue
            key = self._key((tree, nid))
            old = self.values.get(key)
            self.values[key] = float(y) if old is None else self.decay * old + (1 - self.decay) * float(y)
        return loss

    def save(self, path) -> None:
        with open(path, "w") as fh:
            json.dump({"decay": self.decay, "values": [[k, v] for k, v in self.values.items()]}, fh)

    def load(self, path) -> None:
        with open(path) as fh:
            data = json.load(fh)
        self.decay = data["decay"]
        self.values = {(tuple(k) if isinstance(k, list) else k): v for k, v in data["values"]}
