"""What the project promises about checkpoints: a damaged one is never loaded; resuming falls back to the newest
intact one with one line naming the bad file; one of another run or another step is refused with one line
saying which; nothing under global_step_N blocks a resume (a FIFO) or a later save (a file, a link);
checkpoints from before the manifest, or before the manifest recorded the run, are loaded with a warning;
a run that already reached its steps says so and exits 0. Tiny random model, no training except in the
end-to-end resumes."""

import json
import os
import shutil
import threading
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
    run_record,
    save_checkpoint,
    verify_checkpoint,
)

RUN = run_record(0, {"update": {"lr": 1e-3}, "method": "trace"})


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_model("random-tiny")
    return model, tok


def write_run(root: Path, tiny, steps=(2, 4), run: dict = RUN) -> Path:
    """A run directory with one checkpoint per step, each with distinct weights and trainer state."""
    model, tok = tiny
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in steps:
        with torch.no_grad():
            next(model.parameters()).fill_(float(step))
        state = {"step": step, "accuracy_before": 0.25, "rollouts": 10 * step}
        save_checkpoint(root, step, model, tok, optimizer, {"predictor": step}, state, "steps: 4\n", 5, run)
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
    # the newest damaged: trains on from step 1 with one line naming the file, and writes step 2 again; a
    # garbage line appended to metrics.jsonl (once a JSONDecodeError while trimming it) is dropped with one line
    truncate(run / "global_step_2" / "model.safetensors")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 1, "torn by a ki\n\x00garbage\n')
    assert main(["train", *SMALL, "steps=2", "save_every=1", "eval_every=2", f"out={run}", "resume=true"]) == 0
    err = capsys.readouterr().err
    assert "global_step_2/model.safetensors" in err and "resumed from" in err and "global_step_1" in err
    assert "metrics.jsonl: dropped 2 line(s) that are not records (first: line 3)" in err
    assert verify_checkpoint(run / "global_step_2")
    # resuming with another learning rate: refused in one line that names it, nothing trained or moved
    assert main(["train", *SMALL, "steps=3", "update.lr=0.5", f"out={run}", "resume=true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another run (settings differ in update.lr)" in err, err
    assert [s for s, _ in checkpoints(run)] == [1, 2]
    # strict JSON (jq reads it): the NaN standard error of one sample per task is null
    recs = [json.loads(line, parse_constant=pytest.fail) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1] and recs[1]["eval/accuracy_se_sampling"] is None
    shutil.rmtree(run / "global_step_2.damaged")


def edit_manifest(path: Path, text_of) -> None:
    """Replace a manifest by `text_of(its parsed content)`, keeping every other file."""
    path.write_text(text_of(json.loads(path.read_text())))


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


MANIFEST_DAMAGE = {  # each once crashed the resume with a traceback
    "bytes Infinity": lambda m: json.dumps(m).replace('"bytes": ', '"bytes": Infinity, "was": ', 1),
    "nested 100k deep": lambda m: nested(100_000),
    "bytes a string": lambda m: json.dumps(m).replace('"bytes": ', '"bytes": "12", "was": ', 1),
    "a path outside": lambda m: json.dumps({**m, "files": {"../../x": {"bytes": 1, "sha256": "0" * 64}}}),
}


@pytest.mark.parametrize("case", MANIFEST_DAMAGE)
def test_a_hostile_manifest_falls_back_with_one_line(tmp_path, tiny, case):
    run = write_run(tmp_path / "run", tiny)
    edit_manifest(run / "global_step_4" / MANIFEST, MANIFEST_DAMAGE[case])
    lines = []
    ckpt = resume_point(run, lines.append, RUN)
    assert ckpt.step == 2 and len(lines) == 1 and "global_step_4/manifest.json: unreadable" in lines[0]
    assert "\n" not in lines[0] and len(lines[0]) < 400


def resume_in_thread(run: Path, lines: list, expect=None) -> dict:
    """resume_point in a thread that the test does not wait on for ever: a read that blocks (a FIFO opened for
    reading waits for a writer) shows as a thread still alive, not as a hung suite."""
    box: dict = {}

    def go():
        try:
            box["ckpt"] = resume_point(run, lines.append, expect)
        except Exception as err:  # noqa: BLE001 - handed to the test
            box["error"] = err

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "resume_point blocked on a special file"
    return box


@pytest.mark.parametrize("where", ["manifest.json", "trainer_state.json without a manifest"])
def test_a_fifo_in_place_of_a_file_is_skipped_not_waited_on(tmp_path, tiny, where):
    run = write_run(tmp_path / "run", tiny)
    ckpt4 = run / "global_step_4"
    name = where.split()[0]
    if "without" in where:
        for step in (2, 4):
            (run / f"global_step_{step}" / MANIFEST).unlink()
    (ckpt4 / name).unlink()
    os.mkfifo(ckpt4 / name)
    lines: list = []
    box = resume_in_thread(run, lines, RUN)
    assert box["ckpt"].step == 2 and name in lines[0] and "FIFO" in lines[0]
    assert (run / "global_step_4.damaged").is_dir()


def stray_file(path: Path) -> None:
    shutil.rmtree(path)
    path.write_text("not a checkpoint")


def dangling_link(path: Path) -> None:
    shutil.rmtree(path)
    path.symlink_to(path.parent / "nowhere")


@pytest.mark.parametrize("damage", [stray_file, dangling_link], ids=["a file", "a dangling symlink"])
def test_global_step_n_that_is_no_directory_is_named_moved_aside_and_does_not_break_the_next_save(
    tmp_path, tiny, damage
):
    run = write_run(tmp_path / "run", tiny)
    damage(run / "global_step_4")
    lines = []
    assert resume_point(run, lines.append, RUN).step == 2
    assert len(lines) == 1 and "global_step_4" in lines[0] and ("not a directory" in lines[0] or "dangling" in lines[0])
    write_run(run, tiny, steps=(4,))  # the save a resumed run makes at step 4 (once a NotADirectoryError)
    assert verify_checkpoint(run / "global_step_4") and not list(run.glob(".tmp-*"))


def test_a_checkpoint_of_another_run_or_step_is_refused_with_one_line_saying_which(tmp_path, tiny):
    other_seed = write_run(tmp_path / "seed1", tiny, steps=(4,), run=run_record(1, RUN["settings"]))
    other_lr = write_run(tmp_path / "lr", tiny, steps=(4,), run=run_record(0, {**RUN["settings"], "update": {"lr": 1}}))
    for other, said in ((other_seed, "seed 1, not 0"), (other_lr, "settings differ in update.lr")):
        run = write_run(tmp_path / f"run-{other.name}", tiny)
        shutil.rmtree(run / "global_step_4")
        (run / "global_step_4").symlink_to(other / "global_step_4")
        lines = []
        assert resume_point(run, lines.append, RUN).step == 2
        assert len(lines) == 1 and "another run" in lines[0] and said in lines[0], lines
        assert (run / "global_step_4.foreign").is_symlink()  # moved aside: the link, not what it points to
        write_run(run, tiny, steps=(4,))  # the next save does not touch the other run's checkpoint
        assert verify_checkpoint(other / "global_step_4") and not (run / "global_step_4").is_symlink()
    # every checkpoint another run's (the settings were changed on resume): one line, nothing moved
    with pytest.raises(UserError, match="resume: no checkpoint .* is this run's .*seed 1, not 0"):
        resume_point(other_seed, None, RUN)
    assert (other_seed / "global_step_4").is_dir()
    # a copy under another step's name: its manifest and state say step 2
    run = write_run(tmp_path / "copied", tiny)
    shutil.copytree(run / "global_step_2", run / "global_step_8")
    lines = []
    assert resume_point(run, lines.append, RUN).step == 4
    assert len(lines) == 1 and "global_step_8" in lines[0] and "says step 2, not 8" in lines[0]


def test_a_manifest_from_before_run_records_loads_with_one_line_and_its_step_is_still_checked(tmp_path, tiny):
    run = write_run(tmp_path / "run", tiny, run=None)  # format 1: files and step only
    assert "run" not in json.loads((run / "global_step_4" / MANIFEST).read_text())
    lines = []
    assert resume_point(run, lines.append, RUN).step == 4
    assert len(lines) == 1 and "before checkpoints recorded their run" in lines[0]
    shutil.copytree(run / "global_step_2", run / "global_step_6")
    lines = []
    assert resume_point(run, lines.append, RUN).step == 4 and "says step 2, not 6" in lines[0]


def test_a_checkpoint_whose_env_settings_predate_plugins_is_this_runs(tmp_path, tiny):
    """Checkpoints written when every env's keys sat flat in `env` (chain_steps, digits, corpus, ...) resume a run
    with the same env settings in today's groups; another mix is still another run."""
    import dataclasses

    from trace_rl.stack.env_config import env_config

    now = {**RUN["settings"], "env": dataclasses.asdict(env_config("calculator", preset="train"))}
    flat = {"name": "calculator", "chain_steps": [3, 4, 5], "digits": [2], "corpus": "", "retriever_url": ""}
    old = write_run(tmp_path / "old", tiny, steps=(4,), run=run_record(0, {**RUN["settings"], "env": {**flat}}))
    lines = []
    assert resume_point(old, lines.append, run_record(0, now)).step == 4 and lines == []
    other = write_run(tmp_path / "other", tiny, steps=(4,), run=run_record(0, {**RUN["settings"], "env": {**flat}}))
    with pytest.raises(UserError, match="settings differ in env.calculator"):
        resume_point(other, None, run_record(0, {**now, "env": dataclasses.asdict(env_config("calculator"))}))


def test_train_records_its_run_and_ignores_only_settings_a_resume_may_change(tmp_path):
    from trace_rl.config import load_config
    from trace_rl.train.trainer import TrainConfig, run_identity

    def identity(*args):
        return run_identity(load_config(TrainConfig, [*SMALL, *args])[0])

    base = identity()
    assert identity("steps=9", "eval_every=3", "save_every=2", "keep_last=4", f"out={tmp_path}") == base
    assert identity("seed=1")["seed"] == 1 and identity("seed=1")["settings_digest"] == base["settings_digest"]
    assert identity("update.lr=0.1")["settings_digest"] != base["settings_digest"]
    assert "steps" not in base["settings"] and base["settings"]["update"]["lr"]
