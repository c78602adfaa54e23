"""Passage retrieval for multi-hop QA: BM25 (bm25s) by default, dense (faiss + an encoder) on request, a /retrieve
server that Search-R1's, verl's and SkyRL's clients can call, and a client for any such server.

Passages are {"id", "title", "text"}; a hit renders as Search-R1's `contents`: '"Title"\\ntext'. BM25 returns only
passages that share a word with the query (as Search-R1's Lucene BM25 does), so a query of unknown or stop words
gets no passages; dense search always returns k.

The server and the client live in retrieval_server.py, which imports this module (never the other way round):
import `serve` and `RemoteRetriever` from there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ..errors import ConfigError
from ..safe_read import BOUNDS, read_bytes, read_lines


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


_CORPUS_LAYOUT = "a corpus is {title: [sentences]} or a list of {title, text} or {contents} objects"


def _read_corpus(path: Path) -> object:
    """The parsed .json document, or the list of a JSON-lines file's objects (lines read one by one, bounded)."""
    if path.suffix == ".json":
        return json.loads(read_bytes(path, BOUNDS["corpus"].document).decode("utf-8"))
    rows = []
    for lineno, line in read_lines(path, "corpus"):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"line {lineno}: {err}") from None
    return rows


def load_corpus(path: str | Path) -> list[Passage]:
    """HotpotQA-style {title: [sentences]} or a list of {title, text} (MuSiQue, Search-R1 'contents'); `.jsonl`
    and other suffixes are read as one object per line. A file that is missing, unreadable or in another layout
    is a ConfigError naming `corpus`, the row and what is allowed. Bounds (safe_read.BOUNDS["corpus"]): a line
    16 MiB, no bound on a JSON-lines file (a corpus of millions of passages), a .json file (parsed whole) 1 GiB."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"corpus: no file {path}")
    try:
        data = _read_corpus(path)
    except (OSError, ValueError, RecursionError) as err:  # BadFile (a bound, not UTF-8) too: named as `corpus`
        raise ConfigError(f"corpus: cannot read {path} ({type(err).__name__}: {err})") from None
    if isinstance(data, dict):
        rows = [
            {"title": str(t), "text": "".join(map(str, s)) if isinstance(s, list) else str(s)} for t, s in data.items()
        ]
    elif isinstance(data, list):
        rows = data
    else:
        raise ConfigError(f"corpus: {path} holds {json.dumps(data)[:40]}; {_CORPUS_LAYOUT}")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"corpus: {path} row {i} is {json.dumps(row)[:40]}, not an object; {_CORPUS_LAYOUT}")
        if "contents" in row and "title" not in row:
            if not isinstance(row["contents"], str):
                raise ConfigError(f"corpus: {path} row {i}: 'contents' is not a string; {_CORPUS_LAYOUT}")
            title, _, text = row["contents"].partition("\n")
            out.append(Passage(str(row.get("id", i)), title.strip('"'), text))
            continue
        title, text = row.get("title", ""), row.get("text") or row.get("paragraph_text", "")
        if not isinstance(title, str) or not isinstance(text, str) or not (title or text):
            raise ConfigError(f"corpus: {path} row {i} has no string 'title' and 'text'; {_CORPUS_LAYOUT}")
        out.append(Passage(str(row.get("id", i)), title, text))
    if not out:
        raise ConfigError(f"corpus: {path} holds no passages")
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
