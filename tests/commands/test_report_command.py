"""`trace-rl report`: missing runs named with the command that makes them, a study stored with keep=, the documents'
blocks rewritten in place, one line for bad input, nothing written by a refused call."""

import json

import pytest

from trace_rl.cli import main
from trace_rl.commands import report


def test_blocks_are_found_and_filled_leaving_others_alone():
    text = "a\n<!-- report:x -->\nold x\n<!-- /report -->\nb\n<!-- report:y -->\nold y\n<!-- /report -->\n"
    assert report.blocks(text) == {"x": "old x", "y": "old y"}
    filled = report.fill(text, {"x": "| new |\n|---|"})
    assert report.blocks(filled) == {"x": "| new |\n|---|", "y": "old y"}
    assert filled.startswith("a\n<!-- report:x -->\n| new |") and filled.endswith("<!-- /report -->\n")
    assert report.fill(filled, {"x": "| new |\n|---|"}) == filled


def test_missing_runs_are_named_with_the_command_that_makes_them(tmp_path, capsys):
    pytest.importorskip("torch")  # the tables read runs through trace_rl.train.compare
    assert main(["report", f"store={tmp_path}", "tables=lm_peers,testbed_accuracy"]) == 0
    err = capsys.readouterr().err
    assert "missing: lm_peers: no stored study 'lm_regime'" in err
    assert "trace-rl compare out=runs/lm_regime methods=grpo,trace,pcl,vip train.env.calculator.preset=rl" in err
    assert "missing: testbed_accuracy" in err and "then `trace-rl report keep=runs/testbed_accuracy`" in err


def test_an_unknown_table_or_a_study_that_is_not_one_is_one_line_and_writes_nothing(tmp_path, capsys):
    pytest.importorskip("torch")
    assert main(["report", f"store={tmp_path / 's'}", "tables=nope"]) == 2
    assert "tables: unknown nope; choose from testbed_accuracy" in capsys.readouterr().err
    assert main(["report", f"store={tmp_path / 's'}", f"keep={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trace-rl report: error: keep: ") and "is not a finished study" in err
    assert not (tmp_path / "s").exists()


def _simulate_study(
    root, seeds=(0, 1), methods=("grpo", "pcl", "knapsack_rl", "treepo", "tree_grpo", "trace", "trace_oracle")
):
    """A hand-written simulate output: 2 steps a method, accuracy evaluated after each."""
    for seed in seeds:
        d = root / f"seed{seed}"
        d.mkdir(parents=True)
        recs = []
        for i, m in enumerate(methods):
            for step in range(2):
                recs.append(
                    {
                        "method": m,
                        "step": step,
                        "eval/accuracy_before": 0.1,
                        "eval/accuracy": 0.1 + 0.01 * i * (step + 1) + 0.001 * seed,
                        "rollout/rollouts": 100,
                        "rollout/turns": 300,
                        "rollout/effective_ratio": 0.5,
                        "rollout/contrast_groups": 5,
                        "predictor/ece": 0.1,
                    }
                )
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_keep_stores_a_study_that_report_then_prints_and_update_writes_into_the_documents(
    tmp_path, monkeypatch, capsys
):
    pytest.importorskip("torch")  # the tables read runs through trace_rl.train.compare
    monkeypatch.chdir(tmp_path)
    _simulate_study(tmp_path / "runs" / "testbed_accuracy")
    assert main(["report", "keep=runs/testbed_accuracy"]) == 0
    assert "stored 14 runs of runs/testbed_accuracy as results/testbed_accuracy.jsonl.gz" in capsys.readouterr().out
    (tmp_path / "README.md").write_text("x\n<!-- report:testbed_accuracy -->\nstale\n<!-- /report -->\n")
    assert main(["report", "tables=testbed_accuracy", "update=true", "figures=img"]) == 0
    out = capsys.readouterr().out
    table = report.blocks((tmp_path / "README.md").read_text())["testbed_accuracy"]
    assert table in out and "updated README.md" in out
    rows = {line.split(" | ")[0].strip("| *"): line for line in table.splitlines()[2:]}
    assert list(rows) == ["grpo", "pcl", "knapsack_rl", "treepo", "tree_grpo", "trace", "trace_oracle"]
    assert "| 0.100 → 0.101 |" in rows["grpo"]  # start → end, the means over the 2 seeds
    assert "| 0.500 | 50 |" in rows["trace"]  # effective ratio; 5 groups per 100 rollouts
    assert "| - |" in rows["trace"]  # TRACE − itself
    pytest.importorskip("matplotlib")
    assert (tmp_path / "img" / "testbed_accuracy_vs_rollouts.png").is_file()


def test_each_study_names_a_command_that_parses():
    """The command a missing study names is one the command line accepts (keys it knows), so it can be rerun."""
    import shlex

    pytest.importorskip("torch")  # the LM commands' configs import the training layer
    from trace_rl.cli import COMMANDS
    from trace_rl.config import _overrides
    from trace_rl.results.published import STUDIES

    for study in STUDIES.values():
        name, *args = shlex.split(study.command)[1:]
        _overrides(COMMANDS[name].config_class(), args)  # raises ConfigError naming an unknown key
