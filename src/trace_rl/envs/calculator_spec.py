"""The calculator as a plug-in: its settings group `env.calculator.*` (a named task mix, or one's own) and its spec.

The task mixes are presets named after the mixes `envs.calculator` defines: `rl` (`RL_MIX`, 1-5-step chains of
1-3-digit numbers: the default of `rollout` and `eval`, where allocation is measured on near-certain, mixed and
hopeless prompts), `train` (`TRAIN_MIX`, 3-5 steps of 2 digits: `train`'s default, where training moves held-out
accuracy) and `demo` (`DEMO_MIX`, 1-4 steps of 1-2 digits: what `sft`'s demonstrations show). `chain_steps` and
`digits` replace the preset's part they name. The order of a list matters (tasks draw an index into it), so two
mixes are one preset only when their lists are equal in order.

The settings are kept in one canonical form, so equal mixes are equal settings (a run's identity, `compare`'s
check of a finished run): a mix equal to a preset's is that preset with empty lists, any other is `custom` with both
lists. config.yaml therefore records the preset a run drew from, or the lists it drew from.

This module exists apart from `envs/calculator.py`, whose source keys the warm-start cache: the environment and
its task generator stay as they were, and only how a config names a mix lives here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .calculator import DEMO_MIX, RL_MIX, TRAIN_MIX, CalculatorEnv, make_tasks
from .registry import EnvPlugin, EnvSpec

PRESETS = {"rl": RL_MIX, "train": TRAIN_MIX, "demo": DEMO_MIX}
CUSTOM = "custom"
BENCHMARK_SEED = 10_000  # the seed of the `calculator` benchmark's fixed draw (`trace-rl eval`)


@dataclass
class CalculatorSettings:
    """The calculator's task mix: a named preset, or chain lengths and number sizes of one's own."""

    preset: str = "rl"  # rl: 1-5 steps x 1-3 digits | train: 3-5 x 2 | demo: 1-4 x 1-2 (sft's) | custom: the lists
    chain_steps: list[int] = field(default_factory=list)  # chain lengths, drawn uniformly (empty: the preset's)
    digits: list[int] = field(default_factory=list)  # digits of each number, drawn uniformly (empty: the preset's)

    def __post_init__(self):
        if self.preset not in PRESETS and self.preset != CUSTOM:
            raise ValueError(f"preset: unknown {self.preset!r}; choose from {', '.join(PRESETS)} or {CUSTOM}")
        if self.preset == CUSTOM and not (self.chain_steps and self.digits):
            raise ValueError("preset: custom needs both chain_steps and digits")
        if not all(isinstance(s, int) and 1 <= s <= 8 for s in self.chain_steps):
            raise ValueError(f"chain_steps must be integers in 1..8, got {self.chain_steps}")
        if not all(isinstance(d, int) and 1 <= d <= 3 for d in self.digits):
            raise ValueError(f"digits must be integers in 1..3, got {self.digits}")
        base = PRESETS.get(self.preset, {"steps": (), "digits": ()})
        steps, digits = tuple(self.chain_steps) or base["steps"], tuple(self.digits) or base["digits"]
        named = [n for n, mix in PRESETS.items() if (mix["steps"], mix["digits"]) == (steps, digits)]
        if named:
            self.preset, self.chain_steps, self.digits = named[0], [], []
        else:
            self.preset, self.chain_steps, self.digits = CUSTOM, list(steps), list(digits)

    @property
    def mix(self) -> dict:
        """`make_tasks`' keyword arguments: the chain lengths and number sizes drawn from."""
        if self.preset in PRESETS:
            return dict(PRESETS[self.preset])
        return {"steps": tuple(self.chain_steps), "digits": tuple(self.digits)}


def calculator_spec(settings: CalculatorSettings) -> EnvSpec:
    """Training and held-out tasks are seeded draws of the mix; the benchmark is one fixed draw of it."""
    mix = settings.mix
    return EnvSpec(
        CalculatorEnv,
        {"calculator": lambda n: make_tasks(n or 256, seed=BENCHMARK_SEED, **mix)},
        lambda count, seed: make_tasks(count, seed=seed, **mix),
        max_new_tokens=48,
        draw_held_out=lambda count, seed: make_tasks(count, seed=seed, **mix),
        group=lambda task: f"steps={task['steps']} digits={task['digits']}",
    )


CALCULATOR = EnvPlugin("calculator", calculator_spec, CalculatorSettings)
