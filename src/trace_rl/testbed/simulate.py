"""`trace-rl simulate`: every method trains the testbed policy for S steps at equal rollout budget.

One step is the TRACE step of `rollout.engine` (stage-1 allocation, bare rollouts, stage 2 per prompt,
targets, the method's own predictor update) with the testbed's tabular policy as the actor, followed by the
policy-gradient update on the trees' advantages. Every method sees the same tasks in the same order and
starts from the same policy, so differences come from how each one spends the budget.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import numpy as np

from ..advantages import batch_advantages
from ..methods import METHODS, BudgetPlan, Method, get_method
from ..predictors import RewardHistoryPredictor
from ..predictors.diagnostics import node_records
from ..rollout.engine import EXECUTORS, TreeRolloutEngine, make_executor
from ..rollout.ray_executor import RayConfig
from ..rollout.records import MetricsWriter, step_record
from ..seeding import derive_rng
from ..tree import save_trees, turn_rows
from .actor import TestbedActor
from .env import TestbedConfig, TestbedTask, make_tasks
from .policy import SoftmaxPolicy
from .predictors import OraclePredictor, learned_predictor

DEFAULT_METHODS = ["grpo", "pcl", "knapsack_rl", "treepo", "tree_grpo", "trace", "trace_oracle"]
ABLATION_METHODS = ["trace_uniform", "trace_root_only", "trace_prefix_only", "trace", "trace_oracle"]


@dataclass
class TestbedPredictorConfig:
    """The learned predictor of the testbed (logistic on turn features)."""

    __test__ = False

    lr: float = 0.2  # Adam step size
    prefix_share: float = 0.5  # share of prefix examples in a predictor batch (paper: ~6%; see docs)

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.prefix_share < 1.0:
            raise ValueError(f"prefix_share must be in [0, 1), got {self.prefix_share}")


@dataclass
class TestbedPolicyConfig:
    """The tabular softmax policy and its update."""

    __test__ = False

    warm_start: float = 5.0  # initial logit bonus on right actions (the "SFT" policy)
    lr: float = 4.0  # policy-gradient step size

    def __post_init__(self):
        if not self.lr >= 0:
            raise ValueError(f"lr must be >= 0, got {self.lr}")


@dataclass
class SimulateConfig:
    """`trace-rl simulate`: methods compared on the synthetic testbed with exact success probabilities."""

    out: str = "runs/simulate"  # run directory: config.yaml, metrics.jsonl, summary, plots, trees
    seed: int = 0  # one seed reproduces the whole run
    seeds: list[int] = field(default_factory=list)  # several seeds: one run each, tables and plots of the mean
    steps: int = 40  # training steps per method
    methods: Optional[list[str]] = None  # methods by name (default: the baselines, or with ablation the ablation)
    ablation: bool = False  # compare TRACE's root x prefix ablation instead of the baselines
    eval_every: int = 5  # steps between exact held-out accuracy evaluations
    save_trees_every: int = 0  # write the step's trees every k steps (0: never)
    train_tasks: int = 2048  # size of the training prompt set
    eval_tasks: int = 512  # held-out prompts for exact accuracy
    progress: bool = True  # a progress line on stderr
    executor: str = "local"  # where prompt trees grow: local (asyncio in this process) or ray (Ray workers)
    ray: RayConfig = field(default_factory=RayConfig)  # the Ray cluster, with executor=ray
    budget: BudgetPlan = field(default_factory=BudgetPlan)  # rollouts per step and how tree methods split them
    predictor: TestbedPredictorConfig = field(default_factory=TestbedPredictorConfig)
    policy: TestbedPolicyConfig = field(default_factory=TestbedPolicyConfig)
    env: TestbedConfig = field(default_factory=TestbedConfig)  # the task family (its seed follows the run's)

    def __post_init__(self):
        if self.methods is None:
            self.methods = list(ABLATION_METHODS if self.ablation else DEFAULT_METHODS)
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ValueError(f"methods: unknown {unknown or 'none given'}; choose from {', '.join(METHODS)}")
        for name in ("steps", "eval_every", "train_tasks", "eval_tasks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.save_trees_every < 0:
            raise ValueError(f"save_trees_every must be >= 0, got {self.save_trees_every}")
        if not self.out:
            raise ValueError("out must be a directory path, got an empty string")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        if self.env.seed != 0:  # each run sets the family's seed to its own (`seed`, `seeds`)
            raise ValueError(
                f"env.seed: the task family follows the run's seed; set seed= or seeds=, not {self.env.seed}"
            )
        if self.train_tasks < self.budget.pool:
            raise ValueError(f"train_tasks must be >= the candidate pool ({self.budget.pool}), got {self.train_tasks}")


class MethodRun:
    """One method's run: policy, its predictor, the engine and the data order."""

    def __init__(
        self,
        method: Method,
        cfg: SimulateConfig,
        seed: int,
        train: list[TestbedTask],
        evals: list[TestbedTask],
        executor=None,
    ):
        self.method, self.cfg, self.seed = method, cfg, seed
        self.env = replace(cfg.env, seed=seed)
        self.train, self.evals = train, evals
        tasks = {t.index: t for t in train + evals}
        self.policy = SoftmaxPolicy(self.env, cfg.policy.warm_start)
        self.data_rng = derive_rng(seed, "data")  # the same prompt order for every method
        if method.predictor == "oracle":
            self.predictor = OraclePredictor(tasks, self.policy)
        elif method.predictor == "history":
            self.predictor = RewardHistoryPredictor()
        else:
            self.predictor = learned_predictor(self.env, tasks, lr=cfg.predictor.lr, seed=seed)
        self.engine = TreeRolloutEngine(
            TestbedActor(self.env, self.policy),
            self.predictor,
            cfg.budget,
            seed=seed,
            prefix_share=cfg.predictor.prefix_share,
            executor=executor,
        )

    def step(self, step: int):
        idx = self.data_rng.choice(len(self.train), size=self.cfg.budget.pool, replace=False)
        result = self.engine.grow([self.train[i] for i in idx], self.method, step)
        t0 = time.perf_counter()
        rows = []
        active = result.active
        for tree, adv in zip(active, batch_advantages(self.method.advantage, active)):
            rows += turn_rows(tree, adv)
        if rows:
            info = [r["info"] for r in rows]
            self.policy.update(
                np.array([i["kind"] for i in info]),
                np.array([i["at"] for i in info]),
                np.array([i["a"] for i in info]),
                np.array([r["advantage"] for r in rows]),
                lr=self.cfg.policy.lr,
                scale=self.cfg.budget.total,
            )
        record = step_record(result, seed=self.seed)
        record.timing_s["update"] = time.perf_counter() - t0
        return record, result


