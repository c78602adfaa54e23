"""`trace-rl compare` over a command: the chosen command's group in --help and config.yaml, one line for a
command it does not run, and `command=rollout` on a tiny random model: every run is an ordinary `trace-rl rollout`
run, and the paired summary's numbers are those runs' records."""

import json
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers_coin import COIN  # noqa: E402

from trace_rl.cli import COMMANDS, main  # noqa: E402
from trace_rl.commands import compare  # noqa: E402
from trace_rl.config import load_config  # noqa: E402
from trace_rl.rollout.records import read_metrics  # noqa: E402
from trace_rl.rollout.report import OVER_SEEDS, summarize  # noqa: E402

SMALL = [
    "policy.model=random-tiny",
    "budget.prompts=2",
    "budget.rollouts_per_prompt=4",
    "budget.branch_factor=2",
    "budget.pool_factor=2",
    "budget.max_per_prompt=4",
    "policy.max_new_tokens=6",
    "steps=2",
    "progress=false",
]


@pytest.fixture
def coin_env(env_module):
    return env_module("coin_env", COIN) + ":coin"


def test_help_lists_the_chosen_commands_group_and_not_what_compare_sets_per_run(capsys):
    assert main(["compare", "--help"]) == 0
    text = capsys.readouterr().out
    assert "command='train'" in text and "train.steps=" in text and "rollout." not in text
    assert main(["compare", "command=rollout", "--help"]) == 0
    text = capsys.readouterr().out
    assert "command='rollout'" in text and "rollout.steps=" in text and "train." not in text
    assert "rollout.seed=" not in text and "rollout.methods=" not in text and "rollout.out=" not in text


def test_a_command_compare_does_not_run_is_one_line_naming_those_it_does(capsys):
    for bad in ("simulate", "nope"):
        assert main(["compare", f"command={bad}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "command" in err and "train, rollout" in err, err
    assert main(["compare", "command=rollout", "methods=grpo,trace:grpo"]) == 2  # no update: no advantage
    assert "methods" in capsys.readouterr().err


def test_each_run_goes_through_the_command_tables_runner():
    # compare calls these modules' `run` at call time (so a stand-in patched there is what runs: test_compare)
    assert COMMANDS["train"].runner() is compare.train_command.run
    assert COMMANDS["rollout"].runner() is compare.rollout_command.run


def test_rollout_over_two_methods_and_two_seeds_pairs_the_runs_records(tmp_path, coin_env, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "command=rollout", f"out={out}", "methods=grpo,trace", "seeds=3,4"]
    args += [f"rollout.{a}" for a in [*SMALL, f"env.name={coin_env}"]]
    assert main(args) == 0
    assert "er_diff_vs_grpo" in capsys.readouterr().out
    rows = {r["method"]: r for r in json.loads((out / "compare_summary.json").read_text())}
    assert list(rows) == ["grpo", "trace"] and rows["trace"]["pairs"] == ["seed3", "seed4"]
    own = {}  # each run's own summary, from its own records
    for method in rows:
        for seed in (3, 4):
            run = out / method / f"seed{seed}"
            own[method, seed] = summarize(read_metrics(run / "metrics.jsonl"))[0]
            alone = json.loads((run / "rollout_summary.json").read_text())[0]  # what `trace-rl rollout` wrote
            assert {k: alone[k] for k in ("effective_ratio", "groups_per_1k", "tokens")} == {
                k: own[method, seed][k] for k in ("effective_ratio", "groups_per_1k", "tokens")
            }
    for method, row in rows.items():
        for key in OVER_SEEDS:
            # strict JSON: a NaN (GRPO's flips per continuation: it never branches) is null in the file
            per_seed = [math.nan if v is None else v for v in row[key]["per_seed"]]
            assert per_seed == pytest.approx([own[method, s][key] for s in (3, 4)], nan_ok=True)
        assert row["tokens"] == pytest.approx((own[method, 3]["tokens"] + own[method, 4]["tokens"]) / 2)
    ers = [own[m, s]["effective_ratio"] for m in rows for s in (3, 4)]
    assert max(ers) > 0  # the coin mixes the trees, so the numbers compared are not all zero
    diff = [own["trace", s]["effective_ratio"] - own["grpo", s]["effective_ratio"] for s in (3, 4)]
    assert rows["trace"]["effective_ratio_diff"]["mean"] == pytest.approx(sum(diff) / 2)
    assert rows["trace"]["effective_ratio_diff"]["seeds"] == 2
    # a run is an ordinary rollout run: its config.yaml reproduces its records alone
    assert main(["rollout", "--config", str(out / "trace" / "seed4" / "config.yaml"), f"out={tmp_path / 'alone'}"]) == 0

    def untimed(path):
        return [{k: v for k, v in r.items() if not k.startswith("timing_s/")} for r in read_metrics(path)["trace"]]

    assert untimed(tmp_path / "alone" / "metrics.jsonl") == untimed(out / "trace" / "seed4" / "metrics.jsonl")
    # the command is chosen in a --config file as on the command line; the study's config.yaml names it
    assert "command: rollout" in (out / "config.yaml").read_text()
    (tmp_path / "study.yaml").write_text("command: rollout\nrollout:\n  steps: 2\n")
    cfg, _ = load_config(compare.CompareConfig, ["--config", str(tmp_path / "study.yaml")])
    assert type(cfg) is compare.RolloutCompareConfig and cfg.rollout.steps == 2
    # a second invocation reads the finished runs
    stamp = (out / "grpo" / "seed3" / "metrics.jsonl").stat().st_mtime_ns
    assert main(args) == 0
    assert (out / "grpo" / "seed3" / "metrics.jsonl").stat().st_mtime_ns == stamp
    assert main([*args, "rollout.budget.rollouts_per_prompt=2"]) == 2  # a run of other settings: refused
    assert "other settings" in capsys.readouterr().err


def test_two_workers_label_every_line_with_its_run_and_keep_each_runs_log_in_its_folder(tmp_path, coin_env, capfd):
    out = tmp_path / "cmp"
    args = ["compare", "command=rollout", f"out={out}", "methods=grpo,trace", "seeds=3", "workers=2"]
    args += [f"rollout.{a}" for a in [*SMALL, f"env.name={coin_env}"] if a != "progress=false"]
    assert main(args) == 0
    got = capfd.readouterr()
    assert "compare: 2 runs to go, 2 at once, each line labelled [method pair]" in got.err
    assert "compare: 2 of 2 runs done in " in got.err
    for method, other in (("grpo", "trace"), ("trace", "grpo")):
        label = f"[{method} seed3] "
        err = [line.removeprefix(label) for line in got.err.splitlines() if line.startswith(label)]
        assert err[0].startswith(f"== {method}, seed 3 (run ") and f"in {out / method / 'seed3'})" in err[0]
        assert any(line.startswith(f"{method:<18} step 2/2  effective ratio") for line in err)  # its last step
        final = [line.removeprefix(label) for line in got.out.splitlines() if line.startswith(label)]
        assert final[-1].startswith(f"wrote {out / method / 'seed3'}/config.yaml, rollout_summary.json")
        log = (out / method / "seed3" / "run.log").read_text()
        assert f"== {method}, seed 3" in log and final[-1] in log and f"== {other}" not in log
    # the parent's own lines carry no run label; the table follows the runs
    assert "wrote " + str(out) + "/compare_summary.json" in got.out
