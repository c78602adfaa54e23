"""Data for the math and QA environments in tests: a tiny data folder the tests write themselves (so they run on a
fresh clone, without shared/data), and a skip with the way to get the real one for the tests that read it."""

import json
from pathlib import Path

import pytest

MATH = [{"problem": f"What is {a} + {b}?", "answer": str(a + b), "difficulty": 1.0} for a, b in ((1, 2), (3, 4))]
HOTPOT_CORPUS = {
    "Alpha Town": ["Alpha Town is a town in Beta County.", " It was founded in 1901."],
    "Beta County": ["Beta County is a county whose seat is Gamma City."],
}
HOTPOT = [
    {
        "_id": "h1",
        "question": "Which county is Alpha Town in?",
        "answer": "Beta County",
        "supporting_facts": [["Alpha Town", 0]],
        "context": [[t, s] for t, s in HOTPOT_CORPUS.items()],
        "type": "bridge",
        "level": "easy",
    }
]
MUSIQUE_CORPUS = [{"title": "Delta River", "text": "The Delta River flows into the Epsilon Sea."}]
MUSIQUE = [
    {
        "id": "m1",
        "question": "Which sea does the Delta River flow into?",
        "answer": "Epsilon Sea",
        "answer_aliases": ["the Epsilon Sea"],
        "paragraphs": [
            {"idx": 0, "title": "Delta River", "paragraph_text": MUSIQUE_CORPUS[0]["text"], "is_supporting": True}
        ],
        "answerable": True,
    }
]


def write_tiny_data(root: Path) -> Path:
    """A data folder laid out as shared/data, with the files the math and QA environments read by default."""
    files = {
        "math/eval/aime.json": json.dumps(MATH),
        "math/train/math.jsonl": "".join(json.dumps(r) + "\n" for r in MATH),
        "qa/corpus/hotpotqa_train.json": json.dumps(HOTPOT),
        "qa/corpus/hotpotqa_train_corpus.json": json.dumps(HOTPOT_CORPUS),
        "qa/corpus/musique_train.json": json.dumps(MUSIQUE),
        "qa/corpus/musique_train_corpus.json": json.dumps(MUSIQUE_CORPUS),
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def shared_data_or_skip(*needed: str) -> Path:
    """The real data folder, or a skip that says how to get it, when it (or a file of `needed`) is not here."""
    from trace_rl.envs.data import data_root
    from trace_rl.errors import MissingFileError

    try:
        root = data_root()
    except MissingFileError:
        pytest.skip("shared/data is not here: `trace-rl fetch-data` gets it (or set TRACE_RL_DATA)")
    missing = [n for n in needed if not (root / n).is_file()]
    if missing:
        pytest.skip(f"{root} lacks {missing[0]}: `trace-rl fetch-data` gets it")
    return root
