"""Stage 2's flip probability, calibrated on the flips it realised: an online Bayesian logistic layer over q.

Why. Stage 2 allocates on q = r(1 - V~) + (1 - r)V~, the chance that one continuation from a prefix ends unlike
its rollout's outcome r. A V~ that is calibrated but cannot tell apart the states its features map together
over-predicts that chance by 2 Var(V | features) on average (`predictors.calibration`): given r, the prefix's
true value leans towards r, and an r-blind V~ cannot know by how much. Recalibrating V~ leaves that term; on
the LM task it closed 0.04 of a 0.20 gap (lab/notes/2026-12-02-calibration-lm.md). This layer predicts the
flip itself, conditioned on r and the prefix depth, and is fitted on what every step already grows: the
continuations stage 2 spent and whether each ended unlike its rollout.

Model. For an anchor with bare outcome r (a success above 0.5), V~ at allocation v and depth d (bins 1, 2, 3,
4+ by default), with q = `allocation.prefix_flip_prob`(r, v):

    logit P(flip) = logit(q k / (k + 1)) + a[r, d] + b[r] logit(q)

theta = (a, b), 2 x depth bins + 2 numbers, under a Gaussian prior N(0, diag(sigma_cell^2, sigma_slope^2)),
fitted by maximum a posteriori on the binomial likelihood of each chosen anchor's flips out of its
continuations (Newton with a backtracking line search: the objective is strictly convex), each anchor weighted
by 0.5^(age / half_life), its age in steps, so the fit follows the policy as training moves it. `observe` is
called once per step; rows older than MAX_HALF_LIVES half-lives are dropped, which bounds memory.

The prior mean (theta = 0) is q k/(k + 1), and that is exactly the flip probability if V given the features
is Beta(k v, k (1 - v)), mean v and variance v(1 - v)/(k + 1): after a success P(flip) = 1 - E[V | success]
= 1 - (Var + v^2)/v = (1 - v) k/(k + 1); after a failure E[V | failure] = v - Var/(1 - v) = v k/(k + 1).
k -> infinity is a V~ that sees the state (q itself), k -> 0 a state that is already decided (no flip);
k = 1 (the default) says the features leave half of the variance a Bernoulli outcome can have unexplained.
It is a statement about resolution, not about the task, and it carries only the first step (no data yet):
sigma_cell = 4 on the logit scale lets one step's few dozen continuations move each cell.

A fitted prior (`FlipPrior`, `fit_flip_prior`, the setting `predictor.flip_prior`) moves the prior's mean from 0 to
the layer's own fit on earlier runs' chosen anchors (pooled, no ageing) and holds it with a spread of its own (the
caller's: `lab/scripts/fit_flip_prior.py --sigma-cell --sigma-slope`; for the default LM task chosen on tuning seeds by
`lab/scripts/loo_flip_layer.py`, docs/predictors.md): a fresh layer then predicts the earlier runs' flip rates per (r,
depth), which is what the q/2 prior got wrong in the steps before any data (a failure's deep prefix flips far less
than q/2 says). The objective is the same with (theta - mean) in the prior term; the fit starts from the mean. The
prior also carries the half-life the layer ages its own rows at (16 steps unless it says otherwise): how fast the
layer leaves the prior for what the run shows is chosen with the spread, on the same tuning runs.

Honest about selection. The layer is fitted on the anchors stage 2 chose, and only on them: an anchor that got
no continuation shows no flip. Stage 2 chooses on the layer's own prediction, a function of (r, v, d), the
layer's inputs; given its inputs, being chosen tells nothing more about the outcome (selection on what the
model sees), so the arg-max does not bias the fit the way it makes q from V~ look better on the chosen
prefixes than it is. Two limits remain. A prompt's anchors compete for its budget, so being chosen also
depends on the siblings' inputs, which may carry information about an anchor's state that its own inputs
lack. And a cell the allocator stops choosing (late prefixes of successful rollouts, once the layer learns
they rarely flip) gets no new data: its prediction rests on old rows and, as they age out, on the prior; if
the prior over-predicts there, the allocator tries the cell again and the new rows correct it.

What it cannot do: reorder the anchors of one (r, depth) cell that V~ ranks wrongly. b scales logit(q) but
keeps the order within a cell (for b > -1); it moves whole cells against each other (a failure's early prefix
against a success's late one) and sets the levels. Only features that see the state after a turn (a critic on
the policy's hidden states) can sharpen which prefix of a cell to pick. numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..allocation import prefix_flip_prob
from ..safe_read import read_json
from ..strict_json import dumps
from ..tree import RolloutTree
from .map_logistic import AgedLogisticLayer, binomial_counts
from .map_logistic import expit as _expit
from .map_logistic import logit as _logit
from .map_logistic import positive as _positive

# the setting `predictor.flip_model` -> whether stage 2 reads this layer (calibrated) or q from V~ alone (raw)
FLIP_MODELS = {"raw": False, "calibrated": True}


def beta_flip_prior(q, kappa: float) -> np.ndarray:
    """q k/(k + 1): the flip probability when V given the features is Beta with mean V~ and concentration k
    (module docstring). With k = 1 it is half of q."""
    return np.asarray(q, dtype=np.float64) * (kappa / (kappa + 1.0))


class FlipCalibrator(AgedLogisticLayer):
    """P(a continuation flips its rollout's outcome | r, V~, depth), online (see the module docstring)."""

    name = "flip model"

    def __init__(
        self,
        kappa: float = 1.0,
        sigma_cell: float = 4.0,
        sigma_slope: float = 0.5,
        half_life: float = 16.0,
        max_depth: int = 4,
        prior_mean=None,
    ):
        self.kappa = _positive("kappa", kappa)
        self.sigma_cell = _positive("sigma_cell", sigma_cell)
        self.sigma_slope = _positive("sigma_slope", sigma_slope)
        self.half_life = _positive("half_life", half_life)
        if isinstance(max_depth, bool) or not isinstance(max_depth, (int, np.integer)) or max_depth < 1:
            raise ValueError(f"max_depth must be an integer >= 1, got {max_depth!r}")
        self.max_depth = int(max_depth)
        # the prior's mean: 0 is q k/(k + 1) (the module docstring), a FlipPrior's theta is a fit on earlier runs
        size = 2 * self.max_depth + 2
        mean = np.zeros(size) if prior_mean is None else np.asarray(prior_mean, dtype=np.float64)
        if mean.shape != (size,) or not np.all(np.isfinite(mean)):
            raise ValueError(f"prior_mean must hold {size} finite numbers (2 x max_depth cells, 2 slopes)")
        self.prior_mean = mean
        self.theta = mean.copy()
        self.steps_seen = 0
        # one row per observed anchor: success (0/1), q from V~, depth bin, continuations, flips, age in steps
        self._rows = np.zeros((0, 6))

    # -- the model --------------------------------------------------------------------------------
    def _inputs(self, reward, v, depth) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        success = (np.asarray(reward, dtype=np.float64) > 0.5).astype(np.float64)
        v = np.asarray(v, dtype=np.float64)
        depth = np.asarray(depth)
        if not success.shape == v.shape == depth.shape or success.ndim != 1:
            shapes = f"{success.shape}, {v.shape}, {depth.shape}"
            raise ValueError(f"reward, v and depth must be 1-D arrays of one length, got shapes {shapes}")
        if v.size and (not np.all(np.isfinite(v)) or v.min() < 0 or v.max() > 1):
            raise ValueError("v must hold probabilities in [0, 1]")
        if depth.size and (not np.issubdtype(depth.dtype, np.integer) or depth.min() < 1):
            raise ValueError("depth must hold integers >= 1 (an anchor is a turn below the root)")
        return success, prefix_flip_prob(success, v), np.minimum(depth, self.max_depth).astype(np.int64) - 1

    def _design(self, success: np.ndarray, q: np.ndarray, dbin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(X, offset): one-hot (r, depth bin) cells, then logit(q) after a failure and after a success."""
        n, d = q.size, self.max_depth
        x = np.zeros((n, 2 * d + 2))
        x[np.arange(n), success.astype(np.int64) * d + dbin] = 1.0
        z = _logit(q)
        x[:, 2 * d] = (1.0 - success) * z
        x[:, 2 * d + 1] = success * z
        return x, _logit(beta_flip_prior(q, self.kappa))

    def _precision(self) -> np.ndarray:
        d = self.max_depth
        return np.concatenate([np.full(2 * d, self.sigma_cell**-2.0), np.full(2, self.sigma_slope**-2.0)])

    def predict(self, reward, v, depth) -> np.ndarray:
        """The flip probability of one continuation from each anchor (bare reward, V~ at the anchor, its depth)."""
        success, q, dbin = self._inputs(reward, v, depth)
        x, offset = self._design(success, q, dbin)
        return _expit(offset + x @ self.theta)

    # -- the online update ------------------------------------------------------------------------
    def observe(self, reward, v, depth, continuations, flips) -> None:
        """One step's chosen anchors (their bare reward, V~ when stage 2 scored them, depth, how many
        continuations they grew and how many flipped): age the rows seen so far by one step, add these, refit."""
        success, q, dbin = self._inputs(reward, v, depth)
        k, f = binomial_counts(continuations, flips, q.shape, ("continuations", "flips"), "the anchors")
        self._add_step(np.stack([success, q, dbin, k, f, np.zeros_like(q)], axis=1))

    def _data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        success, q, dbin, k, f, _ = self._rows.T
        x, offset = self._design(success, q, dbin.astype(np.int64))
        return x, offset, k, f

    # -- checkpoints ------------------------------------------------------------------------------
    def _settings(self) -> dict:
        settings = {
            "kappa": self.kappa,
            "sigma_cell": self.sigma_cell,
            "sigma_slope": self.sigma_slope,
            "half_life": self.half_life,
            "max_depth": self.max_depth,
        }
        if np.any(self.prior_mean != 0):  # only with a fitted prior: checkpoints from before it still load
            settings["prior_mean"] = self.prior_mean.tolist()
        return settings


def flip_observations(trees: Iterable[RolloutTree]) -> tuple[np.ndarray, ...]:
    """(reward, V~, depth, continuations, flips) of every anchor that grew continuations and was scored (its
    V~ at allocation is on the node): what `FlipCalibrator.observe` takes."""
    rows = []
    for tree in trees:
        for node, r in tree.anchors():
            started = tree.started_rewards(node.node_id)
            if started and node.predicted is not None:
                flips = sum((x > 0.5) != (r > 0.5) for x in started)
                rows.append((r, node.predicted, node.depth, len(started), flips))
    if not rows:
        return tuple(np.zeros(0, dtype=t) for t in (float, float, np.int64, np.int64, np.int64))
    r, v, d, k, f = zip(*rows)
    return (
        np.array(r, dtype=np.float64),
        np.array(v, dtype=np.float64),
        np.array(d, dtype=np.int64),
        np.array(k, dtype=np.int64),
        np.array(f, dtype=np.int64),
    )


@dataclass(frozen=True)
class FlipPrior:
    """The layer's prior, fitted on earlier runs' flips (`fit_flip_prior`, `lab/scripts/fit_flip_prior.py`): its mean
    (theta, the cells' offsets then the two slopes), its spread (the sigmas the layer is built with) and what the
    fit saw per cell (continuations and flips; cells in `FlipCalibrator`'s order: after a failure depths 1..D,
    then after a success). Stored as a small JSON file, read by `predictor.flip_prior`."""

    theta: tuple[float, ...]
    sigma_cell: float
    sigma_slope: float
    continuations: tuple[int, ...]
    flips: tuple[int, ...]
    runs: tuple[str, ...] = ()  # what it was fitted on (for the reader; nothing reads it)
    kappa: float = 1.0
    max_depth: int = 4
    half_life: float = 16.0  # the layer's ageing under this prior (steps), chosen with the sigmas

    def __post_init__(self):
        _positive("kappa", self.kappa)
        _positive("half_life", self.half_life)
        _positive("sigma_cell", self.sigma_cell)
        _positive("sigma_slope", self.sigma_slope)
        FlipCalibrator(kappa=self.kappa, max_depth=self.max_depth, prior_mean=self.theta)  # checks theta's size
        cells = 2 * self.max_depth
        if len(self.continuations) != cells or len(self.flips) != cells:
            raise ValueError(f"continuations and flips must hold one count per cell ({cells})")

    def layer(self, half_life: float | None = None) -> FlipCalibrator:
        """A fresh layer under this prior (ageing at the prior's half-life unless one is given): before any data
        it predicts the prior's probabilities."""
        life = self.half_life if half_life is None else half_life
        return FlipCalibrator(
            self.kappa, self.sigma_cell, self.sigma_slope, life, self.max_depth, prior_mean=self.theta
        )

    def to_dict(self) -> dict:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}

    @classmethod
    def from_dict(cls, doc) -> "FlipPrior":
        """The prior of a `to_dict` document; wrong or missing keys, or bad values, are refused in one line."""
        names = {f.name for f in fields(cls)}
        required = {"theta", "sigma_cell", "sigma_slope", "continuations", "flips"}
        if not isinstance(doc, dict):
            raise ValueError(f"a flip prior is a JSON object with the keys {', '.join(sorted(names))}")
        if missing := sorted(required - doc.keys()):
            raise ValueError(f"the flip prior lacks {', '.join(missing)} (lab/scripts/fit_flip_prior.py writes them)")
        if unknown := sorted(doc.keys() - names):
            raise ValueError(
                f"the flip prior has unknown keys {', '.join(unknown)}; allowed: {', '.join(sorted(names))}"
            )
        try:
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc.items()})
        except (TypeError, ValueError) as err:
            raise ValueError(f"the flip prior is malformed: {err}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "FlipPrior":
        """The prior in the JSON file `path`; one line for a missing or unreadable file or a wrong document."""
        if not Path(path).is_file():
            raise ValueError(f"no file {path} (lab/scripts/fit_flip_prior.py writes one)")
        try:
            doc = read_json(path)  # bounded (safe_read.MAX_JSON_BYTES); nesting too deep is a ValueError too
        except (OSError, ValueError) as err:
            raise ValueError(f"{path} is not a JSON file: {err}") from None
        try:
            return cls.from_dict(doc)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None


def fit_flip_prior(
    runs: Sequence[tuple[np.ndarray, ...]],
    sigma_cell: float,
    sigma_slope: float,
    names: Sequence[str] = (),
    kappa: float = 1.0,
    max_depth: int = 4,
    half_life: float = 16.0,
) -> FlipPrior:
    """The prior fitted on earlier runs' chosen anchors: each run's (reward, V~, depth, continuations, flips), as
    `FlipCalibrator.observe` takes them, all pooled and fitted once by the layer's own MAP fit (around the q k/(k
    + 1) prior, every row at weight 1: no ageing, a run's early and late steps count alike). The spread the
    layer will hold it with and the half-life it will age its own rows at are the caller's
    (`lab/scripts/fit_flip_prior.py` takes them; `lab/scripts/loo_flip_layer.py` chooses them by leaving a tuning
    run out)."""
    if not runs:
        raise ValueError("fit_flip_prior needs at least one run's anchors")
    pooled = [np.concatenate([np.asarray(run[i]) for run in runs]) for i in range(5)]
    layer = FlipCalibrator(kappa=kappa, max_depth=max_depth)
    layer.observe(*pooled)  # one observe: every row at age 0, weight 1
    success, _, dbin = layer._inputs(*pooled[:3])
    cell = success.astype(np.int64) * max_depth + dbin
    counts = np.bincount(cell, weights=pooled[3], minlength=2 * max_depth)
    flips = np.bincount(cell, weights=pooled[4], minlength=2 * max_depth)
    return FlipPrior(
        theta=tuple(float(x) for x in layer.theta),
        sigma_cell=float(sigma_cell),
        sigma_slope=float(sigma_slope),
        continuations=tuple(int(x) for x in counts),
        flips=tuple(int(x) for x in flips),
        runs=tuple(str(n) for n in names),
        kappa=float(kappa),
        max_depth=int(max_depth),
        half_life=float(half_life),
    )


def make_flip_model(kind: str, prior: str = "") -> FlipCalibrator | None:
    """The flip model of the settings `predictor.flip_model` and `predictor.flip_prior`: None for raw (q from
    V~), else the layer, around q k/(k + 1) or, given a prior file, around that prior."""
    if kind not in FLIP_MODELS:
        raise ValueError(f"flip_model must be one of {', '.join(FLIP_MODELS)}, got {kind!r}")
    if not FLIP_MODELS[kind]:
        if prior:
            raise ValueError(f"predictor.flip_prior: only predictor.flip_model=calibrated reads it (it is {kind})")
        return None
    if not prior:
        return FlipCalibrator()
    try:
        return FlipPrior.load(prior).layer()
    except ValueError as err:
        raise ValueError(f"predictor.flip_prior: {err}") from None
