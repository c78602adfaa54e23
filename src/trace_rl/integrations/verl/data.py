"""The parquet rows examples/verl/run_trace_qwen3.sh reads (`TRAIN_FILES`, `VAL_FILES`), written from the
project's math data: `trace-rl verl-data out=DIR [train=math-train] [val=math500]`.

verl's RL format, one row per task: `prompt` (chat messages: a system prompt that asks for a \\boxed{} answer,
then the question), `data_source` (the benchmark or file), `reward_model` ({style: rule, ground_truth}: the
first accepted answer, as a string), `extra_info` ({index, answers: every accepted form}); the example's reward
(examples/verl/reward.py) grades the last \\boxed{} of a response against `answers`. `train` and `val` are
benchmark names of `envs.data` (fetched by `trace-rl fetch-data`) or paths to rows in any format `load_tasks`
reads, so a written file reads back as the same tasks. Needs pyarrow (the `envs` extra).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError, UserError

SYSTEM = (
    "Solve the problem. You may call the python tool to compute; it shows what the code prints. "
    "Put the final answer in \\boxed{}."
)


@dataclass
class VerlDataConfig:
    """Write verl's RL parquet (train.parquet, val.parquet) from the project's math data."""

    out: str = "data/verl"  # folder for train.parquet and val.parquet
    train: str = "math-train"  # a benchmark name (envs.data.MATH_FILES) or a file of rows
    val: str = "math500"  # the same, for validation
    train_limit: int = 0  # rows kept from train (0: all)
    val_limit: int = 0  # rows kept from val (0: all)

    def __post_init__(self):
        for name in ("train_limit", "val_limit"):
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: every row), got {getattr(self, name)}")
        if not self.out:
            raise ValueError("out must be a folder path, got an empty string")


def verl_row(task: dict, source: str, index: int) -> dict:
    """One task ({question, answer}: a string or a list of accepted forms) as a verl RL row."""
    answers = task["answer"] if isinstance(task["answer"], (list, tuple)) else [task["answer"]]
    answers = [str(a) for a in answers]
    return {
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}],
        "data_source": source,
        "reward_model": {"style": "rule", "ground_truth": answers[0]},
        "extra_info": {"index": index, "answers": answers},
    }


def write_rows(tasks: list[dict], source: str, path: Path) -> int:
    """The tasks as verl rows in one parquet file; returns the row count."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("out: writing parquet needs pyarrow (pip install pyarrow)") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([verl_row(t, source, i) for i, t in enumerate(tasks)]), path)
    return len(tasks)


def write_verl_data(cfg: VerlDataConfig) -> dict[str, int]:
    """train.parquet and val.parquet under cfg.out; returns {file: rows}."""
    from ...envs.data import load_tasks

    out, counts = Path(cfg.out), {}
    for split, name, limit in (("train", cfg.train, cfg.train_limit), ("val", cfg.val, cfg.val_limit)):
        try:
            tasks = load_tasks(name, limit or None)
        except UserError as err:
            raise ConfigError(f"{split}: {err}") from None
        path = out / f"{split}.parquet"
        counts[str(path)] = write_rows(tasks, Path(name).stem, path)
    return counts
