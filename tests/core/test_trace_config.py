"""TRACE's one configuration: its names and defaults, its one check of each setting, reading it from plain
settings (verl's YAML block, TRL's keyword arguments) with renamed and framework-set keys refused in one line."""

import subprocess
import sys
from pathlib import Path

import pytest

from trace_rl.advantages import ADVANTAGES
from trace_rl.methods import BudgetPlan as MethodsBudgetPlan
from trace_rl.methods import get_method
from trace_rl.trace_config import (
    METHODS,
    PREFIX_SHARE,
    BudgetPlan,
    PredictorSettings,
    TraceConfig,
    check_advantage,
    check_method,
    check_methods,
    check_predictor_kind,
    check_prefix_share,
)

SRC = Path(__file__).resolve().parents[2] / "src"


def test_importing_and_building_it_needs_no_numpy():
    code = (
        "import sys; from trace_rl.trace_config import TraceConfig; TraceConfig(); "
        "TraceConfig.from_settings({'budget': {'branch_factor': 2}}, 'x'); "
        "assert 'numpy' not in sys.modules, 'numpy was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(SRC)})
    assert proc.returncode == 0, proc.stderr


def test_defaults_are_the_command_line_defaults():
    cfg = TraceConfig()
    assert (cfg.method, cfg.advantage, cfg.weighting) == ("trace", "", "first")
    assert (
        cfg.budget == BudgetPlan() and cfg.predictor == PredictorSettings("light", PREFIX_SHARE) and PREFIX_SHARE == 0.5
    )
    assert cfg.advantage_name == "trace" and TraceConfig("tree_grpo").advantage_name == "tree_grpo"
    assert TraceConfig("tree_grpo", advantage="grpo").advantage_name == "grpo"
    assert MethodsBudgetPlan is BudgetPlan and get_method("trace") is METHODS["trace"]  # methods re-exports them


def test_every_method_trains_with_a_known_estimator():
    assert {m.advantage for m in METHODS.values()} <= set(ADVANTAGES)


def test_batch_plan_is_the_frameworks_plan():
    plan = TraceConfig(budget=BudgetPlan(branch_factor=3, max_per_prompt=12)).batch_plan(16, 4)
    assert plan == BudgetPlan(prompts=16, rollouts_per_prompt=4, branch_factor=3, pool_factor=1, max_per_prompt=12)
    flat = TraceConfig("grpo", budget=BudgetPlan(branch_factor=3)).batch_plan(16, 4, max_per_prompt=5)
    assert flat.branch_factor == 0 and flat.max_per_prompt == 5 and flat.root_budget(get_method("grpo")) == 64


@pytest.mark.parametrize(
    "check, args, message",
    [
        (check_method, ("nope",), "method: unknown 'nope'; choose from trace"),
        (check_method, ("trace_oracle", "method", False), "exact V"),
        (check_methods, ([],), "methods: none given"),
        (check_methods, (["grpo", "trace", "grpo"],), "methods: grpo given more than once"),
        (check_methods, (["trace_oracle"], "methods", False), "oracle methods need the exact V"),
        (check_advantage, ("ppo",), "advantage: unknown 'ppo'"),
        (check_prefix_share, (1.0,), "prefix_share must be in [0, 1), got 1.0"),
        (check_prefix_share, ("half",), "prefix_share must be in [0, 1)"),
        (check_predictor_kind, ("light_text",), "now called 'light'"),
        (check_predictor_kind, ("smollm2-135m",), "is not light or history"),
        (check_predictor_kind, ("bad name", "kind", ("smollm2-135m",)), "an LM critic backbone (smollm2-135m"),
    ],
)
def test_each_check_is_one_line_naming_its_key(check, args, message):
    with pytest.raises(ValueError) as err:
        check(*args)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_checks_accept_what_is_allowed():
    check_methods(["grpo", "trace_oracle"])
    check_advantage("")
    check_prefix_share(0)
    for kind in ("light", "history"):
        check_predictor_kind(kind)
    check_predictor_kind("org/critic", critics=())  # a hub id, where LM critics are allowed
    assert TraceConfig(predictor=PredictorSettings("smollm2-135m")).predictor.kind == "smollm2-135m"


def test_from_settings_reads_nested_plain_settings():
    got = TraceConfig.from_settings(
        {"method": "tree_grpo", "advantage": None, "budget": {"branch_factor": 2}, "predictor": {"prefix_share": 0.1}},
        "x",
    )
    assert got == TraceConfig("tree_grpo", "", BudgetPlan(branch_factor=2), PredictorSettings("light", 0.1))
    assert TraceConfig.from_settings(None, "x") == TraceConfig()


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"estimator": "grpo"}, "x.estimator: renamed; set x.advantage"),
        ({"budget": {"prompts": 4}}, "x.budget.prompts: not a setting here; the framework's"),
        ({"budget": {"prompt": 4}}, "x.budget.prompt: unknown setting; settings are advantage, budget.branch_factor"),
        ({"budget": 4}, "x.budget: unknown setting"),
        ({"method": "trace_oracle"}, "x.method: unknown 'trace_oracle'"),
        ({"predictor": {"kind": "org/critic"}}, "x.predictor.kind: 'org/critic' is not light or history"),
        ({"predictor": {"prefix_share": -0.1}}, "x.predictor.prefix_share must be in [0, 1), got -0.1"),
        ({"budget": {"branch_factor": -1}}, "x.budget.branch_factor must be >= 0, got -1"),
        ({"budget": {"max_per_prompt": "8"}}, "x.budget.max_per_prompt must be an integer, got '8'"),
        ({"weighting": "all"}, "x.weighting must be one of first, split, leaf, got 'all'"),
        ({"advantage": "ppo"}, "x.advantage: unknown 'ppo'"),
    ],
)
def test_from_settings_refuses_in_one_line_naming_the_full_key(settings, message):
    with pytest.raises(ValueError) as err:
        TraceConfig.from_settings(
            settings, "x", renamed={"estimator": "advantage"}, fixed={"budget.prompts": "the framework's"}
        )
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
