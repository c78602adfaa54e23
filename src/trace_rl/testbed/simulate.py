"""`trace-rl simulate`: every method trains the testbed policy for S steps at equal rollout budget.

One step is the TRACE step of `rollout.engine` (stage-1 allocation, bare rollouts, stage 2 per prompt,
targets, the method's own predictor update) with the testbed's tabular policy as the actor, followed by the
policy-gradient update on the trees' advantages (`TabularLearner`), both driven by the one run loop
(`rollout.run_loop`) that `rollout` and `train` use. Every method sees the same tasks in the same order and
starts from the same policy, so differences come from how each one spends the budget.

Two presets (`preset=`): `learning` (the default) starts the policy weak (warm start 1.5), far below the
accuracy the task mix allows, so training moves held-out accuracy and methods can differ in what the budget
buys; `contrast` is the earlier set-up (warm start 5.0, near the ceiling from the start), where accuracy
barely moves and only allocation figures (effective ratio, contrast groups) separate the methods. Both keep
the task mix, so a preset changes the starting policy only; the measurements behind the choice are in
lab/notes/2026-12-01-accuracy-testbed.md. With several seeds the summary adds accuracy with
95% intervals and paired per-seed differences (testbed/report.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Optional

import numpy as np

from ..advantages import batch_advantages
from ..methods import BudgetPlan, Method, get_method
from ..paths import check_weighting, turn_rows
from ..registry import PREDICTORS, call
from ..rollout.engine import TreeRolloutEngine, check_executor, make_executor
from ..rollout.ray_executor import RayConfig
from ..rollout.records import MetricsWriter, read_metrics
from ..rollout.run_loop import RunLoop, progress_line
from ..seeding import derive_rng
from ..trace_config import (
    PredictorGroup,
    TraceConfig,
    check_advantage,
    check_methods,
    check_predictor_kind,
    predictor_kinds,
)
from .actor import TestbedActor
from .env import TestbedConfig, TestbedTask, make_tasks
from .policy import SoftmaxPolicy
from .predictors import learned_predictor

DEFAULT_METHODS = ["grpo", "pcl", "knapsack_rl", "treepo", "tree_grpo", "trace", "trace_oracle"]
ABLATION_METHODS = ["trace_uniform", "trace_root_only", "trace_prefix_only", "trace", "trace_oracle"]

# A preset fills the settings it names that the user left unset (a key given on the command line, in a file
# or to the constructor wins). `learning` (the default): a weak warm start, so training has room to move
# held-out accuracy (lab/notes/2026-12-01-accuracy-testbed.md has the measurements behind the values).
# `contrast`: the earlier default, a policy that starts near its ceiling, for pure allocation checks
# (effective ratio, contrast per rollout) where accuracy barely moves.
PRESETS: dict[str, dict[str, object]] = {
    "learning": {"policy.warm_start": 1.5, "env.difficulty_mix": (0.45, 0.10, 0.45)},
    "contrast": {"policy.warm_start": 5.0, "env.difficulty_mix": (0.45, 0.10, 0.45)},
}


TESTBED_LR = 0.2  # Adam step size of the testbed's learned logistic where predictor.lr is unset


@dataclass
class TestbedPredictorConfig(PredictorGroup):
    """TRACE's predictor settings on the testbed (`trace_config.PredictorGroup`, the names the LM commands, verl
    and TRL read): `kind` light is the testbed's learned logistic on turn features (its stand-in for the text
    predictor), `history` the reward history; `lr` is the logistic's step size (unset: TESTBED_LR)."""

    __test__ = False

    def __post_init__(self):
        super().__post_init__()
        kinds = [k for k in predictor_kinds() if k in PREDICTORS]
        if self.kind not in kinds and ":" not in self.kind:
            raise ValueError(f"kind: the testbed has no {self.kind!r} (no LM critic here); choose {', '.join(kinds)}")
        check_predictor_kind(self.kind)


@dataclass
class TestbedPolicyConfig:
    """The tabular softmax policy and its update."""

    __test__ = False

    warm_start: Optional[float] = None  # initial logit bonus on right actions (the "SFT" policy); unset: the preset's
    lr: float = 4.0  # policy-gradient step size

    def __post_init__(self):
        if not self.lr >= 0:
            raise ValueError(f"lr must be >= 0, got {self.lr}")


