"""Task loaders: verl/SkyRL-style rows (parquet or JSON-lines) and the offline sets in shared/data.

Every loader returns task dicts with at least 'question', 'answer' (a string or a list of accepted answers)
and 'data_source'; the original row is kept under 'extra_info' where it has more. Bad files give one error
that names the file and line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MATH_FILES = {
    "aime24": "math/eval/aime.json", "amc23": "math/eval/amc23.jsonl", "amc": "math/eval/amc.json",
    "math500": "math/eval/math.json", "minerva": "math/eval/minerva.json",
    "olympiadbench": "math/eval/olympiad_bench.json", "aime-train": "math/train/aime.jsonl",
    "math-train": "math/train/math.jsonl",
}
QA_FILES = {
    "hotpotqa": "qa/eval/hotpotqa_500.jsonl", "2wiki": "qa/eval/2wiki_500.jsonl", "musique": "qa/eval/musique_500.jsonl",
    "bamboogle": "qa/eval/bamboogle.jsonl", "qa-train-1": "qa/train/stage_1.jsonl", "qa-train-2": "qa/train/stage_2.jsonl",
    "hotpotqa-dev-full": "qa/eval/hotpotqa_dev_full.json",
}


def data_root() -> Path:
    """TRACE_RL_DATA, else the workplace's shared/data beside (or inside) the checkout."""
    env = os.environ.get("TRACE_RL_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        for cand in (parent / "shared" / "data", parent.parent / "shared" / "data"):
            if cand.is_dir():
                return cand
    raise FileNotFoundError("no shared/data found; set TRACE_RL_DATA to the folder that holds math/ and qa/")


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a .jsonl, .json (a list) or .parquet file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such data file: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
        return pq.read_table(path).to_pylist()
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of rows")
        return rows
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
    return rows


def _answers(value) -> str | list[str]:
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        try:
            value = json.loads(value.replace("'", '"'))
        except json.JSONDecodeError:
            pass
    if isinstance(value, (list, tuple)):
        out = [str(v).strip() for v in value if str(v).strip()]
        return out[0] if len(out) == 1 else out
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def row_to_task(row: dict, source: str = "", index: int = 0) -> dict:
    """A verl/SkyRL row (prompt messages, reward_model.ground_truth) or a plain question/answer row -> task."""
    if not isinstance(row, dict):
        raise ValueError(f"row {index}: expected an object, got {type(row).__name__}")
    question = row.get("question") or row.get("problem")
    if question is None and isinstance(row.get("prompt"), list):
        users = [m.get("content", "") for m in row["prompt"] if isinstance(m, dict) and m.get("role") == "user"]
        question = users[-1] if users else None
    if question is None and isinstance(row.get("prompt"), str):
        question = row["prompt"]
    truth = None
    if isinstance(row.get("reward_model"), dict):
        truth = row["reward_model"].get("ground_truth")
    for key in ("answer", "answers", "golden_answers", "final_answer", "ground_truth"):
        if truth is None and row.get(key) is not None:
            truth = row[key]
    if question is None or truth is None:
        raise ValueError(f"row {index}: needs a question (question/problem/prompt) and an answer "
                         f"(answer/reward_model.ground_truth); has keys {sorted(row)}")
    if isinstance(truth, dict) and "target" in truth:  # Search-R1 style {"target": [...]}
        truth = truth["target"]
    return {"index": index, "question": str(question), "answer": _answers(truth),
            "data_source": row.get("data_source", source), "extra_info": row.get("extra_info", {})}


def load_tasks(path_or_name: str, limit: int | None = None) -> list[dict]:
    """A benchmark name from MATH_FILES / QA_FILES, or a path to rows."""
    table = {**MATH_FILES, **QA_FILES}
    if path_or_name in table:
        path, source = data_root() / table[path_or_name], path_or_name
    else:
        path, source = Path(path_or_name), Path(path_or_name).stem
        if not path.exists():
            raise FileNotFoundError(f"{path_or_name!r} is neither a known benchmark ({', '.join(table)}) nor a file")
    tasks, bad = [], []
    for i, row in enumerate(read_rows(path)):
        try:
            tasks.append(row_to_task(row, source, i))
        except ValueError as err:
            bad.append(str(err))
        if limit is not None and len(tasks) >= limit:
            break
    if bad:
        print(f"trace-rl: skipped {len(bad)} unusable rows in {path} (first: {bad[0]})", file=sys.stderr)
    if not tasks:
        raise ValueError(f"{path}: no usable rows")
    return tasks
