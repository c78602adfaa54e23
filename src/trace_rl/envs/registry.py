"""Environments by name: a fresh environment per rollout, training tasks for `rollout` and `train`, the
default benchmarks that `trace-rl eval env=NAME` runs, the held-out tasks that training evaluates on, how a
report groups tasks, and the tokens per turn a real model needs there. What is specific to one environment
lives here, so the commands that use a spec never name an environment."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from ..errors import ConfigError
from .calculator import RL_MIX as CALCULATOR_MIX
from .data import data_root, load_tasks

ENVS = ("calculator", "math", "qa", "bfcl")


@dataclass
class EnvSpec:
    make: Callable[[], object]  # a fresh environment per rollout
    benchmarks: dict[str, Callable[[int | None], list[dict]]]  # name -> loader(limit)
    train: Callable[[int, int], list[dict]]  # (count, seed) -> training prompts, drawn with replacement if few
    max_new_tokens: int = 256  # tokens per turn a model needs in this env (reasoning plus one action)
    # (count, seed) -> held-out tasks for evaluation during training; None: the first benchmark's first count
    draw_held_out: Callable[[int, int], list[dict]] | None = None
    group: Callable[[dict], str] | None = None  # a task's difficulty label, for reports by difficulty

    def held_out(self, count: int, seed: int) -> list[dict]:
        """`count` held-out tasks (a fresh seeded draw where the env generates tasks, else a fixed benchmark)."""
        if self.draw_held_out is not None:
            return self.draw_held_out(count, seed)
        return next(iter(self.benchmarks.values()))(count)


def _sample(load: Callable[[], list[dict]]) -> Callable[[int, int], list[dict]]:
    """(count, seed) -> `count` rows of `load()` in a seeded order, reindexed so each prompt id is unique."""

    def draw(count: int, seed: int) -> list[dict]:
        rows = load()
        if not rows:
            raise ValueError("the training set is empty")
        rng = np.random.default_rng(seed)
        idx = np.concatenate([rng.permutation(len(rows)) for _ in range(-(-count // len(rows)))])[:count]
        return [{**rows[i], "index": j} for j, i in enumerate(idx)]

    return draw


def _qa_corpus_questions(name: str, limit: int | None) -> list[dict]:
    rows = json.loads((data_root() / "qa" / "corpus" / f"{name}_train.json").read_text())[:limit]
    out = []
    for i, r in enumerate(rows):
        if name == "hotpotqa":
            sup = sorted({t for t, _ in r["supporting_facts"]})
        else:
            sup = sorted({p["title"] for p in r["paragraphs"] if p["is_supporting"]})
        out.append(
            {
                "index": i,
                "question": r["question"],
                "answer": [r["answer"], *r.get("answer_aliases", [])],
                "supporting_titles": sup,
                "data_source": f"{name}_corpus",
            }
        )
    return out


def _reachable(url: str):
    """A RemoteRetriever for `url`, once a probe query got an answer: a dead or unreachable retriever stops the
    run here, before any work, in one line (a run against it would score 0.000 with exit status 0)."""
    from .retrieval_server import RemoteRetriever, RetrieverError

    try:
        RemoteRetriever(url, retries=1, backoff_s=0.5).search(["retriever probe"], 1)
    except (ValueError, RetrieverError) as err:  # ValueError: a URL that is not http://host:port[/path]
        raise ConfigError(f"env.retriever_url: {err}") from None
    return RemoteRetriever(url)


def get_env(
    name: str,
    corpus: str | None = None,
    retriever_url: str | None = None,
    calculator_mix: dict | None = None,
    sandbox: str = "strict",
) -> EnvSpec:
    """The spec of env `name`; `sandbox` is where the math env runs model code (`envs.sandbox` modes)."""
    if name == "calculator":
        from .calculator import CalculatorEnv, make_tasks

        mix = calculator_mix or CALCULATOR_MIX
        return EnvSpec(
            CalculatorEnv,
            {"calculator": lambda n: make_tasks(n or 256, seed=10_000, **mix)},
            lambda count, seed: make_tasks(count, seed=seed, **mix),
            max_new_tokens=48,
            draw_held_out=lambda count, seed: make_tasks(count, seed=seed, **mix),
            group=lambda task: f"steps={task['steps']} digits={task['digits']}",
        )
    if name == "math":
        from .math_env import MathEnv

        benches = ("aime24", "amc23", "math500", "minerva", "olympiadbench")
        return EnvSpec(
            partial(MathEnv, sandbox=sandbox),
            {b: (lambda n, b=b: load_tasks(b, n)) for b in benches},
            _sample(lambda: load_tasks("math-train")),
            max_new_tokens=512,
        )
    if name == "qa":
        from .qa_env import QAEnv
        from .retrieval import BM25Retriever, load_corpus

        if retriever_url:
            retriever = _reachable(retriever_url)
            benches = {b: (lambda n, b=b: load_tasks(b, n)) for b in ("hotpotqa", "2wiki", "musique", "bamboogle")}
        elif corpus:
            retriever = BM25Retriever(load_corpus(corpus))
            benches = {b: (lambda n, b=b: load_tasks(b, n)) for b in ("hotpotqa", "2wiki", "musique", "bamboogle")}
        else:  # the offline corpora come with their own questions
            root = data_root() / "qa" / "corpus"
            passages = load_corpus(root / "hotpotqa_train_corpus.json") + load_corpus(
                root / "musique_train_corpus.json"
            )
            retriever = BM25Retriever(passages)
            benches = {f"{b}-corpus": (lambda n, b=b: _qa_corpus_questions(b, n)) for b in ("hotpotqa", "musique")}
        train = _sample(lambda: load_tasks("qa-train-1"))
        if not (retriever_url or corpus):
            train = _sample(lambda: _qa_corpus_questions("hotpotqa", None) + _qa_corpus_questions("musique", None))
        return EnvSpec(lambda: QAEnv(retriever), benches, train, max_new_tokens=256)
    if name == "bfcl":
        from .bfcl_env import CATEGORIES, BFCLEnv, load_bfcl

        # BFCL has no training split: training draws from the base category, so evaluate on the others
        return EnvSpec(
            BFCLEnv,
            {c: (lambda n, c=c: load_bfcl(c, n)) for c in CATEGORIES},
            _sample(lambda: load_bfcl("multi_turn_base")),
            max_new_tokens=256,
        )
    raise ValueError(f"env: unknown {name!r}; choose from {', '.join(ENVS)}")
