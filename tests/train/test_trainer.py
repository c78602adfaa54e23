"""`trace-rl train` end to end on a random tiny model: checkpoints, exact resume, a kill mid-checkpoint, and
two steps on every environment."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers_data import write_tiny_data  # noqa: E402

from trace_rl.cli import main  # noqa: E402

SMALL = [
    "policy.model=random-tiny",
    "budget.prompts=2",
    "budget.rollouts_per_prompt=2",
    "budget.pool_factor=2",
    "budget.max_per_prompt=2",
    "policy.max_new_tokens=8",
    "eval_tasks=2",
    "eval_samples=2",
    "eval_every=1",
    "progress=false",
    "logger=[jsonl]",
]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def untimed(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if not k.startswith("timing_s/") and k != "train/peak_rss_gib"}


def test_the_run_state_reads_every_trainer_state_file_and_writes_the_same_keys():
    from trace_rl.train.checkpoint import RunState

    old = {"step": 3, "accuracy_before": 0.25, "rollouts": 48, "pools_digest": "ab"}  # before the digests and start
    state = RunState.from_json(old)
    assert (state.step, state.rollouts, state.held_out_digest) == (3, 48, "")
    assert state.before is None and state.flip_model is None
    assert state.to_json() == {**old, "held_out_digest": ""}  # no before, no flip layer: not written
    full = {**old, "held_out_digest": "cd", "before": {"accuracy": 0.25}, "flip_model": {"w": [0.5]}, "root_model": {}}
    assert list(RunState.from_json(full).to_json().items()) == list(full.items())  # the order the trainer wrote


def test_two_steps_write_checkpoints_and_a_resume_reproduces_them(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    decay = "update.final_lr=0.5"  # the rate of a step is a function of the step: a resume sets the same one
    # stage 2's flip layer and stage 1's root layer learn online: the checkpoint keeps them
    calibrated = ("predictor.flip_model=calibrated", "predictor.root_model=calibrated")
    assert main(["train", *SMALL, decay, *calibrated, "steps=2", "seed=0", f"out={full}", "save_every=1"]) == 0
    state = json.loads((full / "global_step_2" / "trainer_state.json").read_text())
    layer, roots = state["flip_model"], state["root_model"]
    assert layer["steps_seen"] == roots["steps_seen"] == 2  # the settings reached the engine, which updated both
    assert (full / "global_step_2" / "config.json").exists() and (full / "global_step_2" / "optimizer.pt").exists()
    recs = records(full)
    assert [r["step"] for r in recs] == [0, 1]
    for key in (
        "train/loss",
        "train/clip_frac",
        "train/kl",
        "train/grad_norm",
        "eval/accuracy",
        "rollout/effective_ratio",
        "timing_s/update",
    ):
        assert key in recs[-1], key
    assert [r["train/lr"] for r in recs] == [2e-4, 1e-4]
    assert main(["train", *SMALL, decay, *calibrated, "steps=1", "seed=0", f"out={part}"]) == 0
    assert main(["train", *SMALL, decay, *calibrated, "steps=2", "seed=0", f"out={part}", "resume=true"]) == 0
    again = json.loads((part / "global_step_2" / "trainer_state.json").read_text())
    assert again["flip_model"] == layer and again["root_model"] == roots
    again = records(part)
    assert [r["step"] for r in again] == [0, 1]
    assert untimed(again[1]) == untimed(recs[1])
    assert main(["train", *SMALL, "steps=2", f"out={part}"]) == 2  # checkpoints there and no resume: refused


def test_a_flip_prior_file_reaches_stage_2s_layer(tmp_path):
    from trace_rl.experimental.flip import FlipPrior

    theta = tuple(-1.0 + 0.1 * i for i in range(10))
    FlipPrior(theta, 0.5, 0.25, continuations=(3,) * 8, flips=(1,) * 8).save(tmp_path / "prior.json")
    prior = f"predictor.flip_prior={tmp_path / 'prior.json'}"
    out = tmp_path / "run"
    argv = ["train", *SMALL, "predictor.flip_model=calibrated", prior, "steps=1", f"out={out}", "save_every=1"]
    assert main(argv) == 0
    layer = json.loads((out / "global_step_1" / "trainer_state.json").read_text())["flip_model"]
    assert layer["settings"]["prior_mean"] == list(theta) and layer["settings"]["sigma_cell"] == 0.5


def test_vip_trains_on_its_gaussian_process_and_resumes_it(tmp_path):
    """method=vip: its GP (here over hashed prompt n-grams: the tests load no MiniLM) is pickled into each
    checkpoint with its fits, so a resumed run allocates as the uninterrupted one did."""
    import pickle

    vip = [*SMALL, "method=vip", "predictor.gp_encoder=hashed", "seed=0"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["train", *vip, "steps=2", f"out={full}", "save_every=1"]) == 0
    recs = records(full)
    assert [r["rollout/rollouts"] for r in recs] == [4, 4] and {r["method"] for r in recs} == {"vip"}
    with open(full / "global_step_1" / "predictor.pkl", "rb") as fh:
        gp = pickle.load(fh)
    assert type(gp).__name__ == "GaussianProcessPredictor" and gp.alpha.size >= 1
    assert main(["train", *vip, "steps=1", f"out={part}"]) == 0
    assert main(["train", *vip, "steps=2", f"out={part}", "resume=true"]) == 0
    assert untimed(records(part)[1]) == untimed(recs[1])


KILLER = """
import os, signal, sys
from trace_rl.train import checkpoint

