"""The light CPU predictor for LM agents: hashed n-grams and structure of the serialised history, fed to the
online logistic model. Microseconds per prefix, so it never shows up in a step's time split.

What it sees: word unigrams and bigrams of the prompt and of each turn's action and observation (hashed with
a sign into `buckets` dims, per segment so that "error" in an observation differs from "error" in a
question), plus structure: depth, share of turns whose observation reports an error, and the log length.
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
ERROR_WORDS = ("error", "invalid", "unknown", "wrong", "limit")


def prompt_text(tree: RolloutTree) -> str:
    p = tree.prompt
    if isinstance(p, dict):
        return str(p.get("question") or p.get("prompt") or p)
    return "" if p is None else str(p)


def serialize_prefix(tree: RolloutTree, node_id: str) -> str:
    """The prompt and the turns up to node_id as text (what a text critic reads)."""
    parts = [prompt_text(tree)]
    for node in tree.path(node_id)[1:]:
        if node.thought:
            parts.append(f"Thought: {node.thought}")
        parts.append(node.action)
        parts.append(f"Observation: {node.observation}")
    return "\n".join(parts)


def _shape(word: str) -> str:
    """Numbers become their digit count: what matters for the agent is how long, not which."""
    return f"<num{min(len(word), 6)}>" if word.isdigit() else word.lower()


class HashedTextFeatures:
    def __init__(self, buckets: int = 2048):
        self.buckets = buckets
        self.dim = buckets + 4

    def _add(self, x: np.ndarray, segment: str, text: str) -> None:
        words = [_shape(w) for w in WORD.findall(text)]
        grams = words + [a + " " + b for a, b in zip(words, words[1:])]
        for g in grams:
            h = zlib.crc32(f"{segment}|{g}".encode())
            x[h % self.buckets] += 1.0 if (h >> 31) & 1 else -1.0

    def __call__(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        x = np.zeros((len(prefixes), self.dim))
        for row, (tree, nid) in enumerate(prefixes):
            self._add(x[row], "q", prompt_text(tree))
            path = tree.path(nid)[1:]
            errors = 0
            for node in path:
                self._add(x[row], "a", node.action)
                self._add(x[row], "o", node.observation)
                errors += any(w in node.observation.lower() for w in ERROR_WORDS)
            norm = np.linalg.norm(x[row, : self.buckets])
            if norm:
                x[row, : self.buckets] /= norm
            length = len(prompt_text(tree)) + sum(len(n.action) + len(n.observation) for n in path)
            x[row, self.buckets:] = (1.0, len(path) / 8.0, errors / max(len(path), 1), np.log1p(length) / 8.0)
        return x


def light_text_predictor(buckets: int = 2048, lr: float = 0.05, seed: int = 0) -> OnlineLogisticPredictor:
    feats = HashedTextFeatures(buckets)
    return OnlineLogisticPredictor(feats, feats.dim, lr=lr, seed=seed)
