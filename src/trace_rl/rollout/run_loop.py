"""The one run loop: how every command's steps go, read top to bottom.

Each step: the candidate pool -> the one TRACE step (`engine.grow`) -> the step's record (`records.step_record`)
-> the learner's update -> held-out evaluation every `eval_every` steps and at the last -> the record written
(metrics, the predictor's scored nodes, the trees) -> progress. `simulate` (the testbed's tabular learner),
`rollout` (no learner: the policy stays frozen) and `train` (the LM learner: update, weight sync and its
learning-rate schedule) run their steps here, and differ only in what they hand the loop.

A learner is what follows the step (the `Learner` protocol): `begin_step()` before the step's rollouts
(the LM learner empties the backend's caches, so a step never depends on what earlier steps or evaluations left
cached) and `update(result, step)`, which trains the policy on the step's trees and returns what goes under
`train/` in the record; the loop times it as `timing_s/update`.

`progress_line` is the one per-step progress line of a method's run (steps done of the total, running mean
effective ratio, what the command adds: `simulate` the latest accuracy, `rollout` the tokens so far; and the time
left, `time_left`, which `train`'s step lines and `compare`'s run count print too).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..agent.react import NonFiniteReward
from ..methods import Method
from ..predictors.diagnostics import node_records
from ..tree import save_trees
from .engine import StepResult, TreeRolloutEngine
from .records import MetricsWriter, StepRecord, step_record


class Learner(Protocol):
    """The policy update that follows each step (none for `rollout`)."""

    def begin_step(self) -> None:
        """Called before each step's rollouts: bring the sampler to the state the step starts from."""

    def update(self, result: StepResult, step: int) -> dict[str, float]:
        """Train the policy on the step's trees; returns the step's `train/*` metrics (without the prefix)."""


@dataclass
class RunLoop:
    """One method's steps over the engine, and where their records go."""

    engine: TreeRolloutEngine
    method: Method
    pool: Callable[[int], Sequence]  # the candidate pool of a step
    seed: int = 0
    learner: Learner | None = None  # None: no update, the policy stays frozen
    evaluate: Callable[[int], dict] | None = None  # held-out metrics of the policy after `n` updates, under eval/
    eval_every: int = 1  # steps between evaluations (and one after the last step)
    log: Callable[[dict], None] | None = None  # where each flat record goes (metrics.jsonl, the train loggers)
    predictions: MetricsWriter | None = None  # the predictor's scored nodes of each step (`diagnose`)
    trees: Path | None = None  # a JSON-lines file the step's trees are appended to every `trees_every` steps
    trees_every: int = 1
    progress: Callable[[list[dict]], None] | None = None  # called with the records so far after each step
    # train's hooks: `finish(record, result)` adds what only the caller counts before the record is written,
    # `saved(step)` runs once the record is written (a checkpoint after the record it holds the state of)
    finish: Callable[[StepRecord, StepResult], None] | None = None
    saved: Callable[[int], None] | None = None

    def step(self, step: int, steps: int, before: dict | None = None) -> tuple[StepRecord, StepResult]:
        """One step of `steps`: grow the trees, record them, update the policy, evaluate when due. `before`:
        eval/ metrics of the start policy, which go into step 0's record (the start of every accuracy curve).
        An environment's non-finite reward is one line naming the environment, the task and this step."""
        try:
            return self._step(step, steps, before)
        except NonFiniteReward as err:  # the environment and task are named where the reward came back
            raise err.at(f"at step {step + 1}") from None

    def _step(self, step: int, steps: int, before: dict | None) -> tuple[StepRecord, StepResult]:
        if self.learner:
            self.learner.begin_step()
        result = self.engine.grow(self.pool(step), self.method, step)
        record = step_record(result, seed=self.seed)
        if self.learner:
            t0 = time.perf_counter()
            record.train.update(self.learner.update(result, step))
            record.timing_s["update"] = time.perf_counter() - t0
        if step == 0 and before:
            record.eval.update(before)
        if self.evaluate and ((step + 1) % self.eval_every == 0 or step == steps - 1):
            t0 = time.perf_counter()
            record.eval.update(self.evaluate(step + 1))
            record.timing_s["eval"] = time.perf_counter() - t0
        if self.finish:
            self.finish(record, result)
        return record, result

    def write(self, step: int, record: dict, result: StepResult) -> None:
        """The step's record, the predictor's scored nodes and (when due) the trees, to their files."""
        name = self.method.name
        if self.log:
            self.log(record)
        if self.predictions:
            for rec in node_records(result.active):
                self.predictions.write({"method": name, "step": step, **rec})
        if self.trees and self.trees_every and (step + 1) % self.trees_every == 0:
            save_trees(self.trees, result.active, append=True, extra={"method": name, "step": step})

    def run(self, steps: int, start: int = 0, before: dict | None = None) -> list[dict]:
        """Steps `start`..`steps - 1`; returns their flat records."""
        records: list[dict] = []
        for step in range(start, steps):
            record, result = self.step(step, steps, before)
            flat = record.flat()
            records.append(flat)
            self.write(step, flat, result)
            if self.saved:
                self.saved(step)
            if self.progress:
                self.progress(records)
        return records


def duration(seconds: float) -> str:
    """A time for a person to read: '45s', '3m05s', '2h07m'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def time_left(elapsed: float, done: int, total: int) -> str:
    """'about 3m05s left' at the mean pace so far (`elapsed` seconds for `done` of `total` units); '' before the
    first unit and after the last. An estimate: a slower step, an evaluation or a busier machine moves it."""
    if done <= 0 or done >= total:
        return ""
    return f"about {duration(elapsed / done * (total - done))} left"


def progress_line(
    label: str,
    steps: int,
    tail: Callable[[list[dict]], str],
    width: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[list[dict]], None]:
    """A `RunLoop.progress` that rewrites one stderr line after each step: `label`, steps done of `steps` (the
    count right-aligned in `width` characters), the running mean effective ratio, `tail(records)`, then the time
    left at the pace since this was made (`time_left`; `clock` for tests). The caller ends the line (a newline on
    stderr) once the method's run is done."""
    start = clock()

    def show(records: list[dict]) -> None:
        er = sum(r["rollout/effective_ratio"] for r in records) / len(records)
        left = time_left(clock() - start, len(records), steps)
        print(
            f"\r{label} step {len(records):>{width}}/{steps}  effective ratio (running mean) {er:.3f}  {tail(records)}"
            + (f"  {left}" if left else ""),
            end="",
            file=sys.stderr,
            flush=True,
        )

    return show
