"""Task loaders: rows as verl, SkyRL and Search-R1 write them (parquet, JSON lines, JSON), and the offline sets in
shared/data.

Every loader returns task dicts with 'question', 'answer' (a string, or a list of accepted answers) and
'data_source'; 'system' when the row has a system message, and the row's 'extra_info' when it has one.

Trade-offs and limits:
- The question is the bare question, not the upstream prompt: upstream templates name their own tool syntax
  (`<search>`, `<tool_call>`, "####"), which contradicts this package's `Action: tool[...]` format. The bare
  question comes from a `question`/`problem` column, else `extra_info.question` when the prompt wraps it, else
  the last user message with a known upstream template removed (the templates are listed below with the
  script that writes each). A prompt in an unknown template is kept whole.
- An answer is a list of alternatives only when the row holds a real list (a JSON array, a parquet list
  column, Search-R1's `{"target": [...]}`), or a string that is a Python/JSON list of strings (what
  `str(list)` writes when a list column went through CSV). Any other string is one answer: MATH writes
  intervals and tuples such as `[-9, 9]` as strings, and they must not split into `-9` or `9`.
- Rows read with pandas hold numpy arrays and numpy scalars; they are turned into plain lists and numbers.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import sys
from pathlib import Path

from ..errors import ConfigError, MissingFileError
from ..safe_read import BOUNDS, TooLarge, check_regular, read_bytes, read_lines

MATH_FILES = {
    "aime24": "math/eval/aime.json",
    "amc23": "math/eval/amc23.jsonl",
    "amc": "math/eval/amc.json",
    "math500": "math/eval/math.json",
    "minerva": "math/eval/minerva.json",
    "olympiadbench": "math/eval/olympiad_bench.json",
    "aime-train": "math/train/aime.jsonl",
    "math-train": "math/train/math.jsonl",
}
QA_FILES = {
    "hotpotqa": "qa/eval/hotpotqa_500.jsonl",
    "2wiki": "qa/eval/2wiki_500.jsonl",
    "musique": "qa/eval/musique_500.jsonl",
    "bamboogle": "qa/eval/bamboogle.jsonl",
    "qa-train-1": "qa/train/stage_1.jsonl",
    "qa-train-2": "qa/train/stage_2.jsonl",
    "hotpotqa-dev-full": "qa/eval/hotpotqa_dev_full.json",
}

# Instructions that upstream preprocessing scripts append to the question.
TEMPLATE_SUFFIXES = (
    # verl examples/data_preprocess/gsm8k.py; SkyRL examples/train/gsm8k/gsm8k_dataset.py
    ' Let\'s think step by step and output the final answer after "####".',
    # verl examples/data_preprocess/gsm8k_multiturn_w_tool.py (and the tool_agent_loop / interaction variants)
    " Let's think step by step and output the final answer after `####`.",
    # verl examples/data_preprocess/math_dataset.py
    " Let's think step by step and output the final answer within \\boxed{}.",
)
# The instruction that Search-R1 (scripts/data_process/nq_search.py, qa_search_*_merge.py), verl
# (examples/data_preprocess/preprocess_search_r1_dataset.py) and SkyRL (examples/train/search/searchr1_dataset.py)
# put before the question; they differ in the tool tags and in "as your want" / "as you want".
SEARCH_R1_PREFIX = re.compile(r"\AAnswer the given question\. .*?<answer> Beijing </answer>\. Question: ", re.DOTALL)


def data_root() -> Path:
    """TRACE_RL_DATA, else the shared/data folder beside (or inside) the checkout."""
    env = os.environ.get("TRACE_RL_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        for cand in (parent / "shared" / "data", parent.parent / "shared" / "data"):
            if cand.is_dir():
                return cand
    raise MissingFileError(
        "no shared/data found; fetch it with `trace-rl fetch-data`, or set TRACE_RL_DATA to the folder that holds "
        "math/ and qa/"
    )


def default_data_dir() -> Path:
    """Where `trace-rl fetch-data` writes by default: TRACE_RL_DATA, else shared/data beside the checkout (the
    first place `data_root` looks)."""
    env = os.environ.get("TRACE_RL_DATA")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[3]
    if not (checkout / "pyproject.toml").is_file():
        raise ConfigError("out: give the folder to write the data to (and set TRACE_RL_DATA to it)")
    return checkout.parent / "shared" / "data"


def _json_lines(path: Path) -> list:
    rows = []
    for lineno, line in read_lines(path, "tasks"):  # outside the try: its TooLarge and BadFile stay one line
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            except RecursionError:
                raise ConfigError(f"{path}:{lineno}: nested too deeply to be a row") from None
    return rows


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a .jsonl, .json or .parquet file.

    A .json file may hold a list of rows, JSON lines (what `datasets.Dataset.to_json` writes), or pandas'
    default `to_json` layout ({column: {row: value}}).

    Bounds (safe_read.BOUNDS["tasks"]): a line of JSON lines 16 MiB, the file 4 GiB; a .json file is parsed whole
    up to 1 GiB, and a larger one is read as JSON lines. Past a bound: one line naming the file, the line and the
    bound. Parquet (read by pyarrow, or pandas without it) within 4 GiB on disk and, with pyarrow, within 4 GiB
    as its metadata declares the rows decompressed and as they are decoded, PARQUET_BATCH rows at a time (so
    the bound may be passed by one batch before it is refused); no bound on a single parquet row.
    """
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"no such data file: {path}")
    if path.suffix == ".parquet":
        return _read_parquet(path)
    try:
        if path.suffix != ".json" or path.stat().st_size > BOUNDS["tasks"].document:
            return _json_lines(path)
        text = read_bytes(path, BOUNDS["tasks"].document).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not UTF-8 text at byte {err.start} (rows are JSON lines, JSON or .parquet)"
        ) from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be rows") from None
    except json.JSONDecodeError as err:
        if err.msg != "Extra data":  # a broken document, not several documents
            raise ConfigError(f"{path}: not valid JSON ({err})") from None
        del text
        return _json_lines(path)
    if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
        index = list(next(iter(data.values())))
        return [{col: data[col].get(i) for col in data} for i in index]
    if isinstance(data, dict):  # one row on one line, the only row of a JSON-lines file
        return [data]
    if not isinstance(data, list):
        # a bad file, not a bad call: ValueError like every other unreadable file
        raise ConfigError(f"{path}: expected a list of rows, JSON lines, or {{column: {{row: value}}}}")  # noqa: TRY004
    return data


