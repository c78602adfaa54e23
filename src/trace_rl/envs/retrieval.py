"""Passage retrieval for multi-hop QA: BM25 (bm25s) by default, dense (faiss + an encoder) on request, and a
/retrieve server on 127.0.0.1 compatible with Search-R1's, so many rollout workers share one index.

Passages are {"id", "title", "text"}; a hit renders as Search-R1's `contents`: '"Title"\\ntext'.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol, Sequence

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
        data = json.loads(path.read_text(encoding="utf-8")) if path.suffix == ".json" else [
            json.loads(l) for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read corpus {path}: {err}") from None
    if isinstance(data, dict):
        return [Passage(str(i), t, "".join(s) if isinstance(s, list) else str(s)) for i, (t, s) in enumerate(data.items())]
    out = []
    for i, row in enumerate(data):
        if "contents" in row and "title" not in row:
            title, _, text = row["contents"].partition("\n")
            out.append(Passage(str(row.get("id", i)), title.strip('"'), text))
        else:
            out.append(Passage(str(row.get("id", i)), row.get("title", ""), row.get("text") or row.get("paragraph_text", "")))
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
        return [[(self.passages[int(i)], float(s)) for i, s in zip(row_i, row_s)] for row_i, row_s in zip(ids, scores)]


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
            enc = self.tok(list(texts[i: i + self.batch_size]), padding=True, truncation=True, max_length=256, return_tensors="pt")
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


def serve(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """Start a Search-R1-compatible /retrieve server in a background thread; returns the server (call shutdown)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server naming)
            if self.path.rstrip("/") != "/retrieve":
                return self._reply(404, {"error": f"unknown path {self.path}; POST /retrieve"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                queries = body["queries"]
                if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                    raise ValueError("queries must be a list of strings")
                topk = int(body.get("topk", 3))
            except (ValueError, KeyError, TypeError) as err:
                return self._reply(400, {"error": f"bad request: {err}"})
            with_scores = bool(body.get("return_scores", False))
            result = []
            for hits in retriever.search(queries, topk):
                docs = [{"document": {"id": p.id, "contents": p.contents}, "score": s} if with_scores
                        else {"id": p.id, "contents": p.contents} for p, s in hits]
                result.append(docs)
            self._reply(200, {"result": result})

        def _reply(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class RemoteRetriever:
    """Client for a /retrieve server (ours or Search-R1's)."""

    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url, self.timeout_s, self.passages = url.rstrip("/"), timeout_s, []

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[tuple[Passage, float]]]:
        import urllib.request

        req = urllib.request.Request(self.url + "/retrieve", json.dumps(
            {"queries": list(queries), "topk": k, "return_scores": True}).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            result = json.loads(resp.read())["result"]
        out = []
        for hits in result:
            row = []
            for h in hits:
                doc = h.get("document", h)
                title, _, text = doc["contents"].partition("\n")
                row.append((Passage(str(doc.get("id", "")), title.strip('"'), text), float(h.get("score", 0.0))))
            out.append(row)
        return out
