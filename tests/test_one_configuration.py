"""TRACE's one configuration, whole (issue 48, item 3): one YAML block, the predictor's settings and the calibration
layers included, read by the command line's loader (`train`; `rollout` and `simulate`, which run several methods,
name them `methods`), by verl's config reader (`TraceSettings.from_config`, no verl import) and by TRL's (the
keyword arguments of `TraceRolloutFunc`, `trl.rollout.trace_config`, no TRL import), gives equal `TraceConfig`s;
the old names are refused alike, each in one line naming the new key; and the frameworks carry the layers."""

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from trace_rl.config import load_config
from trace_rl.errors import ConfigError
from trace_rl.experimental.flip import FlipCalibrator
from trace_rl.experimental.root_calibration import RootCalibrator
from trace_rl.integrations.trl.rollout import trace_config as trl_config
from trace_rl.integrations.verl.budgets import TraceSettings
from trace_rl.integrations.verl.predictor_state import layer_bytes, load_layer, shared_layers
from trace_rl.methods import BudgetPlan
from trace_rl.stack.env_config import upgrade_run_settings
from trace_rl.testbed.simulate import SimulateConfig
from trace_rl.trace_config import PredictorSettings, TraceConfig

BLOCK = """
method: trace
advantage: tree_grpo
budget:
  branch_factor: 2
  max_per_prompt: 6
predictor:
  kind: history
  prefix_share: 0.25
  lr: 0.05
  flip_model: calibrated
  flip_prior: ''
  root_model: calibrated
weighting: split
"""
WANT = TraceConfig(
    "trace",
    "tree_grpo",
    BudgetPlan(branch_factor=2, max_per_prompt=6),
    PredictorSettings("history", 0.25, lr=0.05, flip_model="calibrated", root_model="calibrated"),
    "split",
)