original = checkpoint._write_files

def write_then_die(path, *args, **kwargs):
    if path.name.startswith(".tmp-global_step_2"):
        (path / "half-written").write_text("x")
        os.kill(os.getpid(), signal.SIGKILL)  # killed in the middle of writing the second checkpoint
    return original(path, *args, **kwargs)

checkpoint._write_files = write_then_die
from trace_rl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_kill_in_the_middle_of_a_checkpoint_write_leaves_a_run_that_resumes(tmp_path):
    run = tmp_path / "run"
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2] / "src"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    proc = subprocess.run(
        [sys.executable, str(script), "train", *SMALL, "steps=2", "save_every=1", f"out={run}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL
    assert (run / "global_step_1").is_dir() and not (run / "global_step_2").exists()
    assert list(run.glob(".tmp-global_step_2*"))  # the half-written one is there, under its temporary name
    assert main(["train", *SMALL, "steps=2", "save_every=1", f"out={run}", "resume=true"]) == 0
    assert (run / "global_step_2").is_dir() and not list(run.glob(".tmp-*"))
    assert [r["step"] for r in records(run)] == [0, 1]
    # the metrics and predictions of the killed step were dropped and redone: the files of an uninterrupted run
    assert main(["train", *SMALL, "steps=2", "save_every=1", f"out={tmp_path / 'whole'}"]) == 0
    assert [untimed(r) for r in records(run)] == [untimed(r) for r in records(tmp_path / "whole")]
    preds = [(d / "predictions.jsonl").read_text() for d in (run, tmp_path / "whole")]
    assert preds[0] == preds[1] and preds[0]


@pytest.mark.parametrize("env", ["calculator", "math", "qa", "bfcl"])
def test_two_steps_on_every_environment(tmp_path, monkeypatch, env):
    needs = {"math": "math_verify", "qa": "bm25s", "bfcl": "bfcl_eval"}
    if env in needs:
        pytest.importorskip(needs[env])
    if env in ("math", "qa"):  # a data folder of a few rows, written here: runs on a clone without shared/data
        monkeypatch.setenv("TRACE_RL_DATA", str(write_tiny_data(tmp_path / "data")))
    out = tmp_path / env
    args = [*SMALL, "steps=2", f"env.name={env}", f"out={out}", "eval_samples=1", "eval_every=2"]
    if env == "bfcl":  # an untrained model seldom ends a turn: 20 steps a turn over ~1,400-token prompts otherwise
        args.append("env.bfcl.steps_per_turn=1")
    assert main(["train", *args]) == 0
    assert len(records(out)) == 2 and (out / "global_step_2").is_dir()


def test_the_start_the_standard_error_and_the_predictions_are_logged(tmp_path):
    out = tmp_path / "run"
    assert main(["train", *SMALL, "steps=2", "method=trace", f"out={out}"]) == 0
    recs = records(out)
    assert "eval/accuracy_before" in recs[0] and "eval/accuracy_before" not in recs[1]
    assert all(r["eval/accuracy_se"] >= 0 and r["eval/accuracy_se_sampling"] >= 0 for r in recs)
    assert "eval/before_accuracy_se" in recs[0]
    for key in ("train/adv_nonzero_token_share", "train/update_kl", "train/adv_abs", "train/grad_norm"):
        assert key in recs[0], key
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["accuracy_before"] == recs[0]["eval/accuracy_before"]
    assert summary["held_out_digest"] and summary["pools_digest"]
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert preds and {p["step"] for p in preds} <= {0, 1} and all(p["method"] == "trace" for p in preds)
    for rec in recs:  # the roots' calibration against their bare rollouts, every step (predictors.calibration)
        assert rec["predictor/calib_root_n"] == rec["rollout/bare_rollouts"], rec
        assert 0 <= rec["predictor/calib_root_ece"] <= 1 and rec["predictor/examples_root"] >= 1
    assert all(p["bare_rollouts"] >= 1 for p in preds if p["depth"] == 0)
    assert (out / "chain.png").is_file() and (out / "accuracy.png").is_file()


def test_compare_pairs_vip_with_grpo(tmp_path, capsys):
    from trace_rl.train.compare import check_pairing, load_runs

    args = ["compare", f"out={tmp_path}", "methods=[grpo,vip]", "seeds=[3]", "train.steps=1"]
    args += [f"train.{a}" for a in SMALL] + ["train.predictor.gp_encoder=hashed"]
    assert main(args) == 0
    runs = load_runs(tmp_path, ["grpo", "vip"])
    assert check_pairing(runs) == []
    assert runs["vip"][0]["pools_digest"] == runs["grpo"][0]["pools_digest"]
    assert "vip" in capsys.readouterr().out


def test_compare_pairs_its_runs_evaluates_the_start_once_and_gets_what_a_lone_run_gets(tmp_path, monkeypatch, capsys):
    """A compare run is the `trace-rl train` run of its settings: the same evaluation of the start, computed once
    per seed, and the same records and predictions (what `compare` over `train` must keep); its runs are paired,
    and a rerun reads them instead of training again."""
    import trace_rl.train.trainer as trainer
    from trace_rl.rollout.records import read_metrics
    from trace_rl.train.compare import check_pairing, load_runs

    calls = []
    real = trainer.evaluate_policy
    monkeypatch.setattr(
        trainer, "evaluate_policy", lambda cfg, eng, tasks, step: calls.append(step) or real(cfg, eng, tasks, step)
    )
    cmp = tmp_path / "cmp"
    args = ["compare", f"out={cmp}", "methods=[grpo,trace]", "seeds=[3]", "train.steps=1"]
    args += [f"train.{a}" for a in SMALL]
    assert main(args) == 0
    assert calls.count(0) == 1  # the second method of the seed reads the first one's evaluation
    runs = load_runs(cmp, ["grpo", "trace"])
    assert check_pairing(runs) == []  # same start, same held-out set, same pools on the seed
    grpo, trace = runs["grpo"][0], runs["trace"][0]
    assert grpo["accuracy_before"] == trace["accuracy_before"]
    assert grpo["held_out_digest"] == trace["held_out_digest"] and grpo["pools_digest"] == trace["pools_digest"]
    assert trace["records"][0]["eval/accuracy_before"] == grpo["records"][0]["eval/accuracy_before"]
    table = capsys.readouterr().out
    assert "after_vs_grpo" in table and "trace" in table
    for png in ("accuracy_vs_rollouts.png", "accuracy_vs_tokens.png", "chain.png"):
        assert (cmp / png).is_file(), png
    stamp = (cmp / "trace" / "seed3" / "metrics.jsonl").stat().st_mtime_ns
    assert main(args) == 0
    assert (cmp / "trace" / "seed3" / "metrics.jsonl").stat().st_mtime_ns == stamp  # read, not rerun
    assert main(["train", f"out={tmp_path / 'alone'}", "method=trace", "seed=3", "steps=1", *SMALL]) == 0
    alone = json.loads((tmp_path / "alone" / "train_summary.json").read_text())
    assert alone["before"] == trace["before"]  # evaluated on its own: the very same figures
    lone, paired = tmp_path / "alone", cmp / "trace" / "seed3"
    assert [untimed(r) for r in read_metrics(lone / "metrics.jsonl")["trace"]] == [untimed(r) for r in trace["records"]]
    assert (lone / "predictions.jsonl").read_text() == (paired / "predictions.jsonl").read_text()


def test_compare_with_two_workers_trains_the_runs_one_at_a_time_would(tmp_path, monkeypatch):
    import torch

    from trace_rl.train.compare import check_pairing, load_runs

    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # 2 cores, so each worker gets 1 thread on any machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what each of two workers gets on 2 cores: the same arithmetic as the workers
    try:
        for name, workers in (("serial", 1), ("parallel", 2)):
            # two runs: with two workers they train side by side, each in its own process
            args = ["compare", f"out={tmp_path / name}", "methods=[grpo,trace]", "seeds=[3]", "train.steps=1"]
            assert main(args + [f"train.{a}" for a in SMALL] + [f"workers={workers}"]) == 0
    finally:
        torch.set_num_threads(threads)
    serial, parallel = (load_runs(tmp_path / name, ["grpo", "trace"]) for name in ("serial", "parallel"))
    assert check_pairing(parallel) == []
    for method in ("grpo", "trace"):
        assert [s["seed"] for s in parallel[method]] == [3]
        for a, b in zip(serial[method], parallel[method], strict=True):
            assert [untimed(r) for r in a["records"]] == [untimed(r) for r in b["records"]]
    assert main(["compare", f"out={tmp_path / 'x'}", "workers=0"]) == 2  # one line, not a traceback


def test_a_runs_config_comment_names_its_warm_starts_numerics():
    from trace_rl.train.trainer import start_comment

    start = {"path": "p", "key": "k", "weights_digest": "w", "sft_success": 0.5, "versions": {"torch": "2"}}
    assert "numerics" not in start_comment(start)  # an entry built before the numerics were keyed
    assert (
        start_comment({**start, "numerics": "x86-64-avx2-1thread"}).rstrip().endswith(", numerics x86-64-avx2-1thread")
    )
