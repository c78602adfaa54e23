"""The calculator's settings group: named task mixes (presets) drawing exactly the tasks the mixes drew before
they had names, one canonical form per mix, and one line for a bad setting."""

import pytest

from trace_rl.envs.calculator import DEMO_MIX, RL_MIX, TRAIN_MIX, make_tasks
from trace_rl.envs.calculator_spec import PRESETS, CalculatorSettings, calculator_spec
from trace_rl.envs.registry import get_env


@pytest.mark.parametrize("preset, mix", [("rl", RL_MIX), ("train", TRAIN_MIX), ("demo", DEMO_MIX)])
def test_a_preset_draws_the_tasks_of_its_mix(preset, mix):
    spec = get_env("calculator", preset=preset)
    assert spec.train(16, 3) == make_tasks(16, seed=3, **mix)
    assert spec.held_out(8, 11) == make_tasks(8, seed=11, **mix)
    assert spec.benchmarks["calculator"](None) == make_tasks(256, seed=10_000, **mix)


def test_the_default_is_the_rl_mix_the_commands_drew_before():
    assert CalculatorSettings().preset == "rl" and CalculatorSettings().mix == RL_MIX
    assert get_env("calculator").train(12, 0) == make_tasks(12, seed=0)  # make_tasks' own default mix


def test_one_canonical_form_per_mix():
    assert CalculatorSettings(chain_steps=[3, 4, 5], digits=[2]) == CalculatorSettings(preset="train")
    assert CalculatorSettings(preset="rl", chain_steps=[3, 4, 5], digits=[2]).preset == "train"
    custom = CalculatorSettings(preset="train", digits=[1, 2])  # replaces the preset's digits only
    assert (custom.preset, custom.chain_steps, custom.digits) == ("custom", [3, 4, 5], [1, 2])
    assert CalculatorSettings(**vars(custom)) == custom  # its form read back (config.yaml) is itself
    # order matters to the draws, so a reordered list is not the preset
    assert CalculatorSettings(chain_steps=[5, 4, 3], digits=[2]).preset == "custom"
    tasks = calculator_spec(custom).train(10, 4)
    assert tasks == make_tasks(10, seed=4, steps=(3, 4, 5), digits=(1, 2))
    assert {t["digits"] for t in tasks} <= {1, 2} and {t["steps"] for t in tasks} <= {3, 4, 5}


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"preset": "hard"}, "preset: unknown 'hard'; choose from rl, train, demo or custom"),
        ({"preset": "custom", "digits": [1]}, "preset: custom needs both chain_steps and digits"),
        ({"chain_steps": [0, 2]}, "chain_steps must be integers in 1..8"),
        ({"digits": [4]}, "digits must be integers in 1..3"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(kwargs, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(")):
        CalculatorSettings(**kwargs)


def test_the_presets_are_the_calculators_mixes():
    assert PRESETS == {"rl": RL_MIX, "train": TRAIN_MIX, "demo": DEMO_MIX}