def _parquet_within_bound(path: Path, pq) -> None:
    """TooLarge for a parquet file over the task files' bound (BOUNDS["tasks"].file), in bytes on disk or, with
    pyarrow, in the bytes its row groups declare once decompressed (a small file can decode to far more), checked
    before any row is read; `_parquet_rows` then counts what it decodes. The bound is on the whole, not on each
    row. ConfigError for a path that is not a regular file or a footer that cannot be read."""
    bound = BOUNDS["tasks"].file
    try:
        check_regular(path)
        size = path.stat().st_size
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err})") from None
    if bound is not None and size > bound:
        raise TooLarge(f"{path}: {size:,} bytes, over the {bound:,}-byte bound on a task file")
    if pq is None or bound is None:
        return
    try:
        meta = pq.read_metadata(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a readable parquet file ({str(err).strip()[:120]})") from None
    decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if decoded > bound:
        raise TooLarge(
            f"{path}: {decoded:,} bytes of rows once decompressed (as its metadata declares), over the "
            f"{bound:,}-byte bound on a task file"
        )


PARQUET_BATCH = 64  # rows decoded at a time: what the bound may be passed by before a batch is counted


def _parquet_rows(path: Path, pq) -> list[dict]:
    """The rows, decoded PARQUET_BATCH at a time, counting the decoded bytes (a value parquet stores once in a
    dictionary counts once for each row that holds it): TooLarge past BOUNDS["tasks"].file."""
    bound, total, rows = BOUNDS["tasks"].file, 0, []
    for batch in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH):
        total += batch.nbytes
        if bound is not None and total > bound:
            raise TooLarge(
                f"{path}: over the {bound:,}-byte bound on a task file once decoded (by row {len(rows) + 1})"
            )
        rows += batch.to_pylist()
    return rows


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    _parquet_within_bound(path, pq)
    if pq is not None:
        try:
            return _parquet_rows(path, pq)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
            if isinstance(err, TooLarge):
                raise
            raise ConfigError(f"{path}: not a readable parquet file ({str(err).strip()[:120]})") from None
    try:
        import pandas as pd
    except ImportError:
        raise ConfigError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    return [_plain(r) for r in pd.read_parquet(path).to_dict("records")]


