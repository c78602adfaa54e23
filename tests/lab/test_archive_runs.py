"""lab/scripts/archive_runs.sh: a study's finished runs saved without checkpoints, restored, and nothing else kept."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "scripts" / "archive_runs.sh"
pytestmark = pytest.mark.skipif(shutil.which("tar") is None, reason="needs tar")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)


def test_finished_runs_round_trip_without_checkpoints_and_unfinished_ones_are_left(tmp_path):
    study = tmp_path / "runs"
    for method, pair, finished in (
        ("grpo", "seed100", True),
        ("trace", "ws2-seed100", True),
        ("trace", "seed101", False),
    ):
        run = study / method / pair
        (run / "global_step_40").mkdir(parents=True)
        (run / "global_step_40" / "model.safetensors").write_bytes(b"weights")
        (run / "metrics.jsonl").write_text(json.dumps({"method": method, "step": 0}) + "\n")
        (run / "run_settings.json").write_text("{}")
        if finished:
            (run / "train_summary.json").write_text(json.dumps({"steps": 40}))
    (study / "before_ws2-seed100.json").write_text('{"accuracy": 0.5}')
    saved = _run("save", str(study), str(tmp_path / "archive"))
    assert saved.returncode == 0 and "2 new run archive(s)" in saved.stdout
    assert sorted(p.name for p in (tmp_path / "archive").iterdir()) == [
        "grpo--seed100.tar.gz",
        "starts.tar.gz",
        "trace--ws2-seed100.tar.gz",
    ]
    assert "0 new run archive(s)" in _run("save", str(study), str(tmp_path / "archive")).stdout  # written once
    restored = _run("restore", str(tmp_path / "archive"), str(tmp_path / "again"))
    assert restored.returncode == 0 and "restored 2 run(s)" in restored.stdout
    files = sorted(str(p.relative_to(tmp_path / "again")) for p in (tmp_path / "again").rglob("*") if p.is_file())
    assert files == [
        "before_ws2-seed100.json",
        "grpo/seed100/metrics.jsonl",
        "grpo/seed100/run_settings.json",
        "grpo/seed100/train_summary.json",
        "trace/ws2-seed100/metrics.jsonl",
        "trace/ws2-seed100/run_settings.json",
        "trace/ws2-seed100/train_summary.json",
    ]


def test_bad_arguments_are_one_line(tmp_path):
    missing = _run("save", str(tmp_path / "nowhere"), str(tmp_path / "a"))
    assert (
        missing.returncode == 2 and missing.stderr.strip() == f"archive_runs: not a directory: {tmp_path / 'nowhere'}"
    )
    assert _run("move", str(tmp_path), str(tmp_path)).returncode == 2
    assert _run("save").stderr.startswith("usage:")
