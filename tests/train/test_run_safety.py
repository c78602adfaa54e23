"""A run directory holds one writer (a second run is refused in one line naming the first; the lock goes with a
killed holder); a failed checkpoint save is one line and keeps the previous checkpoint; an environment's
non-finite reward is one line naming the environment, the task and the step (train), and is never scored (eval).
Tiny random model; the runs are two steps at most."""

import errno
import os
import subprocess
import sys
import textwrap

import pytest

from trace_rl.cli import main
from trace_rl.rollout.run_lock import LOCK_NAME, run_lock

SIMULATE = ["simulate", "steps=1", "progress=false"]


def one_error_line(capsys) -> str:
    """The command's one error line (progress lines before it are the run's own), with no traceback."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_a_second_run_on_a_held_directory_is_refused_naming_the_first(tmp_path, capsys):
    out = tmp_path / "run"
    with run_lock(out, "trace-rl train"):
        assert main([*SIMULATE, f"out={out}"]) == 2
        line = one_error_line(capsys)
        assert f"{out} is in use by another trace-rl run (pid {os.getpid()}, trace-rl train, started " in line
        assert not (out / "metrics.jsonl").exists()
    assert main([*SIMULATE, f"out={out}"]) == 0  # free once the first ended
    assert (out / "metrics.jsonl").exists() and not (out / LOCK_NAME).exists()


def test_the_lock_of_a_killed_run_is_released_by_the_kernel(tmp_path, capsys):
    out = tmp_path / "run"
    holder = textwrap.dedent(
        f"""
        import sys, time
        from trace_rl.rollout.run_lock import run_lock
        with run_lock({str(out)!r}, "trace-rl train"):
            print("held", flush=True)
            time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert main([*SIMULATE, f"out={out}"]) == 2
        assert f"(pid {proc.pid}, trace-rl train, started " in one_error_line(capsys)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert (out / LOCK_NAME).exists()  # the killed holder's note stays; its lock does not
    assert main([*SIMULATE, f"out={out}"]) == 0


def test_a_run_refused_inside_the_lock_leaves_no_directory_behind(tmp_path):
    out = tmp_path / "fresh" / "run"
    with pytest.raises(RuntimeError), run_lock(out, "test"):
        assert (out / LOCK_NAME).exists()
        raise RuntimeError("refused")
    assert not out.exists()


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_trainer import SMALL, records  # noqa: E402

from trace_rl.train import checkpoint  # noqa: E402
from trace_rl.train.checkpoint import CheckpointSaveError, checkpoints, verify_checkpoint  # noqa: E402


def test_a_failed_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, tiny_model, monkeypatch):
    model, tok = tiny_model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoint.save_checkpoint(tmp_path, 1, model, tok, optimizer, {}, {"step": 1}, "steps: 2\n")
    real_save = torch.save

    def full_disk(obj, f, *a, **k):  # the model's files are written, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointSaveError) as err:
        checkpoint.save_checkpoint(tmp_path, 2, model, tok, optimizer, {}, {"step": 2}, "steps: 2\n")
    monkeypatch.setattr(torch, "save", real_save)
    msg = str(err.value)
    assert "\n" not in msg and "could not save step 2" in msg and "No space left on device" in msg
    assert f"the previous checkpoint {tmp_path / 'global_step_1'} is kept" in msg
    assert [s for s, _ in checkpoints(tmp_path)] == [1] and verify_checkpoint(tmp_path / "global_step_1")
    assert not list(tmp_path.glob(".tmp-*"))  # the half-written one is gone


@pytest.fixture(scope="module")
def tiny_model():
    from trace_rl.lm.models import load_model

    return load_model("random-tiny")


def test_train_with_a_full_disk_at_a_save_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    real = checkpoint._write_files

    def full_at_step_2(path, *args):
        real(path, *args)
        if "global_step_2" in path.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint, "_write_files", full_at_step_2)
    out = tmp_path / "run"
    assert main(["train", *SMALL, "steps=2", "save_every=1", "eval_every=2", f"out={out}"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "could not save step 2" in line and "global_step_1 is kept" in line and "Traceback" not in line
    assert [s for s, _ in checkpoints(out)] == [1] and verify_checkpoint(out / "global_step_1")
    assert not (out / LOCK_NAME).exists()  # the lock went with the run


NAN_ENV = """
import math
from dataclasses import dataclass

from trace_rl.envs.base import ToolEnv
from trace_rl.envs.registry import EnvSpec, env_plugin

REWARD = {"train": float("nan"), "held-out": 1.0}


class Broken(ToolEnv):
    tools = ("answer",)
    system = "Write: Action: answer[yes]"

    def step(self, text):  # every first turn ends the episode, whatever the untrained model wrote
        self.done = True
        return "Done.", REWARD[self.task["split"]], True, {"valid_action": True}


@dataclass
class BrokenSettings:
    held_out_reward: str = "1.0"  # the reward of every held-out episode (a string: a nan setting is its own case)


def tasks(count, split):
    return [{"index": i, "question": f"Question {i}?", "answer": "yes", "split": split} for i in range(count)]


@env_plugin("broken", BrokenSettings)
def broken(settings):
    REWARD["held-out"] = float(settings.held_out_reward)
    return EnvSpec(
        make=lambda: Broken(max_turns=1),
        benchmarks={"broken": lambda n: tasks(n or 2, "held-out")},
        train=lambda count, seed: tasks(count, "train"),
        max_new_tokens=8,
    )
"""


def test_a_non_finite_reward_in_training_is_one_line_naming_env_task_and_step(tmp_path, env_module, capsys):
    name = env_module("broken_env", NAN_ENV) + ":broken"
    out = tmp_path / "run"
    assert main(["train", *SMALL, "steps=2", f"env={name}", f"out={out}"]) == 2
    line = one_error_line(capsys)
    assert "env Broken: task index " in line and "ended with the reward nan" in line and "(at step 1)" in line
    assert not (out / "metrics.jsonl").exists() or not records(out)  # no step was recorded with it


@pytest.mark.parametrize("reward", ["nan", "inf"])
def test_eval_never_scores_a_non_finite_reward(tmp_path, env_module, capsys, reward):
    name = env_module("broken_env", NAN_ENV) + ":broken"
    out = tmp_path / "eval"
    args = ["policy.model=random-tiny", f"env={name}", f"env.broken.held_out_reward={reward}", "limit=2"]
    assert main(["eval", *args, f"out={out}"]) == 2
    line = one_error_line(capsys)
    assert f"ended with the reward {reward}" in line and "env Broken" in line and "(broken)" in line, line
    assert (out / "samples.jsonl").read_text() == ""  # no sample scored
    # the same run in training: the start's held-out evaluation names itself
    assert main(["train", *SMALL, "steps=1", f"env={name}", f"env.broken.held_out_reward={reward}", "resume=false",
                 f"out={tmp_path / 'train'}"]) == 2  # fmt: skip
    assert "(eval step 0)" in one_error_line(capsys)
