"""An environment of one's own, written in one file (as docs/environments.md shows), trains with `trace-rl train`
by `env.name=module:attr`, its settings group on the command line, in --help and in config.yaml."""

import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_trainer import SMALL, records  # noqa: E402

from trace_rl.cli import main  # noqa: E402

PARITY = '''
"""Say whether a number is even or odd: one answer, reward 1 when right."""

from dataclasses import dataclass

import numpy as np

from trace_rl.envs.base import ToolEnv
from trace_rl.envs.registry import EnvSpec, env_plugin

SEEN = []  # the questions episodes were reset with, in this process (what the test reads)


class Parity(ToolEnv):
    tools = ("answer",)
    system = "Say whether the number is even or odd. Write: Action: answer[even] or Action: answer[odd]"

    def reset(self, task):
        SEEN.append(task["question"])
        return super().reset(task)

    def act(self, parsed):
        self.done = True
        return "Done.", float(parsed.argument.strip() == self.task["answer"]), {"valid_action": True}


@dataclass
class ParitySettings:
    largest: int = 99  # numbers are drawn from 0..largest


def tasks(count, seed, largest):
    numbers = np.random.default_rng(seed).integers(0, largest + 1, count).tolist()
    return [
        {"index": i, "question": f"Is {n} even or odd?", "answer": "odd" if n % 2 else "even"}
        for i, n in enumerate(numbers)
    ]


@env_plugin("parity", ParitySettings)
def parity(settings):
    return EnvSpec(
        make=lambda: Parity(max_turns=2),
        benchmarks={"parity": lambda n: tasks(n or 16, 0, settings.largest)},
        train=lambda count, seed: tasks(count, seed, settings.largest),
        max_new_tokens=8,
    )
'''


@pytest.fixture
def parity_module(env_module):
    return env_module("parity_env", PARITY)


def test_two_steps_on_an_environment_defined_here(tmp_path, parity_module, capsys):
    name = f"{parity_module}:parity"
    assert main(["train", f"env.name={name}", "--help"]) == 0
    assert "env.parity.largest=99" in capsys.readouterr().out
    out = tmp_path / "run"
    args = [*SMALL, "steps=2", f"env={name}", "env.parity.largest=7", f"out={out}", "eval_tasks=2", "eval_samples=1"]
    assert main(["train", *args]) == 0
    seen = sys.modules[parity_module].SEEN
    assert seen and {int(q.split()[1]) for q in seen} <= set(range(8))  # its own tasks, at the setting given
    assert len(records(out)) == 2 and (out / "global_step_2").is_dir()
    assert f"name: {name}\n  parity:\n    largest: 7\n" in (out / "config.yaml").read_text()
    assert main(["train", *args[:-3], "env.parity.size=3", f"out={tmp_path / 'x'}"]) == 2  # not one of its keys
    assert "env.parity.size: unknown setting" in capsys.readouterr().err


def test_each_commands_default_env_draws_the_tasks_it_drew_before_plugins():
    """train: the calculator's TRAIN_MIX; rollout, eval, sft's report (a bare group): RL_MIX, the tasks of
    make_tasks' own default. Same seed, same tasks, so the default runs' records are unchanged."""
    import dataclasses

    from trace_rl.commands.eval import EvalConfig
    from trace_rl.commands.rollout import RolloutConfig
    from trace_rl.envs.calculator import TRAIN_MIX, make_tasks
    from trace_rl.stack.build import build_env
    from trace_rl.stack.config import LMEnvConfig
    from trace_rl.train.trainer import TrainConfig

    def default_env(cls):
        return next(f for f in dataclasses.fields(cls) if f.name == "env").default_factory()

    train = build_env(default_env(TrainConfig))
    assert train.train(64, 5) == make_tasks(64, seed=5, **TRAIN_MIX)
    assert train.held_out(32, 9) == make_tasks(32, seed=9, **TRAIN_MIX)
    for env in (default_env(RolloutConfig), default_env(EvalConfig), LMEnvConfig()):
        spec = build_env(env)
        assert spec.train(64, 5) == make_tasks(64, seed=5) and spec.held_out(32, 9) == make_tasks(32, seed=9)
        assert spec.benchmarks["calculator"](None) == make_tasks(256, seed=10_000)