def run_simulation(cfg: SimulateConfig, seed: int | None = None, out: Path | None = None) -> dict[str, list[dict]]:
    """Run every method for one seed; returns the flat records by method, and writes metrics.jsonl,
    predictions.jsonl (for `diagnose`) and, if asked, the trees under `out`."""
    seed = cfg.seed if seed is None else seed
    env = replace(cfg.env, seed=seed)
    train = make_tasks(env, cfg.train_tasks, seed=int(derive_rng(seed, "train-tasks").integers(2**31)))
    evals = make_tasks(
        env, cfg.eval_tasks, seed=int(derive_rng(seed, "eval-tasks").integers(2**31)), start_index=cfg.train_tasks
    )
    writer = preds = None
    if out:
        writer = MetricsWriter(out / "metrics.jsonl")
        preds = MetricsWriter(out / "predictions.jsonl")
        for name in cfg.methods:
            (out / f"trees_{name}.jsonl").unlink(missing_ok=True)  # trees of an earlier run never mix in
    results: dict[str, list[dict]] = {}
    executor = make_executor(cfg.executor, cfg.ray)
    for mi, name in enumerate(cfg.methods):
        run = MethodRun(get_method(name), cfg, seed, train, evals, executor)
        records = []
        acc = run.policy.accuracy(evals)
        for step in range(cfg.steps):
            record, result = run.step(step)
            if step == 0:
                record.eval["accuracy_before"] = acc  # the policy's exact accuracy before any update
            if (step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1:
                t0 = time.perf_counter()
                acc = run.policy.accuracy(evals)
                record.eval["accuracy"] = acc
                record.timing_s["eval"] = time.perf_counter() - t0
            flat = record.flat()
            records.append(flat)
            if writer:
                writer.write(flat)
                for rec in node_records(result.active):
                    preds.write({"method": name, "step": step, **rec})
                if cfg.save_trees_every and (step + 1) % cfg.save_trees_every == 0:
                    save_trees(
                        out / f"trees_{name}.jsonl", result.active, append=True, extra={"method": name, "step": step}
                    )
            if cfg.progress:
                er = np.mean([r["rollout/effective_ratio"] for r in records])
                print(
                    f"\r[{mi + 1}/{len(cfg.methods)}] {name:<18} step {step + 1:>3}/{cfg.steps}  "
                    f"effective ratio (running mean) {er:.3f}  accuracy {acc:.3f}",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
        if cfg.progress:
            print(file=sys.stderr)
        results[name] = records
    return results
