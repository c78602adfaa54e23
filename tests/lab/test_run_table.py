"""lab/scripts/run_table.py on hand-written metrics files: the figures of each run and the refusal of a missing dir."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "scripts" / "run_table.py"
_spec = importlib.util.spec_from_file_location("run_table", SCRIPT)
run_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_table)


def _write(path: Path, records: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps({"method": "grpo", **r}) + "\n" for r in records))
    return path / "metrics.jsonl"


def test_a_run_row_reads_evaluations_update_sizes_and_how_often_the_bound_acted(tmp_path):
    metrics = _write(
        tmp_path / "study" / "grpo" / "seed10",
        [
            {"step": 0, "eval/accuracy_before": 0.5},
            {
                "step": 1,
                "train/update_kl": 0.01,
                "train/update_kl_unbounded": 0.04,
                "train/update_scale": 0.5,
                "train/grad_norm": 2.0,
            },
            {
                "step": 2,
                "train/update_kl": 0.002,
                "train/update_kl_unbounded": 0.002,
                "train/update_scale": 1.0,
                "train/grad_norm": 1.0,
                "eval/accuracy": 0.45,
            },
            {
                "step": 3,
                "train/update_kl": 0.008,
                "train/update_kl_unbounded": 0.02,
                "train/update_scale": 0.7,
                "train/grad_norm": 3.0,
                "eval/accuracy": 0.6,
            },
        ],
    )
    row = run_table.run_row(metrics)
    assert row["evals"] == [0.5, 0.45, 0.6]
    assert row["gain"] == pytest.approx(10.0) and row["lowest_below_start"] == pytest.approx(-5.0)
    assert row["max_update_kl"] == 0.01 and row["max_unbounded_kl"] == 0.04
    assert row["bound_share"] == pytest.approx(2 / 3) and row["mean_kept"] == pytest.approx(0.6)
    assert row["max_grad_norm"] == 3.0
    text = run_table.table([tmp_path / "study"])
    assert "| study/grpo/seed10 | 0.500 → 0.450 → 0.600 | +10.0 | -5.0 | 0.0100 | 0.0400 | 67% | 0.60 | 3.00 |" in text


def test_runs_from_before_the_bound_report_their_update_kl_as_unbounded(tmp_path):
    metrics = _write(tmp_path / "old" / "trace" / "ws2-seed100", [{"step": 1, "train/update_kl": 0.03}])
    row = run_table.run_row(metrics)
    assert row["max_unbounded_kl"] == 0.03 and row["bound_share"] == 0.0 and row["mean_kept"] == 1.0


def test_a_missing_directory_is_one_line(tmp_path, capsys):
    assert run_table.main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().out.strip() == f"run_table: not a directory: {tmp_path / 'nowhere'}"
