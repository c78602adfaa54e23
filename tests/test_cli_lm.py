import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.cli import main  # noqa: E402
from trace_rl.tree import load_trees, save_trees  # noqa: E402


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "tiny"
    code = main(["sft", "--model", "tiny", "--minutes", "0.05", "--max-steps", "3", "--batch-size", "2",
                 "--eval-tasks", "4", "--out", str(out), "--max-new-tokens", "8"])
    assert code == 0 and (out / "config.json").exists() and (out / "sft_report.json").exists()
    return out


def test_sft_report_episodes_warm_start_the_predictor(sft_model, tmp_path, capsys):
    trees = load_trees(sft_model / "sft_eval_trees.jsonl")
    assert len(trees) == 4 and all(len(t.rewards()) == 1 and t.root.token_ids for t in trees)
    common = ["rollout", "--model", str(sft_model), "--methods", "trace", "--steps", "1", "--prompts", "2",
              "--rollouts-per-prompt", "4", "--max-new-tokens", "8"]
    for t in trees:  # whatever the 3-step model did, label every report episode a failure
        next(n for n in t.turns() if n.terminal).reward = 0.0
    save_trees(tmp_path / "warm.jsonl", trees)
    assert main(common + ["--out", str(tmp_path / "cold")]) == 0
    assert main(common + ["--out", str(tmp_path / "warm"), "--predictor-warmup", str(tmp_path / "warm.jsonl")]) == 0
    assert "predictor warm-up: 4 trees, 4 rollouts" in capsys.readouterr().out

    def step0_roots(run):
        recs = [json.loads(line) for line in (tmp_path / run / "predictions.jsonl").read_text().splitlines()]
        return [r["predicted"] for r in recs if r["step"] == 0 and r["depth"] == 0]

    assert set(step0_roots("cold")) == {0.5} and max(step0_roots("warm")) < 0.5
    assert main(common + ["--predictor-warmup", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "--predictor-warmup" in err and len(err.strip().splitlines()) == 1


def test_rollout_compares_methods_on_a_local_model(sft_model, tmp_path, capsys):
    code = main(["rollout", "--model", str(sft_model), "--methods", "grpo,trace", "--steps", "1", "--prompts", "2",
                 "--rollouts-per-prompt", "4", "--max-new-tokens", "8", "--out", str(tmp_path), "--save-trees"])
    assert code == 0
    out = capsys.readouterr().out
    assert "groups_per_1k_rollouts" in out and "trace" in out and (tmp_path / "rollout_summary.json").exists()
    rows = {r["method"]: r for r in json.loads((tmp_path / "rollout_summary.json").read_text())}
    assert rows["grpo"]["flip_rate"] != rows["grpo"]["flip_rate"] and 0 <= rows["trace"]["flip_rate"] <= 1  # nan: flat
    assert (tmp_path / "effective_ratio.png").exists()
    trees = load_trees(tmp_path / "trees_trace.jsonl")
    assert trees and all(t.root.token_ids for t in trees)
    leaves = [n for t in trees for n in t.turns() if n.terminal]
    assert leaves and all(n.token_ids and len(n.loss_mask) == len(n.token_ids) and n.reward is not None for n in leaves)


def test_eval_reports_pass_at_k(sft_model, capsys):
    code = main(["eval", "--env", "calculator", "--model", str(sft_model), "--limit", "3", "--k", "1,2",
                 "--max-new-tokens", "8"])
    assert code == 0
    out = capsys.readouterr().out
    assert "pass@1" in out and "pass@2" in out


def test_bad_model_and_bad_sampling_are_one_line_errors(tmp_path, capsys):
    assert main(["rollout", "--model", "./no/such/model", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["eval", "--env", "calculator", "--model", "./x", "--top-p", "0"]) == 2
    assert "top_p" in capsys.readouterr().err
    assert main(["rollout", "--methods", "trace_oracle", "--steps", "1"]) == 2
    assert "testbed" in capsys.readouterr().err


def test_diagnose_after_simulate(tmp_path, capsys):
    run = tmp_path / "sim"
    assert main(["simulate", "--methods", "grpo,trace", "--steps", "3", "--prompts", "8", "--out", str(run)]) == 0
    assert main(["diagnose", str(run)]) == 0
    out = capsys.readouterr().out
    assert "spearman" in out and "prefixes" in out
    assert (run / "calibration_by_depth.png").exists() and (run / "spearman_over_steps.png").exists()
    assert main(["diagnose", str(tmp_path / "nope")]) == 2


def test_bad_task_mix_is_one_line_error(capsys):
    assert main(["rollout", "--chain-steps", "1,x", "--steps", "1"]) == 2
    assert "--chain-steps" in capsys.readouterr().err
    assert main(["rollout", "--digits", "4", "--steps", "1"]) == 2
    assert "--digits" in capsys.readouterr().err
    assert main(["rollout", "--prefix-share", "1", "--steps", "1"]) == 2
    assert "--prefix-share" in capsys.readouterr().err


def test_rollout_with_an_lm_critic_that_does_not_exist_is_one_line(sft_model, tmp_path, capsys):
    code = main(["rollout", "--model", str(sft_model), "--methods", "trace", "--steps", "1", "--prompts", "2",
                 "--predictor", str(tmp_path / "no-critic"), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "--predictor" in err and len(err.strip().splitlines()) == 1
