"""Multi-hop QA with a search tool: `search[query]` shows the top passages, `answer[text]` ends the episode.

Reward: exact match after the usual SQuAD normalisation (lower-case, no punctuation or articles, single
spaces) against any accepted alias; F1 is reported in info. Search results are truncated per passage so a
long corpus entry cannot flood the context; a query that matches nothing says so. A remote retriever is probed
when the env is built (`qa_spec`: one that cannot be reached stops the run there, in one line); one
that fails later (after the client's own retries) gives an observation saying the search failed, and the
episode goes on.

The plug-in `QA` (the settings group `env.qa.*`) searches a passage corpus file (`corpus`, BM25), a running
retriever (`retriever_url`), or by default the offline HotpotQA and MuSiQue corpora, which come with their own
questions (training and benchmarks); with a corpus or a retriever, the benchmarks are the four usual QA sets and
training draws from `qa-train-1` (`envs.data`).
"""

from __future__ import annotations

import collections
import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .base import ToolEnv
from .data import data_root, load_tasks
from .registry import EnvPlugin, EnvSpec, sample_rows
from .retrieval import Retriever

TOOLS = ("search", "answer")
SYSTEM = (
    "Answer the question. Search the corpus as often as you need.\n"
    "Tools: search[query] returns passages; answer[text] submits a short answer.\n"
    "Example:\nWhere was the director of Jaws born?\n"
    'Action: search[director of Jaws]\nObservation: "Jaws (film)" Jaws is a 1975 film directed by Steven Spielberg.\n'
    'Action: search[Steven Spielberg birthplace]\nObservation: "Steven Spielberg" Spielberg was born in Cincinnati.\n'
    "Action: answer[Cincinnati]"
)


NO_HITS = "No passage matches this query. Try other words, or answer."
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = s.translate(_NO_PUNCTUATION)  # linear; a set built per character made a 1 MB answer take 3 s
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _aliases(truth) -> list[str]:
    return [str(t) for t in truth] if isinstance(truth, (list, tuple)) else [str(truth)]


def exact_match(prediction: str, truth) -> float:
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(t) for t in _aliases(truth)))


def f1_score(prediction: str, truth) -> float:
    best = 0.0
    pred = normalize_answer(prediction).split()
    for t in _aliases(truth):
        gold = normalize_answer(t).split()
        common = collections.Counter(pred) & collections.Counter(gold)
        same = sum(common.values())
        if same:
            prec, rec = same / len(pred), same / len(gold)
            best = max(best, 2 * prec * rec / (prec + rec))
    return best


class QAEnv(ToolEnv):
    tools, system = TOOLS, SYSTEM

    def __init__(self, retriever: Retriever, top_k: int = 3, max_turns: int = 6, max_passage_chars: int = 300):
        super().__init__(max_turns)
        self.retriever, self.top_k, self.max_chars = retriever, top_k, max_passage_chars  # retriever: shared, read-only

    def act(self, parsed) -> tuple[str, float, dict]:
        if parsed.tool == "answer":
            self.done = True
            truth = self.task["answer"]
            return (
                "Submitted.",
                exact_match(parsed.argument, truth),
                {"valid_action": True, "f1": f1_score(parsed.argument, truth)},
            )
        if not parsed.argument.strip():
            return "Error: empty query. Write: Action: search[words to look for]", 0.0, {"valid_action": False}
        try:
            hits = self.retriever.search([parsed.argument], self.top_k)[0]
        except Exception as err:  # noqa: BLE001  a remote retriever that is down must not end the run
            msg = f"Error: the search failed ({type(err).__name__}: {str(err)[:200]}). Try again later or answer."
            return msg, 0.0, {"valid_action": True, "search_error": type(err).__name__}
        if not hits:  # an empty observation would leave the agent guessing whether the search ran
            return NO_HITS, 0.0, {"valid_action": True, "no_hits": True}
        return "\n".join(f'"{p.title}" {p.text[: self.max_chars]}' for p, _ in hits), 0.0, {"valid_action": True}


BENCHMARKS = ("hotpotqa", "2wiki", "musique", "bamboogle")


@dataclass
class QASettings:
    """Where the QA env searches (default: the offline corpora, with their own questions)."""

    corpus: str = ""  # a passage corpus file (default: the offline corpora with their own questions)
    retriever_url: str = ""  # a running /retrieve server (Search-R1 compatible)

    def __post_init__(self):
        if self.retriever_url and not self.retriever_url.startswith(("http://", "https://")):
            raise ValueError(f"retriever_url must be an http(s) URL of a /retrieve server, got {self.retriever_url!r}")
        if self.corpus and not Path(self.corpus).is_file():
            raise ValueError(f"corpus: no file {self.corpus}")


def _corpus_questions(name: str, limit: int | None) -> list[dict]:
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
        raise ConfigError(f"env.qa.retriever_url: {err}") from None
    return RemoteRetriever(url)


def qa_spec(settings: QASettings) -> EnvSpec:
    from .retrieval import BM25Retriever, load_corpus

    benches = {b: (lambda n, b=b: load_tasks(b, n)) for b in BENCHMARKS}
    train = sample_rows(lambda: load_tasks("qa-train-1"))
    if settings.retriever_url:
        retriever = _reachable(settings.retriever_url)
    elif settings.corpus:
        try:
            retriever = BM25Retriever(load_corpus(settings.corpus))
        except (TypeError, KeyError, AttributeError, IndexError, ValueError) as err:
            raise ConfigError(
                f"env.qa.corpus: {settings.corpus} is not a passage corpus ({type(err).__name__}: {err})"
            ) from None
    else:  # the offline corpora come with their own questions
        root = data_root() / "qa" / "corpus"
        passages = load_corpus(root / "hotpotqa_train_corpus.json") + load_corpus(root / "musique_train_corpus.json")
        retriever = BM25Retriever(passages)
        benches = {f"{b}-corpus": (lambda n, b=b: _corpus_questions(b, n)) for b in ("hotpotqa", "musique")}
        train = sample_rows(lambda: _corpus_questions("hotpotqa", None) + _corpus_questions("musique", None))
    return EnvSpec(lambda: QAEnv(retriever), benches, train, max_new_tokens=256)


QA = EnvPlugin("qa", qa_spec, QASettings)
