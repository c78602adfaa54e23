"""bench/first_run.py's checks of a finished run, on a real one-step CPU run of the tiny random model (HF backend,
policy.device=auto) and on copies of it with one figure spoiled each, so every check can fail."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.cli import main  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "first_run.py"
_spec = importlib.util.spec_from_file_location("first_run", SCRIPT)
first_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(first_run)  # runs nothing: main() is behind __name__ == "__main__"

SMALL = [
    "budget.prompts=2",
    "budget.rollouts_per_prompt=2",
    "budget.pool_factor=2",
    "budget.max_per_prompt=2",
    "policy.max_new_tokens=12",
    "eval_tasks=2",
    "steps=1",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("first") / "run"
    args = first_run.train_args("random-tiny", "hf", "float32", str(out))
    args = [a for a in args if not a.startswith(("budget.prompts=", "eval_tasks=", "logger=", "steps="))] + SMALL
    assert main([*args, "logger=[jsonl]"]) == 0
    return out


def spoiled(run: Path, tmp_path: Path, **changes) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    recs = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    recs[0].update(changes)
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return copy


def test_a_cpu_run_passes_every_check(run):
    checks = first_run.check_run(run, "float32", steps=1)
    assert all(ok for ok, _ in checks), checks
    assert len(checks) == 6


@pytest.mark.parametrize(
    "changes, failing",
    [
        ({"train/approx_kl": 0.01}, "k3 KL"),  # a sampler in another dtype than the update
        ({"train/clip_frac": 0.05}, "clip_frac"),
        ({"train/policy_tokens": 0.0}, "policy tokens"),
    ],
)
def test_a_spoiled_figure_fails_its_check(run, tmp_path, changes, failing):
    checks = first_run.check_run(spoiled(run, tmp_path, **changes), "float32", steps=1)
    assert [what for ok, what in checks if not ok] == [next(w for _, w in checks if failing in w)]


def test_a_missing_step_and_another_device_fail(run, tmp_path, monkeypatch):
    assert not all(ok for ok, _ in first_run.check_run(run, "float32", steps=2))
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the run recorded cpu: not what auto gives here
    assert [ok for ok, what in first_run.check_run(run, "float32", steps=1) if "policy.device" in what] == [False]
