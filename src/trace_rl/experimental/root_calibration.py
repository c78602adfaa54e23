"""V~ at the roots, recalibrated online on the bare rollouts the root stage spent: a two-parameter logistic layer.

Why. Stage 1 allocates on v_i, each candidate prompt's V~, maximising sum_i 1 - v_i^m_i - (1 - v_i)^m_i, the
expected count of prompts whose bare rollouts disagree. That objective is right only if v_i is the prompt's
success rate. V~ is fitted online on targets of trees the policy grew before its latest updates, so while the
policy improves V~ trails it: on the default LM task the roots' V~ said 0.59 where bare rollouts succeeded 0.65
of the time, and the bins the allocator reads most (V~ 0.3-0.7) were 9 to 11 points low
(lab/notes/2026-12-03-calibrated-stage2-eval.md, `trace-rl diagnose`). The root stage then spends on prompts
it takes for even odds that are in fact easier, and fewer of them come out mixed.

Model (Platt scaling, refitted every step). For a root with V~ = v at allocation:

    logit P(a bare rollout succeeds) = a + b logit(v)

theta = (a, b) under the prior N((0, 1), diag(sigma_a^2, sigma_b^2)): before any data it is V~ itself. Fitted by
maximum a posteriori (`map_logistic.fit_map_logistic`) on every active root's bare rollouts and successes
(reward above 0.5), each root weighted by 0.5^(age / half_life) in steps, so the layer follows the policy; rows
older than MAX_HALF_LIVES half-lives are dropped. The allocator reads the layer's probability instead of V~; V~
itself, its training and every record of it are unchanged (the layer is a function of V~ and a step's
outcomes, so a run's predictions.jsonl replays it exactly).

Honest about selection: the roots observed are those the allocator chose, and it chose on the layer's output, a
function of v alone, so given v being chosen says nothing more about the outcome and the fit is not biased by
it. What it cannot do: a monotone map of V~ keeps V~'s order, so it cannot tell apart prompts V~ scores alike;
it moves the whole scale (where "even odds" lies), which is what a lagging V~ gets wrong. numpy only.
"""

from __future__ import annotations

import numpy as np

from ..tree import RolloutTree
from .map_logistic import AgedLogisticLayer, binomial_counts, expit, logit, positive

# the setting `predictor.root_model` -> whether TRACE's root allocator reads V~ through this layer or as is (raw)
ROOT_MODELS = {"raw": False, "calibrated": True}
# chosen on the default LM task's tuning seeds 10-12 (tiny@0) by the replay's log loss per bare rollout over a grid
# of sigma_a 0.5-2, sigma_b 0.25-0.5, half-life 4-16 (`lab/scripts/replay_root_layer.py`;
# lab/notes/2026-12-03-flip-layer-own-selection.md): the grid's losses lie within 0.004 of each other
SIGMA_A, SIGMA_B, HALF_LIFE = 0.5, 0.25, 16.0


class RootCalibrator(AgedLogisticLayer):
    """P(a bare rollout of a prompt succeeds | its V~), online (see the module docstring)."""

    name = "root model"

    def __init__(self, sigma_a: float = SIGMA_A, sigma_b: float = SIGMA_B, half_life: float = HALF_LIFE):
        self.sigma_a = positive("sigma_a", sigma_a)
        self.sigma_b = positive("sigma_b", sigma_b)
        self.half_life = positive("half_life", half_life)
        self.prior_mean = np.array([0.0, 1.0])  # the identity: V~ as is
        self.theta = self.prior_mean.copy()
        self.steps_seen = 0
        self._rows = np.zeros((0, 4))  # one row per observed root: logit V~, bare rollouts, successes, age in steps

    @staticmethod
    def _check_v(v) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64)
        if v.ndim != 1 or (v.size and (not np.all(np.isfinite(v)) or v.min() < 0 or v.max() > 1)):
            raise ValueError("v must be a 1-D array of probabilities in [0, 1]")
        return v

    def predict(self, v) -> np.ndarray:
        """The recalibrated success probability of each root whose V~ is v."""
        z = logit(self._check_v(v))
        return expit(self.theta[0] + self.theta[1] * z)

    def observe(self, v, rollouts, successes) -> None:
        """One step's active roots (V~ at allocation, bare rollouts, how many succeeded): age the rows seen so far by
        one step, add these, refit."""
        z = logit(self._check_v(v))
        n, s = binomial_counts(rollouts, successes, z.shape, ("rollouts", "successes"), "v")
        self._add_step(np.stack([z, n, s, np.zeros_like(z)], axis=1))

    def _data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        z, n, s, _ = self._rows.T
        return np.stack([np.ones_like(z), z], axis=1), np.zeros_like(z), n, s

    def _precision(self) -> np.ndarray:
        return np.array([self.sigma_a**-2.0, self.sigma_b**-2.0])

    def _settings(self) -> dict:
        return {"sigma_a": self.sigma_a, "sigma_b": self.sigma_b, "half_life": self.half_life}


def root_observations(trees: list[RolloutTree]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(V~, bare rollouts, successes) of every root that was scored and spent bare rollouts: what
    `RootCalibrator.observe` takes."""
    rows = []
    for tree in trees:
        bare = tree.started_rewards(tree.root_id)
        if bare and tree.root.predicted is not None:
            rows.append((tree.root.predicted, len(bare), sum(x > 0.5 for x in bare)))
    if not rows:
        return np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    v, n, s = zip(*rows)
    return np.array(v, dtype=np.float64), np.array(n, dtype=np.int64), np.array(s, dtype=np.int64)


def make_root_model(kind: str) -> RootCalibrator | None:
    """The root model of the setting `predictor.root_model`: None for raw (V~ as is), else the layer."""
    if kind not in ROOT_MODELS:
        raise ValueError(f"root_model must be one of {', '.join(ROOT_MODELS)}, got {kind!r}")
    return RootCalibrator() if ROOT_MODELS[kind] else None
