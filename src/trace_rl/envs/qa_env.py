"""Multi-hop QA with a search tool: `search[query]` shows the top passages, `answer[text]` ends the episode.

Reward: exact match after the usual SQuAD normalisation (lower-case, no punctuation or articles, single
spaces) against any accepted alias; F1 is reported in info. Search results are truncated per passage so a
long corpus entry cannot flood the context; a query that matches nothing says so. A remote retriever is probed
when the env is built (`registry.get_env`: one that cannot be reached stops the run there, in one line); one
that fails later (after the client's own retries) gives an observation saying the search failed, and the
episode goes on.
"""

from __future__ import annotations

import collections
import re
import string

from .base import ToolEnv
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
