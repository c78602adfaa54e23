"""What the project promises about checkpoints: a damaged one is never loaded; resuming falls back to the newest
intact one with one line naming the bad file; checkpoints from before the manifest are loaded with a warning;
a run that already reached its steps says so and exits 0. Tiny random model, no training except in the one
end-to-end resume."""

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.cli import main  # noqa: E402
from trace_rl.errors import UserError  # noqa: E402
from trace_rl.lm.models import load_model  # noqa: E402
from trace_rl.train.checkpoint import (  # noqa: E402
    MANIFEST,
    checkpoints,
    read_checkpoint,
    restore,
    resume_point,
    save_checkpoint,
    verify_checkpoint,
)


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_model("random-tiny")
    return model, tok


def write_run(root: Path, tiny, steps=(2, 4)) -> Path:
    """A run directory with one checkpoint per step, each with distinct weights and trainer state."""
    model, tok = tiny
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in steps:
        with torch.no_grad():
            next(model.parameters()).fill_(float(step))
        state = {"step": step, "accuracy_before": 0.25, "rollouts": 10 * step}
        save_checkpoint(root, step, model, tok, optimizer, {"predictor": step}, state, "steps: 4\n", keep_last=5)
    return root


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage(path: Path) -> None:
    path.write_bytes(b"\x80\x04garbage, not a pickle")


def truncate_json(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:18] + b"\n\x01")  # the audit's "Invalid control character" file


DAMAGE = {
    "truncated model.safetensors": ("model.safetensors", truncate),
    "garbage predictor.pkl": ("predictor.pkl", garbage),
    "truncated trainer_state.json": ("trainer_state.json", truncate_json),
    "missing optimizer.pt": ("optimizer.pt", lambda p: p.unlink()),
}


@pytest.mark.parametrize("case", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_intact_one_with_one_line_naming_the_file(tmp_path, tiny, case):
    run = write_run(tmp_path / "run", tiny)
    name, damage = DAMAGE[case]
    damage(run / "global_step_4" / name)
    with pytest.raises(Exception, match=name):
        verify_checkpoint(run / "global_step_4")
    lines = []
    ckpt = resume_point(run, lines.append)
    assert ckpt.step == 2 and ckpt.state["step"] == 2 and ckpt.predictor == {"predictor": 2} and ckpt.verified
    assert len(lines) == 1 and "global_step_4" in lines[0] and name in lines[0] and "\n" not in lines[0]
    # the damaged one is kept for a look, but no longer counts as a checkpoint (keep_last cannot prune for it)
    assert [s for s, _ in checkpoints(run)] == [2] and (run / "global_step_4.damaged" / name).parent.is_dir()


UNREADABLE = ["truncated model.safetensors", "garbage predictor.pkl", "truncated trainer_state.json"]


@pytest.mark.parametrize("case", UNREADABLE)
def test_checkpoints_without_a_manifest_load_with_a_warning_and_still_fall_back_when_unreadable(tmp_path, tiny, case):
    run = write_run(tmp_path / "run", tiny)
    for step in (2, 4):
        (run / f"global_step_{step}" / MANIFEST).unlink()  # as written before the manifest existed
    lines = []
    assert resume_point(run, lines.append).step == 4 and len(lines) == 1 and "no manifest.json" in lines[0]
    name, damage = DAMAGE[case]
    damage(run / "global_step_4" / name)
    lines = []
    ckpt = resume_point(run, lines.append)
    assert ckpt.step == 2 and not ckpt.verified
    assert len(lines) == 2 and name in lines[0] and "global_step_2" in lines[1]


def test_an_altered_file_that_still_parses_is_caught_by_its_hash(tmp_path, tiny):
    run = write_run(tmp_path / "run", tiny)
    state = run / "global_step_4" / "trainer_state.json"
    state.write_text(state.read_text().replace('"step": 4', '"step": 5'))  # same size, valid JSON
    with pytest.raises(Exception, match="trainer_state.json: contents differ"):
        verify_checkpoint(run / "global_step_4")
    assert resume_point(run).step == 2


def test_no_intact_checkpoint_is_one_user_error_and_restore_applies_everything(tmp_path, tiny):
    run = write_run(tmp_path / "run", tiny)
    model, _ = tiny
    ckpt = read_checkpoint(run / "global_step_2", 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    restore(ckpt, model, optimizer)
    assert float(next(model.parameters()).detach().flatten()[0]) == 2.0
    for step in (2, 4):
        truncate(run / f"global_step_{step}" / "rng.pkl")
    with pytest.raises(UserError, match="out: no usable checkpoint .*global_step_4, global_step_2 damaged"):
        resume_point(run)
    assert [s for s, _ in checkpoints(run)] == [2, 4]  # nothing moved when there is nothing to resume from


SMALL = [
    "policy.model=random-tiny",
    "budget.prompts=2",
    "budget.rollouts_per_prompt=2",
    "budget.pool_factor=2",
    "budget.max_per_prompt=2",
    "policy.max_new_tokens=8",
    "eval_tasks=2",
    "eval_samples=1",
    "progress=false",
    "logger=[jsonl]",
]


def test_train_resumes_past_a_damaged_checkpoint_and_a_finished_run_exits_0(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "steps=2", "save_every=1", "eval_every=2", f"out={run}"]) == 0
    assert verify_checkpoint(run / "global_step_2") and verify_checkpoint(run / "global_step_1")
    capsys.readouterr()
    # resuming a run that already reached `steps`: one line, exit 0, nothing trained
    assert main(["train", *SMALL, "steps=2", "save_every=1", "eval_every=2", f"out={run}", "resume=true"]) == 0
    err = capsys.readouterr().err
    assert "already reached step 2 (steps=2)" in err and "Traceback" not in err
    # the newest damaged: trains on from step 1 with one line naming the file, and writes step 2 again
    truncate(run / "global_step_2" / "model.safetensors")
    assert main(["train", *SMALL, "steps=2", "save_every=1", "eval_every=2", f"out={run}", "resume=true"]) == 0
    err = capsys.readouterr().err
    assert "global_step_2/model.safetensors" in err and "resumed from" in err and "global_step_1" in err
    assert verify_checkpoint(run / "global_step_2")
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]
    shutil.rmtree(run / "global_step_2.damaged")
