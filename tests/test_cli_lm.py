import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.cli import main  # noqa: E402
from trace_rl.tree import load_trees, save_trees  # noqa: E402


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "tiny"
    code = main(
        [
            "sft",
            "policy.model=tiny",
            "steps=3",
            "sft.batch_size=2",
            "sft.eval_tasks=4",
            "sft.tasks=16",  # demonstrations encoded up front: 6 are drawn (3 steps of 2); the default 20,000 took 18 s
            f"out={out}",
            "policy.max_new_tokens=8",
        ]
    )
    assert code == 0 and (out / "config.json").exists() and (out / "sft_report.json").exists()
    assert (out / "config.yaml").exists()
    return out


def test_sft_report_episodes_warm_start_the_predictor(sft_model, tmp_path, capsys):
    trees = load_trees(sft_model / "sft_eval_trees.jsonl")
    assert len(trees) == 4 and all(len(t.rewards()) == 1 and t.root.token_ids for t in trees)
    common = [
        "rollout",
        f"policy.model={sft_model}",
        "methods=trace",
        "steps=1",
        "budget.prompts=2",
        "budget.rollouts_per_prompt=4",
        "policy.max_new_tokens=8",
        "progress=false",
    ]
    for t in trees:  # whatever the 3-step model did, label every report episode a failure
        next(n for n in t.turns() if n.terminal).reward = 0.0
    save_trees(tmp_path / "warm.jsonl", trees)
    assert main(common + [f"out={tmp_path / 'cold'}"]) == 0
    assert main(common + [f"out={tmp_path / 'warm'}", f"predictor.warmup={tmp_path / 'warm.jsonl'}"]) == 0
    assert "predictor warm-up: 4 trees, 4 rollouts" in capsys.readouterr().out

    def step0_roots(run):
        recs = [json.loads(line) for line in (tmp_path / run / "predictions.jsonl").read_text().splitlines()]
        return [r["predicted"] for r in recs if r["step"] == 0 and r["depth"] == 0]

    assert set(step0_roots("cold")) == {0.5} and max(step0_roots("warm")) < 0.5
    assert main(common + ["--predictor-warmup", str(tmp_path / "missing.jsonl")]) == 2  # the old spelling works
    err = capsys.readouterr().err
    assert "predictor.warmup" in err and len(err.strip().splitlines()) == 1