def _plain(value):
    """numpy arrays/scalars (rows read with pandas) -> lists/numbers; NaN (pandas' missing value) -> None."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":  # ndarray or numpy scalar
        return _plain(value.tolist())
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _string_list(text: str) -> list[str] | None:
    """A string that spells a list of strings ("['Paris', \"O'Neil\"]"), else None."""
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def _one_answer(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _answers(value) -> str | list[str]:
    if isinstance(value, dict) and "target" in value:  # Search-R1's {"target": [...]}
        value = value["target"]
    if isinstance(value, str):
        value = _string_list(value.strip()) or value
    if isinstance(value, (list, tuple)):
        out = [a for a in map(_one_answer, value) if a]
        return out[0] if len(out) == 1 else out
    return _one_answer(value)


def _unwrap(prompt: str, extra_question) -> str:
    """The bare question inside an upstream prompt."""
    if isinstance(extra_question, str) and extra_question.strip() and extra_question.strip() in prompt:
        return extra_question.strip()
    text = prompt
    match = SEARCH_R1_PREFIX.match(text)
    if match:
        text = text[match.end() :]
    for suffix in TEMPLATE_SUFFIXES:
        text = text.removesuffix(suffix)
    return text.strip()


def row_to_task(row: dict, source: str = "", index: int = 0) -> dict:
    """A verl/SkyRL/Search-R1 row, or a plain question/answer row, -> task.

    Answers come from reward_model.ground_truth (verl, Search-R1), reward_spec.ground_truth (SkyRL), or an
    answer/answers/golden_answers/final_answer/ground_truth column.
    """
    if not isinstance(row, dict):
        # ValueError: load_tasks skips unusable rows by catching it
        raise ValueError(f"row {index}: expected an object, got {type(row).__name__}")  # noqa: TRY004
    row = _plain(row)
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    messages = row.get("prompt") if isinstance(row.get("prompt"), list) else []
    messages = [m for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)]
    users = [m["content"] for m in messages if m.get("role") == "user"]
    systems = [m["content"] for m in messages if m.get("role") == "system"]
    question = row.get("question") or row.get("problem")
    question = str(question) if question is not None else None
    if not question or not question.strip():
        prompt = users[-1] if users else row.get("prompt") if isinstance(row.get("prompt"), str) else None
        question = _unwrap(prompt, extra.get("question")) if prompt else None
    truth = None
    for spec in ("reward_model", "reward_spec"):
        if truth is None and isinstance(row.get(spec), dict):
            truth = row[spec].get("ground_truth")
    for key in ("answer", "answers", "golden_answers", "final_answer", "ground_truth"):
        if truth is None and row.get(key) is not None:
            truth = row[key]
    if not question or truth is None:
        raise ValueError(
            f"row {index}: needs a question (question/problem/prompt) and an answer "
            f"(answer/reward_model.ground_truth/reward_spec.ground_truth); has keys {sorted(row)}"
        )
    answer = _answers(truth)
    if answer in ("", []):
        raise ValueError(f"row {index}: the answer is empty")
    task = {
        "index": index,
        "question": question.strip(),
        "answer": answer,
        "data_source": row.get("data_source") or source,
        "extra_info": extra,
    }
    if systems:
        task["system"] = systems[0]
    return task


def load_tasks(path_or_name: str, limit: int | None = None) -> list[dict]:
    """A benchmark name from MATH_FILES / QA_FILES, or a path to rows."""
    table = {**MATH_FILES, **QA_FILES}
    if path_or_name in table:
        path, source = data_root() / table[path_or_name], path_or_name
    else:
        path, source = Path(path_or_name), Path(path_or_name).stem
        if not path.exists():
            raise MissingFileError(f"{path_or_name!r} is neither a known benchmark ({', '.join(table)}) nor a file")
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
        raise ConfigError(f"{path}: no usable rows")
    return tasks
