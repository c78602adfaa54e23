"""`trace-rl compare` over train on hand-computed cases: curves from the start, paired differences, costs to
GRPO's final accuracy, pairing checks, and resuming (finished runs are read, other settings refused); the runs
are a stand-in for train's runner that writes a finished run's files."""

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from trace_rl.commands import compare as compare_command  # noqa: E402
from trace_rl.commands import train as train_command  # noqa: E402
from trace_rl.commands.compare import CompareConfig  # noqa: E402
from trace_rl.methods import BudgetPlan  # noqa: E402
from trace_rl.rollout.report import at_equal_cost  # noqa: E402
from trace_rl.train import compare as cmp  # noqa: E402
from trace_rl.train.compare import (  # noqa: E402
    check_pairing,
    curves,
    format_compare,
    parse_method,
    run_dir_name,
    summarize_compare,
)
from trace_rl.train.trainer import TrainConfig  # noqa: E402


def run(seed, before, accs, tokens=(100, 100, 100, 100), er=0.5, groups=2, rollouts=10, **extra):
    """A finished run of 4 steps with evaluations after steps 2 and 4 (accs), `rollouts` per step."""
    recs = []
    for step in range(4):
        r = {
            "step": step,
            "rollout/rollouts": rollouts,
            "rollout/generated_tokens": tokens[step],
            "rollout/effective_ratio": er,
            "rollout/contrast_groups": groups,
            "train/rollouts_total": rollouts * (step + 1),
            "train/adv_nonzero_token_share": 0.25,
            "train/grad_norm": 1.0,
            "train/update_kl": 1e-3,
            "timing_s/total": 1.0,
        }
        if step in (1, 3):
            r["eval/accuracy"] = accs[step // 2]
        recs.append(r)
    return {
        "seed": seed,
        "accuracy_before": before,
        "accuracy_after": accs[-1],
        "accuracy_se": 0.01,
        "held_out_digest": f"h{seed}",
        "pools_digest": f"p{seed}",
        "records": recs,
        **extra,
    }


def test_curves_start_at_zero_cost_with_the_accuracy_before():
    c = curves(run(0, 0.4, [0.5, 0.6], tokens=(10, 20, 30, 40)))
    assert c["rollouts"][0].tolist() == [0, 20, 40] and c["rollouts"][1].tolist() == [0.4, 0.5, 0.6]
    assert c["tokens"][0].tolist() == [0, 30, 100]  # cumulative generated tokens at each evaluation


def test_summary_by_hand():
    runs = {
        "grpo": [run(0, 0.4, [0.5, 0.6]), run(1, 0.5, [0.5, 0.7])],
        "trace": [run(0, 0.4, [0.6, 0.7], er=1.0, groups=6), run(1, 0.5, [0.6, 0.8], er=1.0, groups=6)],
    }
    rows = {r["method"]: r for r in summarize_compare(runs)}
    t = rows["trace"]
    assert t["acc_after"]["mean"] == pytest.approx(0.75)
    # t interval over two seeds: 0.75 +- t(0.975, 1) * std(0.7, 0.8) / sqrt(2) = 0.75 +- 12.706 * 0.05
    assert t["acc_after"]["hi"] - 0.75 == pytest.approx(12.7062 * 0.05, rel=1e-4)
    assert t["gain"]["mean"] == pytest.approx(0.3)
    # paired differences to GRPO: 0.1 on both seeds, so every bootstrap mean is 0.1
    assert t["diff_vs_grpo"]["mean"] == pytest.approx(0.1) and t["diff_vs_grpo"]["lo"] == pytest.approx(0.1)
    # accuracy over the evaluations after the start: trace (0.6+0.7)/2, (0.6+0.8)/2; grpo 0.55, 0.6
    assert t["acc_mean"]["mean"] == pytest.approx((0.65 + 0.7) / 2)
    assert t["mean_diff_vs_grpo"]["mean"] == pytest.approx((0.1 + 0.1) / 2)
    assert rows["grpo"]["acc_mean"]["mean"] == pytest.approx((0.55 + 0.6) / 2)
    # seed 0: GRPO ends at 0.6; trace's curve (0, 0.4) (20, 0.6) reaches 0.6 at 20 rollouts
    # seed 1: GRPO ends at 0.7; trace's curve (0, 0.5) (20, 0.6) (40, 0.8) reaches 0.7 at 30 rollouts
    assert t["rollouts_to_grpo_final"]["mean"] == pytest.approx(25.0)
    assert t["rollouts_to_grpo_final"]["reached"] == 2
    assert t["tokens_to_grpo_final"]["mean"] == pytest.approx((200 + 300) / 2)
    assert t["er_vs_grpo"] == pytest.approx(2.0)
    assert t["groups_per_1k"]["mean"] == pytest.approx(1000 * 6 / 10)
    assert rows["grpo"]["rollouts_to_grpo_final"]["mean"] == pytest.approx(40.0)
    assert t["advantage"] == "trace" and t["seeds"] == [0, 1]
    table = format_compare(list(rows.values()))
    assert "+0.100 [+0.100, +0.100]" in table and "25 [" in table and "(2/2)" in table


def test_equal_tokens_reads_both_curves_at_the_smaller_token_total():
    # GRPO: (0, 0.4) (200, 0.5) (400, 0.6); the tree method spends half the tokens: (0, 0.4) (100, 0.6) (200, 0.7)
    grpo, tree = run(0, 0.4, [0.5, 0.6]), run(0, 0.4, [0.6, 0.7], tokens=(50, 50, 50, 50))
    assert at_equal_cost(curves(tree)["tokens"], curves(grpo)["tokens"]) == pytest.approx((0.7, 0.5))
    assert at_equal_cost(curves(grpo)["tokens"], curves(tree)["tokens"]) == pytest.approx((0.5, 0.7))
    # seed 1: GRPO (0, 0.5) (200, 0.6) (400, 0.8); the tree method ends at 300 tokens on 0.65, GRPO there 0.7
    runs = {
        "grpo": [grpo, run(1, 0.5, [0.6, 0.8])],
        "trace": [tree, run(1, 0.5, [0.6, 0.65], tokens=(75, 75, 75, 75))],
    }
    t = {r["method"]: r for r in summarize_compare(runs)}["trace"]
    assert t["tokens_diff_vs_grpo"]["mean"] == pytest.approx((0.2 - 0.05) / 2)
    assert t["diff_vs_grpo"]["mean"] == pytest.approx((0.1 - 0.15) / 2)  # final against final: the other sign


def test_a_method_that_never_reaches_grpo_final_says_so():
    runs = {"grpo": [run(0, 0.4, [0.5, 0.9])], "pcl": [run(0, 0.4, [0.5, 0.6])]}
    rows = {r["method"]: r for r in summarize_compare(runs)}
    reach = rows["pcl"]["rollouts_to_grpo_final"]
    assert reach["reached"] == 0 and math.isnan(reach["mean"])
    assert "pcl" in format_compare(list(rows.values()))


def test_pairing_is_checked_per_seed():
    paired = {"grpo": [run(0, 0.4, [0.5, 0.6])], "trace": [run(0, 0.4, [0.5, 0.6])]}
    assert check_pairing(paired) == []
    other = {"grpo": [run(0, 0.4, [0.5, 0.6])], "trace": [run(0, 0.45, [0.5, 0.6], pools_digest="zz")]}
    problems = check_pairing(other)
    assert len(problems) == 2 and "pools_digest" in problems[0] and "accuracy_before" in problems[1]


def test_methods_with_an_advantage_estimator():
    assert parse_method("trace:grpo") == ("trace", "grpo") and parse_method("pcl") == ("pcl", "")
    assert run_dir_name("trace:grpo") == "trace_adv-grpo"
    assert [cmp.method_of_dir(run_dir_name(m)) for m in ("trace:grpo", "pcl")] == ["trace:grpo", "pcl"]
    CompareConfig(methods=["grpo", "trace:tree_grpo"])
    with pytest.raises(ValueError, match="advantage"):
        CompareConfig(methods=["trace:nope"])
    with pytest.raises(ValueError, match="unknown"):
        CompareConfig(methods=["nope"])
    with pytest.raises(ValueError, match="twice"):
        CompareConfig(methods=["grpo", "grpo"])


def _fake_train(calls):
    def train(cfg, config_yaml="", before=None, on_before=None):
        calls.append((cfg.method, cfg.advantage, cfg.seed, cfg.resume))
        out = Path(cfg.out)
        r = run(cfg.seed, 0.4, [0.5, 0.6])
        lines = [json.dumps({**x, "method": cfg.method}) for x in r["records"]]
        (out / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
        summary = {k: v for k, v in r.items() if k != "records"}
        (out / "train_summary.json").write_text(json.dumps({**summary, "steps": cfg.steps, "method": cfg.method}))
        return summary

    return train


@pytest.fixture
def built_warm_starts(monkeypatch):
    """compare builds the warm starts before any run: here, a stand-in that only records which."""
    import trace_rl.train.trainer as trainer

    built = []
    monkeypatch.setattr(trainer, "ensure_policy", lambda cfg: built.append(cfg.policy.model) or {})
    return built


@pytest.fixture
def train_calls(monkeypatch, built_warm_starts):
    """compare with `_fake_train` as train's runner and no plots; the runner's calls."""
    calls = []
    monkeypatch.setattr(train_command, "run", _fake_train(calls))
    monkeypatch.setattr(cmp, "plot_compare", lambda runs, out: None)
    return calls


@pytest.fixture
def grpo_run(tmp_path, train_calls):
    """A finished GRPO run of 4 steps on seed 0 under tmp_path: its compare config, the path of its
    run_settings.json and what that file holds."""
    cfg = CompareConfig(out=str(tmp_path), methods=["grpo"], seeds=[0], train=TrainConfig(steps=4))
    compare_command.run(cfg)
    path = tmp_path / "grpo" / "seed0" / "run_settings.json"
    return cfg, path, json.loads(path.read_text())


def test_finished_runs_are_read_not_rerun_and_other_settings_are_refused(tmp_path, train_calls):
    calls = train_calls
    cfg = CompareConfig(out=str(tmp_path), methods=["grpo", "trace:grpo"], seeds=[0], train=TrainConfig(steps=4))
    rows = compare_command.run(cfg)
    assert calls == [("grpo", "", 0, True), ("trace", "grpo", 0, True)]
    assert [r["method"] for r in rows] == ["grpo", "trace:grpo"] and rows[1]["advantage"] == "grpo"
    assert (tmp_path / "trace_adv-grpo" / "seed0" / "run_settings.json").is_file()
    compare_command.run(cfg)
    assert len(calls) == 2  # both finished: read
    # a study grown later: more seeds of grpo, and the table covers every finished run of the listed methods
    more = CompareConfig(out=str(tmp_path), methods=["grpo"], seeds=[1], train=TrainConfig(steps=4))
    compare_command.run(more)
    rows = compare_command.run(
        CompareConfig(out=str(tmp_path), methods=["grpo"], seeds=[0], train=TrainConfig(steps=4))
    )
    assert rows[0]["seeds"] == [0, 1] and len(calls) == 3
    changed = CompareConfig(out=str(tmp_path), methods=["grpo"], seeds=[0], train=TrainConfig(steps=4, eval_tasks=9))
    with pytest.raises(ValueError, match="other settings.*eval_tasks"):
        compare_command.run(changed)
    # GRPO never branches: its runs serve a study at another branch factor, weighting or flip model; a branching
    # method's are refused
    other_n = TrainConfig(steps=4, budget=BudgetPlan(prompts=8, branch_factor=2))
    other_n.weighting = "leaf"
    other_n.predictor.flip_model = "calibrated" if other_n.predictor.flip_model == "raw" else "raw"
    compare_command.run(CompareConfig(out=str(tmp_path), methods=["grpo"], seeds=[0, 1], train=other_n))
    assert len(calls) == 3
    with pytest.raises(ValueError, match="other settings.*budget.branch_factor.*weighting"):
        compare_command.run(CompareConfig(out=str(tmp_path), methods=["trace:grpo"], seeds=[0], train=other_n))
    (tmp_path / "grpo" / "seed0" / "run_settings.json").unlink()  # seed 0 trains anew; seed 1 is still refused
    with pytest.raises(ValueError, match="seed1 holds a run with other settings"):
        compare_command.run(changed)


def test_standard_errors_of_an_evaluation_by_hand():
    from trace_rl.train.trainer import accuracy_se

    # task 0: 2 of 2 correct, task 1: 1 of 2, task 2: 0 of 2 -> per-task means 1, 0.5, 0
    results = [{"index": i, "score": s} for i, scores in enumerate([(1, 1), (1, 0), (0, 0)]) for s in scores]
    over_tasks, sampling = accuracy_se(results, 3)
    assert over_tasks == pytest.approx(0.5 / math.sqrt(3))  # std(1, 0.5, 0) = 0.5
    # sampling: only task 1 varies, c (S - c) / (S^2 (S - 1)) = 1 / 4 -> sqrt(1/4) / 3
    assert sampling == pytest.approx(0.5 / 3)
    assert math.isnan(accuracy_se([{"index": 0, "score": 1}, {"index": 1, "score": 0}], 2)[1])


def test_pairs_span_warm_starts_and_the_table_names_tuning_seeds(tmp_path, train_calls, built_warm_starts):
    calls = train_calls
    cfg = CompareConfig(
        out=str(tmp_path), methods=["grpo"], seeds=[100], warm_starts=[0, 1], train=TrainConfig(steps=4)
    )
    rows = compare_command.run(cfg)
    assert built_warm_starts == ["tiny@0", "tiny@1"] and len(calls) == 2  # built first, once each
    assert (tmp_path / "grpo" / "seed100").is_dir() and (tmp_path / "grpo" / "ws1-seed100").is_dir()
    assert json.loads((tmp_path / "grpo" / "ws1-seed100" / "run_settings.json").read_text())["policy"]["model"] == (
        "tiny@1"
    )
    assert rows[0]["pairs"] == ["seed100", "ws1-seed100"] and rows[0]["warm_starts"] == [0, 1]
    assert "evaluation seeds only" in format_compare(rows)
    assert "TUNING seeds [3]" in format_compare(summarize_compare({"grpo": [run(3, 0.4, [0.5, 0.6])]}))
    assert cmp.parse_pair("ws2-seed7") == (2, 7) and cmp.parse_pair("seed7") == (0, 7) and not cmp.parse_pair("x")
    with pytest.raises(ValueError, match="warm_starts"):
        CompareConfig(warm_starts=[0, 0])
    with pytest.raises(ValueError, match="only the tiny policy"):
        CompareConfig(warm_starts=[0, 1], train=TrainConfig(policy=type(TrainConfig().policy)(model="random-tiny")))


def test_runs_of_one_pair_started_together_evaluate_the_start_once(tmp_path):
    import threading

    evaluations = []

    def fake_train(cfg, config_yaml="", before=None, on_before=None):
        if before is None:
            threading.Event().wait(0.2)  # the pair's other run starts meanwhile
            evaluations.append(cfg.method)
            on_before({"accuracy": 0.5})
        return {}

    cfg = CompareConfig(out=str(tmp_path), methods=["grpo", "trace"], seeds=[100], train=TrainConfig(steps=4))
    threads = [threading.Thread(target=cmp.run_one, args=(cfg, m, 100, 0, fake_train)) for m in cfg.methods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(evaluations) == 1
    assert json.loads((tmp_path / "before_seed100.json").read_text())["before"] == {"accuracy": 0.5}


def test_a_run_from_before_a_setting_existed_is_read_while_that_setting_is_at_its_default(
    tmp_path, train_calls, grpo_run
):
    """A setting added to the code after a run was made keeps the old behaviour at its default: the run is read,
    and refused once the setting is set otherwise."""
    calls = train_calls
    cfg, path, stored = grpo_run
    del stored["update"]["max_update_kl"]  # as written by a version without the setting
    del stored["eval_tasks"]
    path.write_text(json.dumps(stored))
    compare_command.run(cfg)
    assert len(calls) == 1  # read, not rerun
    bounded_otherwise = TrainConfig(steps=4)
    bounded_otherwise.update.max_update_kl = 0.05
    with pytest.raises(ValueError, match=r"other settings \(differs in update.max_update_kl\)"):
        compare_command.run(CompareConfig(out=str(tmp_path), methods=["grpo"], seeds=[0], train=bounded_otherwise))
    stored["steps"] = 5  # a setting the run does hold, with another value, still differs
    path.write_text(json.dumps(stored))
    with pytest.raises(ValueError, match=r"differs in steps"):
        compare_command.run(cfg)


def test_a_run_whose_env_settings_predate_plugins_is_read_and_another_mix_refused(tmp_path, train_calls, grpo_run):
    """A study's runs from when every env's keys sat flat in `env` are read as the same runs today (their mix in
    the calculator's group), so a study grows across the change; a run of another mix is still refused."""
    from trace_rl.stack.env_config import env_config

    calls = train_calls
    cfg, path, stored = grpo_run
    assert stored["env"] == {"name": "calculator", "calculator": {"preset": "train", "chain_steps": [], "digits": []}}
    flat = {"name": "calculator", "chain_steps": [3, 4, 5], "digits": [2], "corpus": "", "retriever_url": ""}
    path.write_text(json.dumps({**stored, "env": {**flat, "sandbox": "strict"}}))  # as written before plug-ins
    compare_command.run(cfg)
    assert len(calls) == 1  # read, not rerun
    wide = TrainConfig(steps=4, env=env_config("calculator", preset="rl"))
    with pytest.raises(ValueError, match=r"other settings \(differs in env.calculator.preset\)"):
        compare_command.run(CompareConfig(out=str(tmp_path), methods=["grpo"], seeds=[0], train=wide))


def test_a_study_says_what_it_runs_logs_each_run_in_its_folder_and_skips_plots_in_one_line(
    tmp_path, monkeypatch, capsys, built_warm_starts
):
    import sys

    from trace_rl.plots import SKIPPED

    calls = []
    monkeypatch.setattr(train_command, "run", _fake_train(calls))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed: the study still finishes
    cfg = CompareConfig(out=str(tmp_path), methods=["grpo", "trace"], seeds=[100], train=TrainConfig(steps=4))
    compare_command.run(cfg)
    got = capsys.readouterr()
    err = got.err.splitlines()
    assert err[0] == "compare: 2 runs to go; each run's output also goes to its folder's run.log"
    assert err[1] == f"== grpo, seed 100 (run 1 of 2, in {tmp_path / 'grpo' / 'seed100'})"
    assert err[2].startswith("compare: 1 of 2 runs done in ") and err[2].endswith(" left")
    assert err[3].startswith("== trace, seed 100 (run 2 of 2, in ")
    assert err[4].startswith("compare: 2 of 2 runs done in ") and "left" not in err[4]
    assert got.err.count(SKIPPED) == 1 and not list(tmp_path.glob("*.png"))
    assert got.out.splitlines()[-1] == (
        f"wrote {tmp_path}/compare_summary.json, compare_summary.txt; each run's folder holds its run.log"
    )
    assert "== grpo, seed 100" in (tmp_path / "grpo" / "seed100" / "run.log").read_text()
    compare_command.run(cfg)  # again: both finished, read
    assert capsys.readouterr().err.startswith("compare: 0 runs to go (2 finished ones read, not rerun)")
    assert len(calls) == 2


def test_the_table_names_the_policy_the_runs_started_from():
    tiny = run(100, 0.4, [0.5, 0.6], warm_start={"path": "/cache/tiny-0", "key": "k0"})
    assert "warm starts: tiny@0; evaluation seeds only" in format_compare(summarize_compare({"grpo": [tiny]}))
    smoke = run(100, 0.4, [0.5, 0.6], warm_start={"path": "random-tiny"})
    note = format_compare(summarize_compare({"grpo": [smoke]}))
    assert "start policies: random-tiny; " in note and "tiny@0" not in note  # not a warm start: not called one
