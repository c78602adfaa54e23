"""Multi-hop QA with a search tool: `search[query]` shows the top passages, `answer[text]` ends the episode.

Reward: exact match after the usual SQuAD normalisation (lower-case, no punctuation or articles, single
spaces) against any accepted alias; F1 is reported in info. Search results are truncated per passage so a
long corpus entry cannot flood the context.
"""

from __future__ import annotations

import collections
import copy
import re
import string

from .base import parse_action
from .retrieval import Retriever

TOOLS = ("search", "answer")
SYSTEM = (
    "Answer the question. Search the corpus as often as you need.\n"
    "Tools: search[query] returns passages; answer[text] submits a short answer.\n"
    "Example:\nWhere was the director of Jaws born?\n"
    "Action: search[director of Jaws]\nObservation: \"Jaws (film)\" Jaws is a 1975 film directed by Steven Spielberg.\n"
    "Action: search[Steven Spielberg birthplace]\nObservation: \"Steven Spielberg\" Spielberg was born in Cincinnati.\n"
    "Action: answer[Cincinnati]"
)


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
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


class QAEnv:
    def __init__(self, retriever: Retriever, top_k: int = 3, max_turns: int = 6, max_passage_chars: int = 300):
        self.retriever, self.top_k, self.max_turns, self.max_chars = retriever, top_k, max_turns, max_passage_chars
        self.task: dict | None = None
        self.turn = 0
        self.done = True

    def system_prompt(self) -> str:
        return SYSTEM

    def reset(self, task: dict) -> str:
        self.task, self.turn, self.done = task, 0, False
        return task["question"]

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.done or self.task is None:
            raise RuntimeError("step() after the episode ended; call reset() first")
        self.turn += 1
        parsed = parse_action(action, TOOLS)
        reward, info = 0.0, {"valid_action": parsed.tool is not None}
        if parsed.tool is None:
            obs = parsed.error
        elif parsed.tool == "search":
            if not parsed.argument.strip():
                obs, info["valid_action"] = "Error: empty query. Write: Action: search[words to look for]", False
            else:
                hits = self.retriever.search([parsed.argument], self.top_k)[0]
                obs = "\n".join(f'"{p.title}" {p.text[: self.max_chars]}' for p, _ in hits)
        else:
            self.done = True
            reward = exact_match(parsed.argument, self.task["answer"])
            info["f1"] = f1_score(parsed.argument, self.task["answer"])
            obs = "Submitted."
        if not self.done and self.turn >= self.max_turns:
            self.done, obs = True, obs + "\nTurn limit reached."
        return obs, reward, self.done, info

    def fork(self) -> "QAEnv":
        return copy.copy(self)  # the retriever is shared and read-only