def _file(tmp_path, block: dict, name: str = "trace.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(block))
    return str(path)


def _several(block: dict) -> dict:
    """The block as a command that runs several methods takes it: `methods: [m]` for `method: m`."""
    out = {k: v for k, v in block.items() if k != "method"}
    return {**out, "methods": [block["method"]]}


def readers(tmp_path, block: dict) -> dict:
    """The TRACE configuration each reader makes of `block` (the command line's budget.prompts given apart: it is
    the frameworks' own setting, refused in their blocks)."""
    pytest.importorskip("torch")
    from trace_rl.train.trainer import TrainConfig

    train, _ = load_config(TrainConfig, ["--config", _file(tmp_path, block), "budget.prompts=32"])
    simulate, _ = load_config(SimulateConfig, ["--config", _file(tmp_path, _several(block), "sim.yaml")])
    verl = TraceSettings.from_config({**copy.deepcopy(block), "seed": 0})
    kwargs = copy.deepcopy(block)
    trl = trl_config(kwargs.pop("method"), kwargs.pop("advantage"), kwargs.pop("budget"), kwargs.pop("predictor"),
                     kwargs.pop("weighting"), kwargs)  # fmt: skip
    return {
        "train": train.trace_config(),
        "simulate": simulate.trace_config(simulate.methods[0]),
        "verl": verl.config,
        "trl": trl,
    }


def test_one_block_with_the_calibration_layers_gives_one_configuration_to_every_reader(tmp_path):
    block = yaml.safe_load(BLOCK)
    got = readers(tmp_path, block)
    assert got == dict.fromkeys(got, WANT)


def test_the_rollout_command_reads_the_same_predictor_group(tmp_path):
    pytest.importorskip("torch")
    from trace_rl.commands.rollout import RolloutConfig

    block = {k: v for k, v in yaml.safe_load(BLOCK).items() if k not in ("weighting", "advantage")}  # no update here
    cfg, _ = load_config(RolloutConfig, ["--config", _file(tmp_path, _several(block)), "policy.model=random-tiny"])
    assert cfg.predictor.settings() == WANT.predictor and cfg.budget == BudgetPlan(branch_factor=2, max_per_prompt=6)


@pytest.mark.parametrize(
    "old, new",
    [({"update": {"weighting": "split"}}, "weighting"), ({"predictor": {"critic_lr": 0.01}}, "predictor.lr")],
)
def test_an_old_name_is_refused_by_every_reader_naming_the_new_key(tmp_path, old, new):
    pytest.importorskip("torch")
    from trace_rl.train.trainer import TrainConfig

    (key,) = [f"{group}.{name}" for group, names in old.items() for name in names]
    for cls, argv in ((TrainConfig, []), (SimulateConfig, [])):
        with pytest.raises(ConfigError) as err:
            load_config(cls, ["--config", _file(tmp_path, old), *argv])
        assert str(err.value).startswith(f"{key}: renamed; set {new} (in ") and "\n" not in str(err.value)
        with pytest.raises(ConfigError, match=f"^{key}: renamed; set {new}$"):
            load_config(cls, [f"{key}={next(iter(old[key.split('.')[0]].values()))}"])
    with pytest.raises(ValueError, match=f"^trace_rl.{key}: renamed; set trace_rl.{new}$"):
        TraceSettings.from_config(old)
    if "predictor" in old:  # TRL's keywords: predictor={...}; an `update` keyword is unknown there, as before
        with pytest.raises(ValueError, match=f"^TraceRolloutFunc.{key}: renamed; set TraceRolloutFunc.{new}$"):
            trl_config("trace", "", None, old["predictor"], "first", {})


def test_stored_run_settings_of_the_old_names_compare_equal_to_todays():
    old = {"update": {"weighting": "split", "lr": 1e-5}, "predictor": {"critic_lr": 3e-3, "kind": "light"}}
    assert upgrade_run_settings(old) == {
        "update": {"lr": 1e-5},
        "weighting": "split",
        "predictor": {"kind": "light", "lr": None},  # the LM critic's default is what an unset lr gives it
    }
    assert upgrade_run_settings({"predictor": {"critic_lr": 0.01}})["predictor"] == {"lr": 0.01}


def test_verl_carries_the_layers_its_manager_reads_and_its_workers_receive():
    config = TraceSettings.from_config({**yaml.safe_load(BLOCK), "seed": 0}).config
    flip, root = shared_layers(config, seed=7)
    assert isinstance(flip, FlipCalibrator) and isinstance(root, RootCalibrator)
    assert shared_layers(config, seed=7)[0] is flip  # the manager's and the trainer's one object
    raw = TraceConfig("trace")
    assert shared_layers(raw) == (None, None) and layer_bytes(None) is None
    rng = np.random.default_rng(0)
    n = 40
    flip.observe(rng.integers(0, 2, n), rng.random(n), rng.integers(1, 3, n), np.full(n, 2), rng.integers(0, 3, n))
    worker = shared_layers(TraceSettings.from_config({**yaml.safe_load(BLOCK), "seed": 1}).config, seed=1)[0]
    assert not np.allclose(worker.predict([0, 1], [0.3, 0.6], [1, 2]), flip.predict([0, 1], [0.3, 0.6], [1, 2]))
    load_layer(worker, layer_bytes(flip))  # what the manager sends before each batch
    assert np.array_equal(worker.predict([0, 1], [0.3, 0.6], [1, 2]), flip.predict([0, 1], [0.3, 0.6], [1, 2]))


def test_trl_keeps_its_layers_across_calls():
    pytest.importorskip("transformers")
    from helpers_calc import scripted_calc

    from trace_rl.backends.base import SamplingParams, ScriptedBackend
    from trace_rl.envs.calculator import CalculatorEnv, make_tasks
    from trace_rl.integrations.trl.rollout import TraceRolloutFunc
    from trace_rl.lm.tokenizer import byte_tokenizer

    backend = ScriptedBackend(byte_tokenizer(), lambda text, i: scripted_calc(text, i, wrong_every=3))
    settings = {"flip_model": "calibrated", "root_model": "calibrated"}
    fn = TraceRolloutFunc(CalculatorEnv, backend, json.loads, predictor=settings, params=SamplingParams(64))
    flip, root = fn.layers
    assert fn.config.predictor == PredictorSettings(**settings)
    trainer = SimpleNamespace(
        num_generations=4,
        num_generations_eval=1,
        model=SimpleNamespace(training=True),
        state=SimpleNamespace(global_step=0),
        accepts_token_advantages=True,
    )
    prompts = [json.dumps(t) for t in make_tasks(4, seed=1, steps=(2, 3)) for _ in range(4)]
    before = (flip.state_dict()["steps_seen"], root.state_dict()["steps_seen"])
    for step in range(2):
        trainer.state.global_step = step
        fn(prompts, trainer)
    assert fn.layers[0] is flip and fn.layers[1] is root  # one pair for the run, as the predictor
    assert (flip.state_dict()["steps_seen"], root.state_dict()["steps_seen"]) == (before[0] + 2, before[1] + 2)
