"""The `env` settings group: `env.name` picks the environment and its own group `env.<name>.*` is the only env
group the command line, a --config file, --help and config.yaml see; old flat keys are one line (command line) or
moved (config files, stored run settings); the group survives pickling and deep copies (compare's workers)."""

import copy
import dataclasses
import pickle
import sys
import textwrap
from dataclasses import dataclass, field

import pytest

from trace_rl.config import help_text, load_config
from trace_rl.envs import registry
from trace_rl.errors import ConfigError
from trace_rl.stack.build import build_env
from trace_rl.stack.env_config import LMEnvConfig, env_config


@dataclass
class RunDemo:
    """A command with an env group."""

    seed: int = 0  # a seed
    env: LMEnvConfig = field(default_factory=lambda: env_config("calculator", preset="train"))


@dataclass
class StudyDemo:
    """A command holding another's settings (compare holds train's)."""

    run: RunDemo = field(default_factory=RunDemo)


def test_the_default_group_is_the_calculators_with_the_commands_preset():
    cfg, text = load_config(RunDemo, [])
    assert cfg.env.name == "calculator" and cfg.env.calculator.preset == "train"
    assert "calculator:\n    preset: train" in text and "sandbox" not in text


def test_choosing_an_env_gives_its_own_group_and_no_other():
    cfg, text = load_config(RunDemo, ["env=math", "env.math.sandbox=weak"])
    assert cfg.env.settings().sandbox == "weak" and not hasattr(cfg.env, "calculator")
    assert "math:\n    sandbox: weak" in text and "calculator" not in text
    cfg, _ = load_config(RunDemo, ["env.name=qa"])
    assert cfg.env.qa.corpus == "" and cfg.env.settings().retriever_url == ""
    cfg, _ = load_config(RunDemo, ["env=bfcl", "env.bfcl.steps_per_turn=3"])
    assert cfg.env.settings().steps_per_turn == 3 and [f.name for f in dataclasses.fields(cfg.env)] == ["name", "bfcl"]
    with pytest.raises(ConfigError, match="^env.bfcl.steps_per_turn: steps_per_turn must be a positive integer"):
        load_config(RunDemo, ["env=bfcl", "env.bfcl.steps_per_turn=-1"])


def test_an_env_without_settings_is_its_name_alone(monkeypatch):
    plain = registry.EnvPlugin("plain", lambda: registry.EnvSpec(object, {}, lambda c, s: []))
    monkeypatch.setattr(registry, "_REGISTERED", {"plain": plain})
    monkeypatch.setattr(registry, "_RESOLVED", {})
    cfg, _ = load_config(RunDemo, ["env=plain"])
    assert cfg.env.settings() is None and [f.name for f in dataclasses.fields(cfg.env)] == ["name"]


def test_a_nested_group_is_chosen_at_its_own_path():
    cfg, _ = load_config(StudyDemo, ["run.env=math", "run.env.math.sandbox=weak"])
    assert cfg.run.env.math.sandbox == "weak"
    assert "run.env.math.sandbox='weak'" not in help_text(StudyDemo, "study")  # the default is the calculator
    assert "run.env.math.sandbox='strict'" in help_text(StudyDemo, "study", ["run.env=math"])


@pytest.mark.parametrize(
    "argv, said",
    [
        (["env=chess"], "env.name: unknown env 'chess'; registered: calculator, math, qa, bfcl"),
        (["env.chain_steps=3,4"], "env.chain_steps: now env.calculator.chain_steps"),
        (["env=math", "env.sandbox=weak"], "env.sandbox: now env.math.sandbox"),
        (["env=math", "env.calculator.digits=2"], "env.calculator.digits: unknown setting"),
        (["env.calculator.preset=hard"], "env.calculator.preset: unknown 'hard'"),
        (["env.calculator.digits=4"], "env.calculator.digits: digits must be integers in 1..3"),
        (["env=qa", "env.qa.retriever_url=ftp://x"], "env.qa.retriever_url: retriever_url must be an http(s) URL"),
        (["run.env=chess"], "run.env.name: unknown env 'chess'"),
    ],
)
def test_a_bad_key_or_value_is_one_line_naming_it(argv, said):
    cls = StudyDemo if argv[0].startswith("run.") else RunDemo
    with pytest.raises(ConfigError) as info:
        load_config(cls, argv)
    assert str(info.value).startswith(said) and "\n" not in str(info.value)


