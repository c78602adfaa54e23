"""VIP's success predictor: a Gaussian process on the logit of each prompt's last success rate, over prompt
embeddings, its posterior mean carried from step to step.

What upstream computes (github.com/HieuNT91/VIP, src/vip/success_rate_prediction/gaussian_process.py `GPR`, as
train/vip/vip_ray_trainer.py @ 87bedf7f874f1d61741268de28b4f48d39605b84 builds and calls it): a mean vector m
over every prompt of the training set, started at `prior` = -5 (sigmoid: 0.7%); kernel k(x, y) =
exp(-0.5 (|x - y| / l)^2) on the Euclidean distance of the prompts' all-MiniLM-L6-v2 embeddings (unit length,
so distances lie in [0, 2]). After each step, the prompts just rolled out (one step of history: the trainer
reads the last step's log only) with success rates y are fitted:

    g = logit(clip(y, 1e-6, 1 - 1e-6)),  alpha = (K_tt + 1e-4 I)^-1 (g - m_t),
    m <- m + K_{., t} alpha   (every prompt),   then m_t <- g   (the fitted prompts take their observation),

and the next batch is predicted as sigmoid(m). Because m is kept (`reuse_mean=True`), a prompt's value is its
last observed logit plus the pulls of every later fit near it; a prompt never seen starts from the prior.
The length scale: the trainer passes none, and the file's history sets it to 0.5, 0.23, 0.27, 0.4 and, in the
version that makes it a parameter (dc365c3), 0.27 by default; trace-rl uses 0.27.

How trace-rl computes the same numbers without a dense vector over a fixed data set (its LM tasks can be
generated on the fly): a prompt's mean is `base + k(x, X[start:]) @ alpha[start:]`, where X and alpha
concatenate every fit's prompts and weights, base is the prompt's last fitted logit (or the prior) and start
the first row fitted after it. That is upstream's m, summed in another order (equal to ~1e-12; the tests
compare the two on random sequences). Costs: predicting a prompt is O(rows since it was last fitted x
embedding size), and the rows grow by one batch per step: 1280 rows after 40 steps of 32 prompts.

Not modelled: upstream fits prompts it finds in its precomputed embedding index only (every training prompt is
there); a prompt twice in one fit is fitted once, at the mean of its targets (upstream's log holds one entry
per prompt and step). Only roots train the GP: prefixes have no embedding in VIP, and a prefix is scored with
its prompt's value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Sequence

import numpy as np

from ..tree import RolloutTree
from .base import Prefix
from .history import prompt_key

LENGTH_SCALE = 0.27  # GPR's default length scale (dc365c3)
PRIOR = -5.0  # the trainer's prior_value: logit of the mean before any fit
JITTER = 1e-4  # added to K_tt's diagonal before the Cholesky factorisation
CLIP = 1e-6  # success rates clipped to [CLIP, 1 - CLIP] before the logit

Embedder = Callable[[Sequence[RolloutTree]], np.ndarray]


def rbf(x: np.ndarray, y: np.ndarray, length_scale: float) -> np.ndarray:
    """exp(-0.5 (|x - y| / l)^2) between the rows of x and y (upstream's kernel_rbf on the distance)."""
    sq = (x * x).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2.0 * x @ y.T
    d = np.sqrt(np.maximum(sq, 0.0))
    return np.exp(-0.5 * (d / length_scale) ** 2)


def logit(y) -> np.ndarray:
    y = np.clip(np.asarray(y, dtype=np.float64), CLIP, 1 - CLIP)
    return np.log(y / (1 - y))


class GaussianProcessPredictor:
    """V~ of a prompt from the GP above; `embed` maps root trees to unit-length vectors (one row per tree)."""

    def __init__(
        self,
        embed: Embedder,
        length_scale: float = LENGTH_SCALE,
        prior: float = PRIOR,
        jitter: float = JITTER,
    ):
        if not length_scale > 0 or not jitter > 0 or not np.isfinite(prior):
            raise ValueError(f"need length_scale > 0, jitter > 0, finite prior; got {length_scale}, {jitter}, {prior}")
        self.embed, self.length_scale, self.prior, self.jitter = embed, length_scale, float(prior), jitter
        self.vectors: dict[object, np.ndarray] = {}  # each prompt's embedding, computed once
        self.state: dict[object, tuple[float, int]] = {}  # prompt -> (last fitted logit, first row fitted after it)
        self.X = np.zeros((0, 0))  # every fit's prompts, in order
        self.alpha = np.zeros(0)  # and their weights

    def _vectors(self, trees: Sequence[RolloutTree]) -> np.ndarray:
        keys = [prompt_key(t) for t in trees]
        new = {}
        for key, tree in zip(keys, trees):
            if key not in self.vectors and key not in new:
                new[key] = tree
        if new:
            vecs = np.asarray(self.embed(list(new.values())), dtype=np.float64)
            if vecs.ndim != 2 or vecs.shape[0] != len(new) or (self.X.size and vecs.shape[1] != self.X.shape[1]):
                raise ValueError(f"the embedder returned shape {vecs.shape} for {len(new)} prompts")
            self.vectors.update(zip(new, vecs))
        return np.array([self.vectors[k] for k in keys]).reshape(len(keys), -1)

    def _logits(self, trees: Sequence[RolloutTree]) -> np.ndarray:
        """The posterior mean (logit) of each tree's prompt."""
        x = self._vectors(trees)
        out = np.empty(len(trees))
        for i, tree in enumerate(trees):
            base, start = self.state.get(prompt_key(tree), (self.prior, 0))
            if start < len(self.alpha):
                base += float(rbf(x[i : i + 1], self.X[start:], self.length_scale)[0] @ self.alpha[start:])
            out[i] = base
        return out

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        """sigmoid of the posterior mean of each prefix's prompt (a prefix is scored with its prompt's value)."""
        if not len(prefixes):
            return np.zeros(0)
        return 1.0 / (1.0 + np.exp(-self._logits([tree for tree, _ in prefixes])))

    def update(self, prefixes: Sequence[Prefix], targets: np.ndarray) -> float:
        """One fit on the roots among `prefixes` (their step's success rates); returns the squared error of the
        predictions made before it."""
        roots: dict[object, tuple[RolloutTree, list[float]]] = {}
        for (tree, nid), y in zip(prefixes, np.asarray(targets, dtype=np.float64)):
            if nid == tree.root_id:
                roots.setdefault(prompt_key(tree), (tree, []))[1].append(float(y))
        if not roots:
            return 0.0
        trees = [tree for tree, _ in roots.values()]
        y = np.array([np.mean(ys) for _, ys in roots.values()])
        before = self._logits(trees)
        x = self._vectors(trees)
        g = logit(y)
        k = rbf(x, x, self.length_scale) + self.jitter * np.eye(len(trees))
        chol = np.linalg.cholesky(k)
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, g - before))
        self.X = x.copy() if not self.X.size else np.vstack([self.X, x])
        self.alpha = np.concatenate([self.alpha, alpha])
        for key, gi in zip(roots, g):
            self.state[key] = (float(gi), len(self.alpha))
        return float(np.mean((1.0 / (1.0 + np.exp(-before)) - y) ** 2))

    def save(self, path) -> None:
        keys = list(self.vectors)
        index = {json.dumps(k, default=str): i for i, k in enumerate(keys)}
        state = [[index[json.dumps(k, default=str)], b, s] for k, (b, s) in self.state.items()]
        vectors = np.array([self.vectors[k] for k in keys]) if keys else np.zeros((0, 0))
        np.savez(
            path,
            keys=np.array(json.dumps(keys, default=str)),
            vectors=vectors,
            state=np.array(json.dumps(state)),
            X=self.X,
            alpha=self.alpha,
            settings=np.array([self.length_scale, self.prior, self.jitter]),
        )

    def load(self, path) -> None:
        path = Path(path if str(path).endswith(".npz") else f"{path}.npz")
        with np.load(path) as data:
            keys = [tuple(k) if isinstance(k, list) else k for k in json.loads(str(data["keys"]))]
            self.vectors = dict(zip(keys, data["vectors"]))
            self.state = {keys[i]: (float(b), int(s)) for i, b, s in json.loads(str(data["state"]))}
            self.X, self.alpha = data["X"], data["alpha"]
            self.length_scale, self.prior, self.jitter = (float(v) for v in data["settings"])
