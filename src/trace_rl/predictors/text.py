"""The light CPU predictor for LM agents: hashed n-grams and structure of the serialised history, fed to the
online logistic model. Hashing and one dot product per prefix on the CPU: cheap beside any real policy's
generation (docs/predictors.md has the measured share of a step).

What it sees: word unigrams and bigrams of the prompt and of each turn's action and observation (hashed with
a sign into `buckets` dims, per segment so that "error" in an observation differs from "error" in a
question), plus structure: depth, share of turns whose observation reports an error, the log length, how
many numbers the prompt holds and how long the longest is (a normalised bag blurs counts, which carry
difficulty), the pair of them as a one-hot "shape" (a linear model cannot otherwise learn a cliff such as
"fine up to 2 digits, hopeless at 3", and prompts of one shape share their success rate; docs/predictors.md
has what it changed on the calculator task), and
whether an action used a number the agent had not read in the prompt or an observation (an invented
argument: on the calculator task a miscopy that dooms the episode; generic to tool arguments).
"""

from __future__ import annotations

import re
import zlib
from typing import Sequence

import numpy as np

from ..tree import RolloutTree
from .base import Prefix
from .logistic import OnlineLogisticPredictor

WORD = re.compile(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]")
NUMBER = re.compile(r"\d+")
ERROR_WORDS = ("error", "invalid", "unknown", "wrong", "limit")
MAX_COUNT, MAX_DIGITS = 8, 5  # prompt shapes: (numbers in the prompt, digits of the longest), both capped
SHAPES = (MAX_COUNT + 1) * (MAX_DIGITS + 1)


def prompt_text(tree: RolloutTree) -> str:
    p = tree.prompt
    if isinstance(p, dict):
        return str(p.get("question") or p.get("prompt") or p)
    return "" if p is None else str(p)


def _shape(word: str) -> str:
    """Numbers become their digit count: what matters for the agent is how long, not which."""
    return f"<num{min(len(word), 6)}>" if word.isdigit() else word.lower()


class HashedTextFeatures:
    def __init__(self, buckets: int = 2048):
        self.buckets = buckets
        self.dim = buckets + SHAPES + 7

    def _add(self, x: np.ndarray, segment: str, text: str) -> None:
        words = [_shape(w) for w in WORD.findall(text)]
        grams = words + [a + " " + b for a, b in zip(words, words[1:])]
        for g in grams:
            h = zlib.crc32(f"{segment}|{g}".encode())
            x[h % self.buckets] += 1.0 if (h >> 31) & 1 else -1.0

    def __call__(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        x = np.zeros((len(prefixes), self.dim))
        for row, (tree, nid) in enumerate(prefixes):
            prompt = prompt_text(tree)
            self._add(x[row], "q", prompt)
            path = tree.path(nid)[1:]
            errors, unseen = 0, 0
            numbers = NUMBER.findall(prompt)
            seen = set(numbers)
            for node in path:
                self._add(x[row], "a", node.action)
                self._add(x[row], "o", node.observation)
                errors += any(w in node.observation.lower() for w in ERROR_WORDS)
                unseen += any(n not in seen for n in NUMBER.findall(node.action))
                seen.update(NUMBER.findall(node.observation))
            norm = np.linalg.norm(x[row, : self.buckets])
            if norm:
                x[row, : self.buckets] /= norm
            length = len(prompt) + sum(len(n.action) + len(n.observation) for n in path)
            longest = max(map(len, numbers), default=0)
            x[row, self.buckets + min(len(numbers), MAX_COUNT) * (MAX_DIGITS + 1) + min(longest, MAX_DIGITS)] = 1.0
            x[row, self.buckets + SHAPES :] = (
                1.0,
                len(path) / 8.0,
                errors / max(len(path), 1),
                np.log1p(length) / 8.0,
                len(numbers) / 8.0,
                longest / 4.0,
                min(unseen, 2) / 2.0,
            )
        return x


def light_text_predictor(
    buckets: int = 2048, lr: float = 0.3, epochs: int = 20, replay_steps: int = 32, seed: int = 0
) -> OnlineLogisticPredictor:
    """Near-full fits of a long replay window each step (20 epochs at lr 0.3).

    With a few dozen prompts a step, the class defaults (4 epochs at lr 0.05) fit too little: V~ stays near
    the middle for every prompt for several steps, and the root allocator cannot tell hopeless prompts from
    near-certain ones. The window is long because the predictor only sees the prompts the allocator chose:
    with a short window, the first step's broad sample leaves it after a few steps, V~ of the prompts the
    allocator skipped drifts, and the allocator starts spending on them again (docs/predictors.md).
    """
    feats = HashedTextFeatures(buckets)
    return OnlineLogisticPredictor(feats, feats.dim, lr=lr, epochs=epochs, replay_steps=replay_steps, seed=seed)
