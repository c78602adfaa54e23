import json
import subprocess
import sys

import pytest

from trace_rl.cli import main


def test_simulate_writes_config_table_metrics_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # simulate draws its plots with matplotlib (the plots extra)
    out = tmp_path / "run"
    code = main(
        [
            "simulate",
            "methods=grpo,trace",
            "steps=3",
            "budget.prompts=4",
            "budget.rollouts_per_prompt=4",
            f"out={out}",
            "progress=false",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "effective_ratio" in text and "trace" in text
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "effective_ratio.png", "accuracy.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "effective_ratio.png").read_bytes()[:4] == b"\x89PNG"
    assert "prompts: 4" in (out / "config.yaml").read_text()
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert "rollout/effective_ratio" in rec


def test_old_flag_spellings_and_a_config_file(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # simulate draws its plots with matplotlib (the plots extra)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("steps: 1\nbudget:\n  prompts: 4\n  rollouts_per_prompt: 2\n")
    out = tmp_path / "run"
    assert (
        main(
            [
                "simulate",
                "--config",
                str(cfg),
                "--methods",
                "grpo",
                "--prefix-share",
                "0.25",
                "--out",
                str(out),
                "--progress",
                "false",
            ]
        )
        == 0
    )
    text = (out / "config.yaml").read_text()
    assert "prefix_share: 0.25" in text and "steps: 1" in text and "prompts: 4" in text


@pytest.mark.parametrize(
    "argv, key",
    [
        (["no_such_key=1"], "no_such_key"),
        (["steps=0"], "steps"),
        (["steps=abc"], "steps"),
        (["methods=grpo,ppo"], "methods"),
        (["env.difficulty_mix=1,1,1"], "difficulty_mix"),
        (["budget.prompts=0"], "budget.prompts"),
        (["predictor.prefix_share=1.5"], "predictor.prefix_share"),
        (["out="], "out"),
        (["--config", "/no/such.yaml"], "--config"),
        (["--no-such-flag", "3"], "--no-such-flag"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(tmp_path, capsys, argv, key):
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err and "Traceback" not in err


def test_help_lists_every_key_with_its_default(capsys):
    assert main(["simulate", "--help"]) == 0
    text = capsys.readouterr().out
    for key in (
        "out=",
        "seed=0",
        "steps=40",
        "methods=",
        "budget.prompts=32",
        "predictor.prefix_share=0.5",
        "policy.lr=4.0",
        "env.difficulty_mix=",
    ):
        assert key in text


def test_console_script_propositions():
    proc = subprocess.run(
        [sys.executable, "-m", "trace_rl.cli", "propositions", "tasks=8", "episodes=200"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Proposition 1" in proc.stdout and "Proposition 2" in proc.stdout


def test_every_command_lists_its_keys(capsys):
    pytest.importorskip("torch")  # the LM commands' configs import torch
    from trace_rl.cli import COMMANDS

    for command in COMMANDS:
        assert main([command, "--help"]) == 0, command
        text = capsys.readouterr().out
        assert text.startswith(f"usage: trace-rl {command}") and "=" in text