@dataclass
class SimulateConfig:
    """`trace-rl simulate`: methods compared on the synthetic testbed with exact success probabilities."""

    out: str = "runs/simulate"  # run directory: config.yaml, metrics.jsonl, summary, plots, trees
    preset: str = "learning"  # learning (training moves accuracy) | contrast (starts near the ceiling)
    seed: int = 0  # one seed reproduces the whole run
    seeds: list[int] = field(default_factory=list)  # several seeds: one run each, tables and plots of the mean
    reuse: bool = False  # with several seeds: read a seed's finished run (same settings) instead of rerunning it
    steps: int = 40  # training steps per method
    methods: Optional[list[str]] = None  # methods by name (default: the baselines, or with ablation the ablation)
    ablation: bool = False  # compare TRACE's root x prefix ablation instead of the baselines
    advantage: str = TraceConfig.advantage  # estimator for every method ('': each method's own)
    eval_every: int = 5  # steps between exact held-out accuracy evaluations
    save_trees_every: int = 0  # write the step's trees every k steps (0: never)
    train_tasks: int = 2048  # size of the training prompt set
    eval_tasks: int = 512  # held-out prompts for exact accuracy
    progress: bool = True  # a progress line on stderr
    executor: str = "local"  # where prompt trees grow: local (asyncio in this process) or ray (Ray workers)
    ray: RayConfig = field(default_factory=RayConfig)  # the Ray cluster, with executor=ray
    budget: BudgetPlan = field(default_factory=BudgetPlan)  # rollouts per step and how tree methods split them
    predictor: TestbedPredictorConfig = field(default_factory=TestbedPredictorConfig)
    weighting: str = TraceConfig.weighting  # a turn shared by k leaves: first (once) | leaf (k times) | split (1/k)
    policy: TestbedPolicyConfig = field(default_factory=TestbedPolicyConfig)
    env: TestbedConfig = field(default_factory=TestbedConfig)  # the task family (its seed follows the run's)

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        values = PRESETS[self.preset]
        if self.policy.warm_start is None:
            self.policy = replace(self.policy, warm_start=float(values["policy.warm_start"]))
        if self.env.difficulty_mix is None:
            self.env = replace(self.env, difficulty_mix=tuple(values["env.difficulty_mix"]))
        if self.methods is None:
            self.methods = list(ABLATION_METHODS if self.ablation else DEFAULT_METHODS)
        check_methods(self.methods)
        check_weighting(self.weighting)
        check_advantage(self.advantage)
        for name in ("steps", "eval_every", "train_tasks", "eval_tasks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.save_trees_every < 0:
            raise ValueError(f"save_trees_every must be >= 0, got {self.save_trees_every}")
        if not self.out:
            raise ValueError("out must be a directory path, got an empty string")
        check_executor(self.executor, methods=self.methods)
        if self.env.seed != 0:  # each run sets the family's seed to its own (`seed`, `seeds`)
            raise ValueError(
                f"env.seed: the task family follows the run's seed; set seed= or seeds=, not {self.env.seed}"
            )
        if self.train_tasks < self.budget.pool:
            raise ValueError(f"train_tasks must be >= the candidate pool ({self.budget.pool}), got {self.train_tasks}")

    def trace_config(self, method: str | Method) -> TraceConfig:
        """TRACE's configuration of `method`'s run (a name or the `Method`): the estimator, the budget, the
        predictor settings and the weighting."""
        return TraceConfig(method, self.advantage, self.budget, self.predictor.settings(), self.weighting)


class TabularLearner:
    """The testbed's learner (`rollout.run_loop.Learner`): a policy-gradient step of the tabular policy on the
    rows of the step's trees, weighted by the method's advantages."""

    def __init__(self, policy: SoftmaxPolicy, advantage: str, lr: float, scale: int, weighting: str = "first"):
        self.policy, self.advantage, self.lr, self.scale = policy, advantage, lr, scale
        self.weighting = weighting  # each turn is one row here; its weight (`paths.turn_rows`) scales its advantage

    def begin_step(self) -> None:
        """Nothing to prepare: the tabular policy samples its current logits."""

    def update(self, result, step: int) -> dict[str, float]:
        """Returns the update side of the chain: rows trained, the share with a non-zero advantage, the step's
        size."""
        rows = []
        active = result.active
        for tree, adv in zip(active, batch_advantages(self.advantage, active)):
            rows += turn_rows(tree, adv, self.weighting)
        before = self.policy.theta.copy()
        if rows:
            info = [r["info"] for r in rows]
            self.policy.update(
                np.array([i["kind"] for i in info]),
                np.array([i["at"] for i in info]),
                np.array([i["a"] for i in info]),
                np.array([r["advantage"] * r["weight"] for r in rows]),
                lr=self.lr,
                scale=self.scale,
            )
        adv = np.array([r["advantage"] for r in rows])
        return {
            "rows": len(rows),
            "nonzero_advantage_share": float(np.mean(np.abs(adv) > 1e-12)) if rows else 0.0,
            "update_norm": float(np.linalg.norm(self.policy.theta - before)),
        }


def method_loop(
    method: Method,
    cfg: SimulateConfig,
    seed: int,
    train: list[TestbedTask],
    evals: list[TestbedTask],
    executor=None,
) -> tuple[RunLoop, SoftmaxPolicy]:
    """One method's run on the testbed: its policy, its predictor, the engine, the data order (the same prompts
    for every method) and the tabular learner, as a run loop (without outputs); also returns the policy."""
    env = replace(cfg.env, seed=seed)
    tasks = {t.index: t for t in train + evals}
    policy = SoftmaxPolicy(env, cfg.policy.warm_start)
    data_rng = derive_rng(seed, "data")  # the same prompt order for every method
    trace = cfg.trace_config(method)
    # the method's own V~, else predictor.kind's, where its entry builds one here; else the learned logistic
    own = method.own_predictor or PREDICTORS.resolve(trace.predictor.kind)
    if own.testbed is not None:
        predictor = call(own.testbed, env, tasks, policy, cfg.predictor, seed)
    else:
        lr = TESTBED_LR if trace.predictor.lr is None else trace.predictor.lr
        predictor = learned_predictor(env, tasks, lr=lr, seed=seed)
    engine = TreeRolloutEngine.from_config(TestbedActor(env, policy), predictor, trace, seed=seed, executor=executor)
    loop = RunLoop(
        engine,
        method,
        pool=lambda step: [train[i] for i in data_rng.choice(len(train), size=cfg.budget.pool, replace=False)],
        seed=seed,
        learner=TabularLearner(policy, trace.advantage_name, cfg.policy.lr, cfg.budget.total, trace.weighting),
        evaluate=lambda step: {"accuracy": policy.accuracy(evals)},  # exact, over the held-out prompts
        eval_every=cfg.eval_every,
    )
    return loop, policy


def _latest_accuracy(before: float, records: list[dict]) -> str:
    """The progress line's tail: the latest held-out accuracy (the one before training until the first)."""
    return f"accuracy {next((r['eval/accuracy'] for r in reversed(records) if 'eval/accuracy' in r), before):.3f}"


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
        loop, policy = method_loop(get_method(name), cfg, seed, train, evals, executor)
        before = policy.accuracy(evals)  # the policy's exact accuracy before any update
        if out:
            loop.log, loop.predictions = writer.write, preds
            if cfg.save_trees_every:
                loop.trees, loop.trees_every = out / f"trees_{name}.jsonl", cfg.save_trees_every
        if cfg.progress:
            label = f"[{mi + 1}/{len(cfg.methods)}] {name:<18}"
            loop.progress = progress_line(label, cfg.steps, partial(_latest_accuracy, before), width=3)
        results[name] = loop.run(cfg.steps, before={"accuracy_before": before})
        if cfg.progress:
            print(file=sys.stderr)
    return results


def _settings(cfg: SimulateConfig, seed: int) -> str:
    """The settings one seed's run depends on, as text (what `reuse` compares)."""
    from omegaconf import OmegaConf

    one = replace(cfg, seed=seed, seeds=[], out=".", reuse=False, progress=True)
    return OmegaConf.to_yaml(OmegaConf.structured(one))


def run_seeds(cfg: SimulateConfig, out: Path) -> list[dict[str, list[dict]]]:
    """One run per seed of `cfg.seeds` (or cfg.seed alone) under out/seed<k> (out itself for one seed); with
    `reuse`, a seed directory whose settings.yaml matches and whose metrics hold every method's steps is read
    instead of rerun, so a long study can be split over several commands and aggregated by the last."""
    seeds = list(cfg.seeds) or [cfg.seed]
    runs = []
    for seed in seeds:
        where = out / f"seed{seed}" if len(seeds) > 1 else out
        settings = _settings(cfg, seed)
        done = where / "metrics.jsonl"
        if cfg.reuse and done.exists() and (where / "settings.yaml").exists():
            old = read_metrics(done)
            if (where / "settings.yaml").read_text() == settings and all(
                len(old.get(m, [])) == cfg.steps for m in cfg.methods
            ):
                print(f"seed {seed}: reusing {done}", file=sys.stderr)
                runs.append({m: old[m] for m in cfg.methods})
                continue
        if len(seeds) > 1:
            print(f"seed {seed}", file=sys.stderr)
        where.mkdir(parents=True, exist_ok=True)
        (where / "settings.yaml").unlink(missing_ok=True)  # written only once the run is complete
        runs.append(run_simulation(cfg, seed, where))
        (where / "settings.yaml").write_text(settings)
    return runs
