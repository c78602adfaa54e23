import subprocess
import sys

from trace_rl.cli import main


def test_simulate_writes_table_metrics_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["simulate", "--methods", "grpo,trace", "--steps", "3", "--prompts", "4",
                 "--rollouts-per-prompt", "4", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "effective_ratio" in text and "trace" in text
    for name in ("metrics.jsonl", "summary.json", "effective_ratio.png", "accuracy.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "effective_ratio.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    assert main(["simulate", "--methods", "grpo,ppo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown ['ppo']" in err and "Traceback" not in err
    assert main(["simulate", "--mix", "1,1,1", "--steps", "1", "--out", str(tmp_path)]) == 2
    assert "difficulty_mix" in capsys.readouterr().err


def test_console_script_propositions():
    proc = subprocess.run([sys.executable, "-m", "trace_rl.cli", "propositions", "--tasks", "8", "--episodes", "200"],
                          capture_output=True, text=True, check=True)
    assert "Proposition 1" in proc.stdout and "Proposition 2" in proc.stdout
