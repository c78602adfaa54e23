"""A synthetic multi-turn agentic task family whose success probability V(H_t) is exact for every prefix.

Each prompt (a `TestbedTask`) is a small MDP: `horizon` turns (2 to 6); at each turn the agent picks one of
`num_actions` actions, and the task's kind fixes which one is right at that turn. A right action still fails
with the task's `slip` probability (its difficulty); a failed turn is a mistake, the episode fails as soon as
mistakes exceed the task's `tolerance`, and it succeeds if it reaches the end within tolerance. The
observation says only "ok" or "error". By default a doomed episode runs on to its horizon (as agents do
after an unrecoverable error), so its later prefixes have V = 0 and are worthless anchors. Because turn
outcomes are independent given the policy, V(turn, mistakes) is a short backward recursion, so oracle
predictors, the paper's propositions and allocation quality can all be checked exactly, which no LM
environment allows.

What it does not model: the language side (no tokens, no parsing), and long-range credit (a turn's effect is
immediate). It is a testbed for allocation and credit assignment, not for agents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..seeding import derive_rng

DIFFICULTY_BANDS = {"easy": (0.0, 0.02), "medium": (0.1, 0.4), "hard": (0.85, 0.99)}
DEFAULT_MIX = (0.45, 0.10, 0.45)  # shares of easy, medium, hard tasks where nothing else chooses


@dataclass(frozen=True)
class TestbedTask:
    """One prompt of the testbed."""

    __test__ = False  # not a pytest class, despite the name

    index: int
    kind: int  # which action sequence is right
    horizon: int  # number of turns
    slip: float  # chance that a right action still fails (hidden difficulty)
    tolerance: int  # mistakes allowed
    hint: float  # a noisy reading of slip, visible to predictors (like a problem's level)


@dataclass(frozen=True)
class TestbedConfig:
    """Shape of the task family."""

    __test__ = False  # not a pytest class, despite the name

    num_kinds: int = 8  # task kinds, each with its own right action per turn
    num_actions: int = 4  # actions available at each turn
    min_turns: int = 2  # shortest task horizon, in turns
    max_turns: int = 6  # longest task horizon, in turns
    difficulty_mix: Optional[tuple[float, float, float]] = None  # easy, medium, hard shares; unset: the preset's
    max_tolerance: int = 1  # tolerance drawn uniformly from 0..min(max_tolerance, horizon // 3)
    hint_noise: float = 0.05  # std of the noise on the visible difficulty hint
    stop_on_failure: bool = False  # end an episode at its first excess mistake (else it runs on, doomed)
    seed: int = 0  # fixes the right-action table (simulate sets it to the run's seed)

    def __post_init__(self):
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {self.min_turns}, {self.max_turns}")
        mix = np.asarray(self.mix, dtype=float)
        if mix.shape != (3,) or np.any(mix < 0) or not np.isclose(mix.sum(), 1.0):
            raise ValueError(f"difficulty_mix must be 3 non-negative shares summing to 1, got {self.difficulty_mix}")
        if self.num_actions < 2 or self.num_kinds < 1:
            raise ValueError("num_actions must be >= 2 and num_kinds >= 1")
        if not 0 <= self.hint_noise < float("inf"):  # a standard deviation (numpy refuses a negative one mid-run)
            raise ValueError(f"hint_noise must be a finite number >= 0, got {self.hint_noise}")
        if self.max_tolerance < 0:
            raise ValueError(f"max_tolerance must be >= 0, got {self.max_tolerance}")

    @property
    def mix(self) -> tuple[float, float, float]:
        """The difficulty mix in force: the one set, else DEFAULT_MIX."""
        return DEFAULT_MIX if self.difficulty_mix is None else tuple(self.difficulty_mix)

    def right_actions(self) -> np.ndarray:
        """right[kind, turn]: the action that can succeed at that turn."""
        rng = derive_rng(self.seed, "right-actions")
        return rng.integers(self.num_actions, size=(self.num_kinds, self.max_turns))


def make_tasks(config: TestbedConfig, count: int, seed: int, start_index: int = 0) -> list[TestbedTask]:
    rng = np.random.default_rng(seed)
    bands = list(DIFFICULTY_BANDS.values())
    tasks = []
    for i in range(count):
        lo, hi = bands[rng.choice(3, p=config.mix)]
        slip = float(rng.uniform(lo, hi))
        horizon = int(rng.integers(config.min_turns, config.max_turns + 1))
        tasks.append(
            TestbedTask(
                index=start_index + i,
                kind=int(rng.integers(config.num_kinds)),
                horizon=horizon,
                slip=slip,
                tolerance=int(rng.integers(min(config.max_tolerance, horizon // 3) + 1)),
                hint=float(np.clip(slip + rng.normal(0, config.hint_noise), 0, 1)),
            )
        )
    return tasks


def value_table(task: TestbedTask, turn_success: np.ndarray) -> np.ndarray:
    """V[t, e]: probability of success from turn t with e mistakes, given per-turn success probabilities."""
    T, tol = task.horizon, task.tolerance
    V = np.zeros((T + 1, tol + 2))
    V[T, : tol + 1] = 1.0
    for t in range(T - 1, -1, -1):
        p = turn_success[t]
        V[t, : tol + 1] = p * V[t + 1, : tol + 1] + (1 - p) * V[t + 1, 1 : tol + 2]
    return V


class TestbedEnv:
    """The environment protocol: reset(task) -> obs, step(action) -> (obs, reward, done, info), fork()."""

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, config: TestbedConfig, rng: np.random.Generator, right: np.ndarray | None = None):
        self.config = config
        self.rng = rng
        self.right = config.right_actions() if right is None else right
        self.task: TestbedTask | None = None
        self.turn = 0
        self.mistakes = 0
        self.done = True

    def reset(self, task: TestbedTask) -> str:
        self.task, self.turn, self.mistakes, self.done = task, 0, 0, False
        return f"task kind={task.kind} turns={task.horizon} tolerance={task.tolerance} level={task.hint:.2f}"

    def step(self, action: int) -> tuple[str, float, bool, dict]:
        if self.done or self.task is None:
            raise RuntimeError("step() after the episode ended; call reset() first")
        if not 0 <= int(action) < self.config.num_actions:
            # a malformed action is a wasted turn, reported in the observation, never an exception
            ok, obs = False, f"error: action must be an integer in [0, {self.config.num_actions - 1}]"
        else:
            ok = int(action) == self.right[self.task.kind, self.turn] and self.rng.random() >= self.task.slip
            obs = "ok" if ok else "error"
        self.turn += 1
        self.mistakes += not ok
        failed = self.mistakes > self.task.tolerance
        self.done = (failed and self.config.stop_on_failure) or self.turn == self.task.horizon
        reward = float(self.done and not failed)
        return obs, reward, self.done, {"turn": self.turn, "mistakes": self.mistakes}

    @property
    def reward(self) -> float:
        """The episode's reward once done (1 when the mistakes stayed within the task's tolerance), else 0."""
        return float(self.done and self.task is not None and self.mistakes <= self.task.tolerance)

    def fork(self) -> "TestbedEnv":
        """A copy that continues from this exact state with its own random stream."""
        twin = TestbedEnv(self.config, self.rng.spawn(1)[0], self.right)
        twin.task, twin.turn, twin.mistakes, twin.done = self.task, self.turn, self.mistakes, self.done
        return twin
