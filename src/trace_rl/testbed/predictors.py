"""Testbed predictors: the exact oracle, the features that the learned (logistic) predictor reads, and VIP's
Gaussian process on those features.

A testbed prefix is (tree, node id); the tree's prompt is the task index and each node's info holds the turn
and mistakes so far, which is all the history the testbed's V depends on.

VIP's GP needs a prompt embedding and testbed prompts have no text. In place of all-MiniLM-L6-v2 it reads
the learned predictor's features of the root (kind and the turns ahead, horizon, tolerance, the difficulty
hint), scaled to unit length as MiniLM's embeddings are, so distances lie in [0, 2] as upstream's do and its
length scale (0.27) applies unchanged. On the default family (medians over 400 tasks): tasks of one kind,
horizon and tolerance lie 0.07 apart when their hints differ by 0.05 to 0.15 (kernel 0.97), 0.38 apart at 0.3
to 0.5 (0.38) and 0.85 apart between easy and hard (0.007); a different horizon puts them 0.77 apart (0.02),
a different kind 1.0 (0.001). Easy tasks of one cell (hints within 0.02) lie 0.005 apart: near-duplicates, as
paraphrased prompts are for MiniLM, and upstream's 1e-4 jitter is all that keeps K_tt invertible then.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..predictors import OnlineLogisticPredictor, Prefix, RewardHistoryPredictor
from ..predictors.embedders import unit_rows
from ..predictors.gp import GaussianProcessPredictor
from ..tree import RolloutTree
from .env import TestbedConfig, TestbedTask
from .policy import SoftmaxPolicy


def prefix_state(tasks: dict[int, TestbedTask], prefix: Prefix) -> tuple[TestbedTask, int, int]:
    tree, nid = prefix
    info = tree[nid].info
    return tasks[tree.prompt], int(info.get("turn", 0)), int(info.get("mistakes", 0))


class OraclePredictor:
    """Exact V(H) under the current policy: the best any predictor can do."""

    def __init__(self, tasks: dict[int, TestbedTask], policy: SoftmaxPolicy):
        self.tasks, self.policy = tasks, policy

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        return np.array([self.policy.value(*prefix_state(self.tasks, p)) for p in prefixes], dtype=np.float64)

    def update(self, prefixes, targets) -> float:
        return float(np.mean((self.predict(prefixes) - targets) ** 2)) if len(prefixes) else 0.0

    def save(self, path) -> None:  # nothing to save: the oracle is the policy itself
        pass

    def load(self, path) -> None:
        pass


class TestbedFeatures:
    """Features of a prefix: prompt fields the agent can see, plus which (kind, turn) steps are still ahead.

    logit V ~ sum over remaining turns of a per-(kind, turn) weight is the log of a product of per-turn
    success chances, which is what V is when no mistakes are allowed; tolerance and hint refine it.
    """

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, config: TestbedConfig, tasks: dict[int, TestbedTask]):
        self.config, self.tasks = config, tasks
        self.k, self.T = config.num_kinds, config.max_turns
        self.tol = config.max_tolerance + 2
        self.dim = 4 + self.k * self.T + self.tol + self.T + 1

    def __call__(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        x = np.zeros((len(prefixes), self.dim))
        for row, prefix in enumerate(prefixes):
            task, turn, mistakes = prefix_state(self.tasks, prefix)
            remaining = task.horizon - turn
            x[row, :4] = (1.0, task.hint, task.hint**2, task.hint * remaining)
            o = 4
            x[row, o + task.kind * self.T + turn : o + task.kind * self.T + task.horizon] = 1.0
            o += self.k * self.T
            x[row, o + min(max(task.tolerance - mistakes + 1, 0), self.tol - 1)] = 1.0  # slot 0: already doomed
            o += self.tol
            x[row, o + min(remaining, self.T)] = 1.0
        return x


def learned_predictor(
    config: TestbedConfig, tasks: dict[int, TestbedTask], lr: float = 0.05, seed: int = 0
) -> OnlineLogisticPredictor:
    features = TestbedFeatures(config, tasks)
    return OnlineLogisticPredictor(features, features.dim, lr=lr, seed=seed)


class RootFeatureEmbedder:
    """A testbed prompt's stand-in for a sentence embedding: the learned predictor's root features, unit length."""

    def __init__(self, config: TestbedConfig, tasks: dict[int, TestbedTask]):
        self.features = TestbedFeatures(config, tasks)

    def __call__(self, trees: Sequence[RolloutTree]) -> np.ndarray:
        return unit_rows(self.features([(t, t.root_id) for t in trees]))


def vip_predictor(config: TestbedConfig, tasks: dict[int, TestbedTask]) -> GaussianProcessPredictor:
    """VIP's Gaussian process (upstream's kernel, length scale and prior) over `RootFeatureEmbedder`."""
    return GaussianProcessPredictor(RootFeatureEmbedder(config, tasks))


# ---- what registry.PREDICTORS names as each entry's testbed builder: (env, tasks, policy, settings, seed) -> V~


def oracle_predictor(config: TestbedConfig, tasks: dict, policy: SoftmaxPolicy, settings, seed: int):
    return OraclePredictor(tasks, policy)


def history_predictor(config: TestbedConfig, tasks: dict, policy: SoftmaxPolicy, settings, seed: int):
    return RewardHistoryPredictor()


def gp_predictor(config: TestbedConfig, tasks: dict, policy: SoftmaxPolicy, settings, seed: int):
    return vip_predictor(config, tasks)