def test_rollout_compares_methods_on_a_local_model(sft_model, tmp_path, capsys):
    code = main(
        [
            "rollout",
            "--model",
            str(sft_model),
            "--methods",
            "grpo,trace",
            "--steps",
            "1",
            "--prompts",
            "2",
            "--rollouts-per-prompt",
            "4",
            "--max-new-tokens",
            "8",
            "--out",
            str(tmp_path),
            "--save-trees",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "groups_per_1k" in out and "trace" in out and (tmp_path / "rollout_summary.json").exists()
    rows = {r["method"]: r for r in json.loads((tmp_path / "rollout_summary.json").read_text())}
    # a flat method's flip rate is NaN, which the summary's strict JSON writes as null
    assert rows["grpo"]["flip_rate"] is None and 0 <= rows["trace"]["flip_rate"] <= 1
    assert (tmp_path / "effective_ratio.png").exists()
    trees = load_trees(tmp_path / "trees_trace.jsonl")
    assert trees and all(t.root.token_ids for t in trees)
    leaves = [n for t in trees for n in t.turns() if n.terminal]
    assert leaves and all(n.token_ids and len(n.loss_mask) == len(n.token_ids) and n.reward is not None for n in leaves)


def test_eval_reports_pass_at_k(sft_model, capsys):
    code = main(["eval", "env=calculator", f"policy.model={sft_model}", "limit=3", "k=1,2", "policy.max_new_tokens=8"])
    assert code == 0
    out = capsys.readouterr().out
    assert "pass@1" in out and "pass@2" in out


def test_bad_model_and_bad_sampling_are_one_line_errors(tmp_path, capsys):
    assert main(["rollout", "policy.model=./no/such/model", "steps=1", f"out={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "existing path" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["eval", "env=calculator", "policy.model=./x", "policy.top_p=0"]) == 2
    assert "top_p" in capsys.readouterr().err
    assert main(["rollout", "methods=trace_oracle", "steps=1"]) == 2
    assert "testbed" in capsys.readouterr().err


def test_diagnose_after_simulate(tmp_path, capsys):
    run = tmp_path / "sim"
    assert main(["simulate", "methods=grpo,trace", "steps=3", "budget.prompts=8", f"out={run}", "progress=false"]) == 0
    assert main(["diagnose", str(run)]) == 0
    out = capsys.readouterr().out
    assert "spearman" in out and "prefixes" in out
    assert "trace: flips of the prefixes stage 2 chose" in out and "grpo: reliability bins over the run" in out
    assert (run / "calibration_by_depth.png").exists() and (run / "spearman_over_steps.png").exists()
    assert (run / "reliability.png").exists()
    assert main(["diagnose", str(tmp_path / "nope")]) == 2


def test_bad_task_mix_is_one_line_error(capsys):
    assert main(["rollout", "--chain-steps", "1,x", "--steps", "1"]) == 2
    assert "env.calculator.chain_steps" in capsys.readouterr().err
    assert main(["rollout", "env.calculator.digits=4", "steps=1"]) == 2
    assert "env.calculator.digits" in capsys.readouterr().err
    assert main(["rollout", "predictor.prefix_share=1", "steps=1"]) == 2
    assert "predictor.prefix_share" in capsys.readouterr().err
    assert main(["rollout", "env.name=chess", "steps=1"]) == 2
    assert "env.name" in capsys.readouterr().err


def test_rollout_with_an_lm_critic_that_does_not_exist_is_one_line(sft_model, tmp_path, capsys):
    code = main(
        [
            "rollout",
            "--model",
            str(sft_model),
            "--methods",
            "trace",
            "--steps",
            "1",
            "--prompts",
            "2",
            "--predictor",
            str(tmp_path / "no-critic"),
            "--out",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "predictor.kind" in err and len(err.strip().splitlines()) == 1


def test_eval_writes_per_sample_results_and_reads_a_task_file(sft_model, tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps(
            {
                "prompt": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "Compute 2 +3"}],
                "reward_model": {"ground_truth": "5"},
                "extra_info": {"question": "Compute 2 +3"},
            }
        )
        + "\n"
    )
    out = tmp_path / "eval"
    args = [
        "eval",
        "env=calculator",
        f"policy.model={sft_model}",
        "limit=2",
        "k=1,2",
        "policy.max_new_tokens=8",
        f"out={out}",
    ]
    assert main(args) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and {"index", "sample", "score", "generation"} <= set(samples[0])
    assert (out / "config.yaml").exists()
    pytest.importorskip("math_verify")
    assert main(["eval", "env=math", f"policy.model={sft_model}", f"data={rows}", "policy.max_new_tokens=8"]) == 0
    assert "rows" in capsys.readouterr().out


def test_eval_refuses_a_prompt_longer_than_the_model_before_generating(tmp_path, capsys):
    from trace_rl.lm.models import create_tiny_model

    model, tok = create_tiny_model(hidden=32, layers=1, heads=2, max_positions=64)
    model.save_pretrained(tmp_path / "short")
    tok.save_pretrained(tmp_path / "short")
    capsys.readouterr()  # the save's own progress bar is not the command's output
    assert main(["eval", "env=calculator", f"policy.model={tmp_path / 'short'}", "limit=1"]) == 2
    err = capsys.readouterr().err
    assert "positions" in err and "max_new_tokens" in err and len(err.strip().splitlines()) == 1


def test_rollout_hands_the_flip_prior_to_stage_2(sft_model, tmp_path, monkeypatch):
    """`rollout` builds stage 2's layer from predictor.flip_prior as `train` does (it once dropped the setting)."""
    from trace_rl.experimental.flip import FlipPrior
    from trace_rl.rollout import engine

    FlipPrior(tuple([0.0] * 10), 0.5, 0.25, continuations=(3,) * 8, flips=(1,) * 8).save(tmp_path / "prior.json")
    seen, make = [], engine.make_flip_model  # the engine builds its layers from TRACE's configuration
    monkeypatch.setattr(engine, "make_flip_model", lambda *a, **k: seen.append(a) or make(*a, **k))
    argv = ["rollout", f"policy.model={sft_model}", "methods=trace", "steps=1", "budget.prompts=2",
            "budget.rollouts_per_prompt=4", "policy.max_new_tokens=8", "progress=false", f"out={tmp_path / 'r'}",
            "predictor.flip_model=calibrated", f"predictor.flip_prior={tmp_path / 'prior.json'}"]  # fmt: skip
    assert main(argv) == 0
    assert seen == [("calibrated", str(tmp_path / "prior.json"))]
