"""Passage retrieval for multi-hop QA: BM25 (bm25s) by default, dense (faiss + an encoder) on request, a /retrieve
server that Search-R1's, verl's and SkyRL's clients can call, and a client for any such server.

Passages are {"id", "title", "text"}; a hit renders as Search-R1's `contents`: '"Title"\\ntext'. BM25 returns only
passages that share a word with the query (as Search-R1's Lucene BM25 does), so a query of unknown or stop words
gets no passages; dense search always returns k.

The server and the client live in retrieval_server.py; `serve` and `RemoteRetriever` can be imported from here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'


class Retriever(Protocol):
    passages: list[Passage]

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[tuple[Passage, float]]]: ...


def load_corpus(path: str | Path) -> list[Passage]:
    """HotpotQA-style {title: [sentences]} or a list of {title, text} (MuSiQue, Search-R1 'contents')."""
    path = Path(path)
    try:
        data = (
            json.loads(path.read_text(encoding="utf-8"))
            if path.suffix == ".json"
            else [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
        )
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read corpus {path}: {err}") from None
    if isinstance(data, dict):
        return [
            Passage(str(i), t, "".join(s) if isinstance(s, list) else str(s)) for i, (t, s) in enumerate(data.items())
        ]
    out = []
    for i, row in enumerate(data):
        if "contents" in row and "title" not in row:
            title, _, text = row["contents"].partition("\n")
            out.append(Passage(str(row.get("id", i)), title.strip('"'), text))
        else:
            out.append(
                Passage(str(row.get("id", i)), row.get("title", ""), row.get("text") or row.get("paragraph_text", ""))
            )
    return out


class BM25Retriever:
    def __init__(self, passages: list[Passage]):
        import bm25s

        if not passages:
            raise ValueError("the corpus is empty")
        self.bm25s, self.passages = bm25s, passages
        self.index = bm25s.BM25()
        tokens = bm25s.tokenize([f"{p.title} {p.text}" for p in passages], stopwords="en", show_progress=False)
        self.index.index(tokens, show_progress=False)

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[tuple[Passage, float]]]:
        k = max(1, min(k, len(self.passages)))
        toks = self.bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
        toks = [t if t else ["<empty>"] for t in toks]
        ids, scores = self.index.retrieve(toks, k=k, show_progress=False)
        # a score of 0 means no query word occurs in the passage: not a hit
        return [
            [(self.passages[int(i)], float(s)) for i, s in zip(row_i, row_s) if s > 0]
            for row_i, row_s in zip(ids, scores)
        ]


class DenseRetriever:
    """Inner-product search over normalised embeddings (faiss), from any mean-pooled HF encoder."""

    def __init__(self, passages: list[Passage], encoder: str = "all-minilm-l6-v2", batch_size: int = 64):
        import faiss
        import torch
        from transformers import AutoModel, AutoTokenizer

        from ..lm.models import MINILM, minilm_path

        path = str(minilm_path()) if encoder == MINILM else encoder
        self.torch, self.passages, self.batch_size = torch, passages, batch_size
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        vecs = self.embed([p.contents for p in passages])
        self.index = faiss.IndexFlatIP(vecs.shape[1])
        self.index.add(vecs)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        torch, out = self.torch, []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tok(
                list(texts[i : i + self.batch_size]), padding=True, truncation=True, max_length=256, return_tensors="pt"
            )
            with torch.no_grad():
                h = self.model(**enc).last_hidden_state
            m = enc["attention_mask"][..., None].float()
            v = (h * m).sum(1) / m.sum(1)
            out.append(torch.nn.functional.normalize(v, dim=-1).numpy())
        return np.concatenate(out).astype(np.float32)

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[tuple[Passage, float]]]:
        scores, ids = self.index.search(self.embed(queries), max(1, min(k, len(self.passages))))
        return [[(self.passages[int(i)], float(s)) for i, s in zip(ri, rs) if i >= 0] for ri, rs in zip(ids, scores)]


def recall_at_k(retriever: Retriever, questions: list[str], supporting: list[set[str]], k: int = 5) -> float:
    """Mean share of a question's supporting titles found among its top-k passages."""
    hits = retriever.search(questions, k)
    per_q = [len({p.title for p, _ in h} & sup) / len(sup) for h, sup in zip(hits, supporting) if sup]
    return float(np.mean(per_q)) if per_q else float("nan")


_SERVING = ("RemoteRetriever", "RetrieverError", "ServerLimits", "serve")


def __getattr__(name: str):
    # the server and client are imported on first use: BM25 alone needs neither FastAPI nor uvicorn
    if name in _SERVING:
        from . import retrieval_server

        return getattr(retrieval_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
