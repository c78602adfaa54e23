"""One prompt's TRACE tree grown from agent-loop sessions, without verl: the core engine drives the sessions.

A verl agent loop runs a whole episode in one `run()` call; to branch mid-episode the tree worker needs it turn
by turn. A `Session` is that: `step()` runs one turn (one generation and its tool calls) and returns the
turn's tokens, `fork()` copies the session's state so a continuation resumes from it, and a finished session
holds its `reward` and its trainer-facing `output`. `SessionActor` adapts sessions to the core's `Actor`, so
stage 2 (anchors, V~ of each prefix, the exact prefix allocation, continuations) is the engine's own code:
`grow_prompt_tree` runs it for one prompt whose root count the manager already chose.

Limits: a fork copies what the session holds (the token history and messages); state outside it (a stateful
tool's sandbox) is not forked, so tools must be stateless across calls or replayable. The engine snapshots a
session after every turn of every bare rollout, so memory grows with turns x rollouts per prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, Protocol, Sequence

from ...methods import BudgetPlan, Method
from ...predictors.base import Predictor
from ...rollout.engine import Clock, TreeRolloutEngine
from ...trace_config import TraceConfig
from ...tree import RolloutTree


class Session(Protocol):
    done: bool
    reward: float | None  # set when done
    output: Any  # what the trainer receives for a finished session (verl: its AgentLoopOutput)

    async def step(self) -> dict:
        """One turn: token_ids, loss_mask, logprobs (of the policy tokens), action, observation."""

    def fork(self) -> "Session":
        """An independent copy that continues from this session's current state."""


class SessionActor:
    """The core engine's `Actor` over sessions; each turn's node records the session that produced it in
    `info["session"]`, so a leaf leads back to its finished session."""

    def __init__(self, open_sessions: Callable[[int], list[Session]], prompt: object):
        self.open_sessions, self.prompt = open_sessions, prompt
        self.sessions: dict[int, Session] = {}

    def _keep(self, session: Session) -> Session:
        session.key = len(self.sessions)
        self.sessions[session.key] = session
        return session

    def begin_step(self, prompts: int, clock: Clock) -> None:
        pass

    def end_prompt(self) -> None:
        pass

    def tree(self, index: int, task: str) -> RolloutTree:
        return RolloutTree(task, prompt=self.prompt)

    def start(self, tree: RolloutTree, task: str, seeds: Sequence[int]) -> list[Session]:
        return [self._keep(s) for s in self.open_sessions(len(seeds))]

    def fork(self, episode: Session, seed: int) -> Session:
        return self._keep(episode.fork())  # the server samples; the seed has no say in a remote generation

    async def advance(self, episodes: Sequence[Session]) -> list[dict]:
        turns = await asyncio.gather(*(ep.step() for ep in episodes))
        out = []
        for ep, turn in zip(episodes, turns):
            if ep.done and ep.reward is None:
                raise RuntimeError("a finished session has no reward: the tree needs it before stage 2")
            out.append({**turn, "info": {**turn.get("info", {}), "session": ep.key}})
        return out

    def leaf_sessions(self, tree: RolloutTree) -> list[tuple[str, Session]]:
        """(leaf id, finished session) for every leaf, in the tree's order."""
        return [(leaf.node_id, self.sessions[leaf.info["session"]]) for leaf in tree.leaves()]


def single_prompt_plan(roots: int, config: TraceConfig) -> tuple[BudgetPlan, Method]:
    """The plan and method under which the engine grows exactly `roots` bare rollouts for one prompt, plus
    `budget.branch_factor` continuations per root when the method branches (stage 1 already ran in the manager)."""
    method = config.method_spec
    branches = config.budget.branch_factor if method.branches else 0
    plan = config.batch_plan(1, roots * (1 + branches), max_per_prompt=max(2, roots))
    return plan, dataclasses.replace(method, root="uniform")


async def grow_prompt_tree(
    uid: str,
    prompt: object,
    roots: int,
    open_sessions: Callable[[int], list[Session]],
    predictor: Predictor,
    config: TraceConfig,
    seed: int,
    step: int,
    flip_model=None,
):
    """Grow one prompt's tree under `config` (its method, branch factor and prefix share), stage 2 reading its
    flip probability through `flip_model` (the manager's flip layer; None: q from V~); returns (tree,
    [(leaf id, session)], StepResult). `uid` is the tree's root id. Nothing is fitted here: the trainer fits the
    predictor and the layers on the step's trees."""
    if roots < 1:
        raise ValueError(f"a tree needs at least one root rollout, got {roots}")
    plan, one = single_prompt_plan(roots, config)
    actor = SessionActor(open_sessions, prompt)
    engine = TreeRolloutEngine.from_config(
        actor, predictor, config, seed=seed, plan=plan, update_predictor=False, layers=(flip_model, None)
    )
    result = await engine.agrow([uid], one, step)
    tree = result.trees[0]
    return tree, actor.leaf_sessions(tree), result
