"""The testbed's tabular softmax policy as an actor of the TRACE step (`rollout.engine`).

An episode is a `TestbedEnv` with its own random stream, used both for the policy's action and for the
task's slips; a fork continues from the same state with a new stream. Each node records the turn's features
(task kind, turn index, action, mistakes so far) for the learned predictor and the policy update.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..rollout.engine import Clock
from ..tree import RolloutTree
from .env import TestbedConfig, TestbedEnv, TestbedTask
from .policy import SoftmaxPolicy


class TestbedActor:
    __test__ = False  # not a pytest class, despite the name

    def __init__(self, config: TestbedConfig, policy: SoftmaxPolicy):
        self.config, self.policy = config, policy
        self.right = config.right_actions()
        self.clock = Clock()

    def begin_step(self, prompts: int, clock: Clock) -> None:
        self.clock = clock

    def end_prompt(self) -> None:
        pass

    def tree(self, index: int, task: TestbedTask) -> RolloutTree:
        tree = RolloutTree(task.index, prompt=task.index)  # the task's index: what the predictors look up
        tree.root.info = {"turn": 0, "mistakes": 0}
        return tree

    def start(self, tree: RolloutTree, task: TestbedTask, seeds: Sequence[int]) -> list[TestbedEnv]:
        episodes = []
        for seed in seeds:
            env = TestbedEnv(self.config, np.random.default_rng(seed), self.right)
            env.reset(task)
            episodes.append(env)
        return episodes

    def fork(self, episode: TestbedEnv, seed: int) -> TestbedEnv:
        twin = episode.fork()
        twin.rng = np.random.default_rng(seed)
        return twin

    async def advance(self, episodes: Sequence[TestbedEnv]) -> list[dict]:
        out = []
        for env in episodes:
            t0 = time.perf_counter()
            turn = env.turn
            action, logp = self.policy.act(env.task, turn, env.rng)
            t1 = time.perf_counter()
            obs, _, _, info = env.step(action)
            t2 = time.perf_counter()
            self.clock.add("generate", t1 - t0)
            self.clock.add("env", t2 - t1)
            out.append(
                {
                    "action": str(action),
                    "observation": obs,
                    "logprobs": [logp],
                    "info": {
                        "turn": info["turn"],
                        "mistakes": info["mistakes"],
                        "kind": env.task.kind,
                        "at": turn,
                        "a": action,
                    },
                }
            )
        return out
