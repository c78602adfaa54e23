"""Every key that `trace-rl CMD --help` lists has a doc comment and is read by the code.

"Read" is checked statically: the field's name appears as an attribute access (`x.name`) or as a string handed
to getattr somewhere in src/trace_rl, outside the `__post_init__` of the dataclass that declares it (a key
that is only validated and never used is dead). A name shared with other settings (`seed`, `steps`) passes
if any of them is read; the check is there to catch a key nobody reads at all, and it does (see the last test).
"""

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from trace_rl.cli import COMMANDS
from trace_rl.config import _docs, _leaves, _nested
from trace_rl.envs.registry import BUILTINS, resolve_env

SRC = Path(__file__).resolve().parents[1] / "src" / "trace_rl"


def _declared(cls, prefix: str = "", group=None) -> dict[str, tuple[type, str]]:
    """Dotted key -> (the dataclass that declares the field, the field name), for every leaf of `cls` (a choice
    group, env, in the class of the command's default choice)."""
    out = {}
    for name, (typ, value) in _nested(cls, group, prefix).items():
        if dataclasses.is_dataclass(typ):
            out.update(_declared(typ, f"{prefix}{name}.", value))
        else:
            out[f"{prefix}{name}"] = (cls, name)
    return out


def _reads(paths) -> dict[str, set[str]]:
    """Attribute name -> the 'module:Class' of each dataclass whose __post_init__ is the only place it is read,
    or 'elsewhere' when read outside any __post_init__."""
    found: dict[str, set[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text())
        inside: dict[int, str] = {}  # node id -> owning class of the __post_init__ it sits in
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__post_init__":
                    for node in ast.walk(fn):
                        inside[id(node)] = cls.name
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Attribute):
                names.append(node.attr)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2:
                if isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                    names.append(node.args[1].value)
            for name in names:
                found.setdefault(name, set()).add(inside.get(id(node), "elsewhere"))
    return found


def dead_keys(cls, reads: dict[str, set[str]]) -> list[str]:
    """Keys of `cls` whose field name is never read outside its own class's __post_init__."""
    return [key for key, (owner, name) in _declared(cls).items() if "elsewhere" not in reads.get(name, set())]


def undocumented_keys(cls) -> list[str]:
    return [key for key, (owner, name) in _declared(cls).items() if not _docs(owner).get(name)]


NAMES = sorted(COMMANDS)
# keys whose only reader is their own __post_init__, because that is where they take effect
DERIVED = {("simulate", "ablation"), ("simulate", "preset")}  # choose the default methods / fill unset settings


@pytest.fixture(scope="module")
def reads():
    return _reads(SRC.rglob("*.py"))


@pytest.mark.parametrize("command", NAMES)
def test_every_listed_key_has_a_doc_and_is_read(command, reads):
    try:
        cls = COMMANDS[command].config_class()
    except ImportError as err:
        pytest.skip(f"{command} needs a package that is not installed ({err})")
    assert set(_declared(cls)) == set(_leaves(cls))  # the keys checked are the keys --help lists
    assert not undocumented_keys(cls), f"{command}: keys without a doc comment"
    dead = [k for k in dead_keys(cls, reads) if (command, k) not in DERIVED]
    assert not dead, f"{command}: keys that no code reads"


@pytest.mark.parametrize("env", [name for name in BUILTINS if resolve_env(name).settings is not None])
def test_every_built_in_envs_keys_have_a_doc_and_are_read(env, reads):
    """The keys of each env's own group (`env.<name>.*`), which --help lists once that env is chosen."""
    settings = resolve_env(env).settings
    assert not undocumented_keys(settings), f"env {env}: keys without a doc comment"
    assert not dead_keys(settings, reads), f"env {env}: keys that no code reads"


def test_the_check_finds_a_dead_key(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class Demo:\n"
        "    zz_used_key: int = 0  # read below\n"
        "    zz_dead_key: int = 0  # only validated\n"
        "    def __post_init__(self):\n"
        "        if self.zz_dead_key < 0 or self.zz_used_key < 0:\n"
        "            raise ValueError\n"
        "def run(cfg):\n"
        "    return cfg.zz_used_key\n"
    )

    @dataclasses.dataclass
    class Demo:
        zz_used_key: int = 0  # read below
        zz_dead_key: int = 0
        zz_other_key: int = 0  # never read anywhere

    assert dead_keys(Demo, _reads([source])) == ["zz_dead_key", "zz_other_key"]
    assert undocumented_keys(Demo) == ["zz_dead_key"]


