"""lab/scripts/start_contrast.py on a hand-written eval folder: shares by the calculator's groups, and the refusal of a
folder that is not an eval's."""

import importlib.util
import json
from pathlib import Path

import pytest

from trace_rl.envs.registry import get_env

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "scripts" / "start_contrast.py"
_spec = importlib.util.spec_from_file_location("start_contrast", SCRIPT)
start_contrast = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(start_contrast)

CONFIG = """eval_samples: 4
env:
  name: calculator
  calculator:
    preset: train
    chain_steps: []
    digits: []
"""


def _eval_dir(path: Path, successes: list[int]) -> Path:
    """An eval folder over the first len(successes) calculator tasks, task i solved by successes[i] of 4 samples."""
    path.mkdir()
    (path / "config.yaml").write_text(CONFIG)
    rows = [
        {"benchmark": "calculator", "index": i, "sample": j, "score": float(j < k)}
        for i, k in enumerate(successes)
        for j in range(4)
    ]
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_shares_by_group_follow_the_samples_of_each_task(tmp_path):
    successes = [0, 4, 2, 1, 4, 0, 3, 0, 4, 2, 0, 1]
    run = _eval_dir(tmp_path / "ws0", successes)
    groups, samples = start_contrast.outcomes(run)
    assert samples == 4
    tasks = get_env("calculator", preset="train").benchmarks["calculator"](len(successes))
    expected: dict[str, list[tuple[int, int]]] = {}
    for task, k in zip(tasks, successes):
        expected.setdefault(f"steps={task['steps']} digits={task['digits']}", []).append((k, 4))
    assert groups == expected and len(expected) > 1  # more than one group, else the grouping shows nothing
    overall = start_contrast.shares([x for rows in groups.values() for x in rows])
    assert overall == {"tasks": 12, "accuracy": sum(successes) / 48, "mixed": 5 / 12, "always": 3 / 12, "never": 4 / 12}
    text = start_contrast.table([run])
    assert "| **all** | 12, 0.44, 0.42, 0.25, 0.33 |" in text


def test_a_folder_without_samples_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="not a `trace-rl eval out=...` folder"):
        start_contrast.main([str(tmp_path / "empty")])