def test_help_lists_the_chosen_envs_keys():
    default, math = help_text(RunDemo, "demo"), help_text(RunDemo, "demo", ["env.name=math"])
    assert "env.calculator.preset='train'" in default and "env.math" not in default
    assert "env.math.sandbox='strict'" in math and "env.calculator" not in math
    with pytest.raises(ConfigError, match="^env.name: unknown env"):
        help_text(RunDemo, "demo", ["env=chess"])


def test_an_old_flat_config_file_loads_into_the_envs_group(tmp_path):
    """config.yaml of a run from before plug-ins: the chosen env's keys move into its group, the others' go."""
    old = tmp_path / "config.yaml"
    old.write_text(
        "seed: 1\nenv:\n  name: calculator\n  chain_steps: [3, 4, 5]\n  digits: [1, 2]\n"
        "  corpus: ''\n  retriever_url: ''\n  sandbox: strict\n"
    )
    cfg, text = load_config(RunDemo, ["--config", str(old)])
    assert (cfg.env.calculator.preset, cfg.env.calculator.chain_steps, cfg.env.calculator.digits) == (
        "custom",
        [3, 4, 5],
        [1, 2],
    )
    again, _ = load_config(RunDemo, ["--config", str(old), "env.calculator.digits=2"])
    assert again.env.calculator.preset == "train"  # the command line still wins over the file
    (tmp_path / "new.yaml").write_text(text)
    assert load_config(RunDemo, ["--config", str(tmp_path / "new.yaml")])[0] == cfg  # today's file reads back
    (tmp_path / "math.yaml").write_text("env:\n  name: math\n  chain_steps: [1]\n  sandbox: weak\n")
    assert load_config(RunDemo, ["--config", str(tmp_path / "math.yaml")])[0].env.math.sandbox == "weak"
    # another env chosen over a file's: the file's env settings do not apply, its other settings do
    other, _ = load_config(RunDemo, ["--config", str(tmp_path / "new.yaml"), "env=math"])
    assert other.seed == 1 and other.env.math.sandbox == "strict" and not hasattr(other.env, "calculator")


def test_stored_settings_of_an_old_run_upgrade_to_what_the_same_run_gives_now():
    old = {"name": "calculator", "chain_steps": [3, 4, 5], "digits": [2], "corpus": "", "retriever_url": ""}
    assert LMEnvConfig.upgrade(old) == dataclasses.asdict(env_config("calculator", preset="train"))
    today = dataclasses.asdict(env_config("math"))
    assert LMEnvConfig.upgrade(today) == today


def test_the_group_pickles_and_deep_copies_as_its_env_and_settings():
    cfg = StudyDemo(RunDemo(env=env_config("calculator", chain_steps=[2], digits=[3])))
    for again in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg)):
        assert again == cfg and type(again.run.env) is type(cfg.run.env)
    assert pickle.loads(pickle.dumps(LMEnvConfig())).settings() == LMEnvConfig().settings()


def test_a_bare_group_builds_the_default_envs_spec():
    """`LMEnvConfig()` (what sft's report builds) is the calculator on the rl mix."""
    from trace_rl.envs.calculator import RL_MIX, make_tasks

    assert build_env(LMEnvConfig()).train(6, 2) == make_tasks(6, seed=2, **RL_MIX)
    assert build_env(env_config("calculator", preset="train")).train(6, 2) == make_tasks(
        6, seed=2, steps=(3, 4, 5), digits=(2,)
    )


def test_a_plugin_of_ones_own_gets_its_group_and_pickles(tmp_path, monkeypatch):
    (tmp_path / "own_env_cfg.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass
            from trace_rl.envs.registry import EnvSpec, env_plugin

            @dataclass
            class Settings:
                size: int = 3  # how many

                def __post_init__(self):
                    if self.size < 1:
                        raise ValueError(f"size must be >= 1, got {self.size}")

            @env_plugin("sized", Settings)
            def sized(settings):
                return EnvSpec(object, {"b": lambda n: []}, lambda c, s: [{"index": 0, "n": settings.size}])
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_RESOLVED", {})
    try:
        cfg, text = load_config(RunDemo, ["env.name=own_env_cfg:sized", "env.sized.size=5"])
        assert "name: own_env_cfg:sized\n  sized:\n    size: 5" in text
        assert build_env(cfg.env).train(1, 0) == [{"index": 0, "n": 5}]
        assert pickle.loads(pickle.dumps(cfg)) == cfg
        assert "env.sized.size=3" in help_text(RunDemo, "demo", ["env=own_env_cfg:sized"])
        with pytest.raises(ConfigError, match="^env.sized.size: size must be >= 1, got 0$"):
            load_config(RunDemo, ["env.name=own_env_cfg:sized", "env.sized.size=0"])
    finally:
        sys.modules.pop("own_env_cfg", None)
