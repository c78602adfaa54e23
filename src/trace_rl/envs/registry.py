"""Environments by name, with their default benchmarks: what `trace-rl eval --env NAME` runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from .data import data_root, load_tasks


@dataclass
class EnvSpec:
    make: Callable[[], object]  # a fresh environment per rollout
    benchmarks: dict[str, Callable[[int | None], list[dict]]]  # name -> loader(limit)


def _qa_corpus_questions(name: str, limit: int | None) -> list[dict]:
    rows = json.loads((data_root() / "qa" / "corpus" / f"{name}_train.json").read_text())[:limit]
    out = []
    for i, r in enumerate(rows):
        if name == "hotpotqa":
            sup = sorted({t for t, _ in r["supporting_facts"]})
        else:
            sup = sorted({p["title"] for p in r["paragraphs"] if p["is_supporting"]})
        out.append({"index": i, "question": r["question"], "answer": [r["answer"], *r.get("answer_aliases", [])],
                    "supporting_titles": sup, "data_source": f"{name}_corpus"})
    return out


def get_env(name: str, corpus: str | None = None, retriever_url: str | None = None) -> EnvSpec:
    if name == "calculator":
        from .calculator import CalculatorEnv, make_tasks

        return EnvSpec(CalculatorEnv, {"calculator": lambda n: make_tasks(n or 256, seed=10_000)})
    if name == "math":
        from .math_env import MathEnv

        benches = ("aime24", "amc23", "math500", "minerva", "olympiadbench")
        return EnvSpec(MathEnv, {b: (lambda n, b=b: load_tasks(b, n)) for b in benches})
    if name == "qa":
        from .qa_env import QAEnv
        from .retrieval import BM25Retriever, RemoteRetriever, load_corpus

        if retriever_url:
            retriever = RemoteRetriever(retriever_url)
            benches = {b: (lambda n, b=b: load_tasks(b, n)) for b in ("hotpotqa", "2wiki", "musique", "bamboogle")}
        elif corpus:
            retriever = BM25Retriever(load_corpus(corpus))
            benches = {b: (lambda n, b=b: load_tasks(b, n)) for b in ("hotpotqa", "2wiki", "musique", "bamboogle")}
        else:  # the offline corpora come with their own questions
            root = data_root() / "qa" / "corpus"
            passages = load_corpus(root / "hotpotqa_train_corpus.json") + load_corpus(root / "musique_train_corpus.json")
            retriever = BM25Retriever(passages)
            benches = {f"{b}-corpus": (lambda n, b=b: _qa_corpus_questions(b, n)) for b in ("hotpotqa", "musique")}
        return EnvSpec(lambda: QAEnv(retriever), benches)
    if name == "bfcl":
        from .bfcl_env import CATEGORIES, BFCLEnv, load_bfcl

        return EnvSpec(BFCLEnv, {c: (lambda n, c=c: load_bfcl(c, n)) for c in CATEGORIES})
    raise ValueError(f"unknown env {name!r}; choose from calculator, math, qa, bfcl")