def test_inherited_settings_keep_their_docs_and_follow_a_commands_own():
    """`rollout` and `train` inherit the LM run groups (`stack.config.LMRunConfig`): the doc comments written
    on the base show in --help, and a command's own keys lead both --help and the config.yaml it writes."""
    from trace_rl.config import help_text, load_config
    from trace_rl.stack.config import LMRunConfig

    try:
        cls = COMMANDS["rollout"].config_class()
    except ImportError as err:
        pytest.skip(f"rollout needs a package that is not installed ({err})")
    assert issubclass(cls, LMRunConfig)
    text = help_text(cls, "rollout")
    assert text.index("\n    out=") < text.index("\n    executor=") < text.index("\n    policy.model=")
    assert "where prompt trees grow" in text.split("\n    executor=")[1].splitlines()[0]
    _, yaml_text = load_config(cls, ["policy.model=random-tiny"])
    keys = [line.split(":")[0] for line in yaml_text.splitlines() if line and not line.startswith((" ", "-"))]
    assert keys[:3] == ["out", "seed", "steps"] and keys.index("methods") < keys.index("executor")


def test_help_shows_the_commands_own_default_of_a_group_it_overrides():
    pytest.importorskip("torch")  # train's config holds the update's, which names torch's attention kernels
    from trace_rl.commands.rollout import RolloutConfig
    from trace_rl.config import help_text
    from trace_rl.train.trainer import TrainConfig

    train, rollout = help_text(TrainConfig, "train"), help_text(RolloutConfig, "rollout")
    assert f"budget.prompts={TrainConfig().budget.prompts} " in train
    assert f"budget.prompts={RolloutConfig().budget.prompts} " in rollout
    assert TrainConfig().budget.prompts != RolloutConfig().budget.prompts  # else this test shows nothing
    assert "env.calculator.preset='train' " in train and "env.calculator.preset='rl' " in rollout


def test_trace_settings_keep_the_command_lines_keys_and_the_one_configurations_defaults():
    """`train` names TRACE's settings by its keys (method, advantage, budget.*, predictor.kind, prefix_share, lr
    and the calibration layers, weighting) and builds TRACE's one configuration from them, with its defaults
    (train's budget is its own: 8 prompts a step); a bad one is refused by the one check, an old name with the
    new one."""
    pytest.importorskip("torch")
    from trace_rl.config import load_config
    from trace_rl.errors import ConfigError
    from trace_rl.methods import BudgetPlan
    from trace_rl.trace_config import PredictorSettings, TraceConfig
    from trace_rl.train.trainer import TrainConfig

    cfg, _ = load_config(TrainConfig, ["policy.model=random-tiny"])
    assert cfg.trace_config() == TraceConfig(budget=BudgetPlan(prompts=8))
    cfg, _ = load_config(
        TrainConfig,
        [
            "method=tree_grpo",
            "advantage=trace",
            "predictor.kind=history",
            "--prefix-share",
            "0.1",
            "weighting=split",
            "predictor.flip_model=calibrated",
            "predictor.root_model=calibrated",
            "predictor.lr=0.01",
        ],
    )
    assert cfg.trace_config() == TraceConfig(
        "tree_grpo",
        "trace",
        BudgetPlan(prompts=8),
        PredictorSettings("history", 0.1, lr=0.01, flip_model="calibrated", root_model="calibrated"),
        "split",
    )
    for argv, key in [
        (["method=trace_oracle"], "method: unknown 'trace_oracle' (it needs the exact V"),
        (["predictor.kind=light_text"], "predictor.kind: 'light_text' is now called 'light'"),
        (["predictor.prefix_share=1"], "predictor.prefix_share: prefix_share must be in [0, 1)"),
        (["advantage=ppo"], "advantage: unknown 'ppo'"),
        (["update.weighting=split"], "update.weighting: renamed; set weighting"),
        (["predictor.critic_lr=0.01"], "predictor.critic_lr: renamed; set predictor.lr"),
        (["predictor.flip_model=fitted"], "predictor.flip_model: flip_model must be one of raw, calibrated"),
        (["predictor.flip_prior=x.json"], "predictor.flip_prior: only predictor.flip_model=calibrated reads it"),
        (["predictor.lr=0"], "predictor.lr must be > 0"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config(TrainConfig, argv)
