"""`trace-rl simulate`: every method trains the testbed policy for S steps at equal rollout budget.

Read top to bottom, one step is DESIGN.md's data flow: candidate pool -> V~ of each root -> stage-1 root
allocation -> bare rollouts -> stage-2 prefix allocation per prompt (right after that prompt's bare rollouts)
-> continuations from forked environments -> recursive targets -> predictor update -> advantages -> policy
update -> metrics. Every method sees the same tasks in the same order and starts from the same policy, so
differences come from how each one spends the budget.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..advantages import compute_advantages
from ..allocation import prefix_flip_prob
from ..methods import BudgetPlan, Method, allocate_method_prefixes, allocate_method_roots, get_method
from ..metrics import continuation_flips, effective_ratio, mean_reward, tree_budget
from ..predictors import RewardHistoryPredictor, training_examples
from ..predictors.diagnostics import node_records, step_diagnostics
from ..tree import BARE, BRANCH, RolloutTree, save_trees, turn_rows
from .env import TestbedConfig, TestbedEnv, TestbedTask, make_tasks
from .policy import SoftmaxPolicy
from .predictors import OraclePredictor, learned_predictor

DEFAULT_METHODS = ("grpo", "pcl", "knapsack_rl", "treepo", "tree_grpo", "trace", "trace_oracle")
ABLATION_METHODS = ("trace_uniform", "trace_root_only", "trace_prefix_only", "trace", "trace_oracle")


@dataclass
class SimulateArgs:
    methods: tuple[str, ...] = DEFAULT_METHODS  # methods to compare, by name (methods.METHODS)
    steps: int = 40  # training steps per method
    seed: int = 0  # one seed reproduces the whole run
    plan: BudgetPlan = field(default_factory=BudgetPlan)  # rollouts per step and how tree methods split them
    testbed: TestbedConfig = field(default_factory=TestbedConfig)  # the task family
    train_tasks: int = 2048  # size of the training prompt set
    eval_tasks: int = 512  # held-out prompts for exact accuracy
    warm_start: float = 5.0  # initial logit bonus on right actions (the "SFT" policy)
    policy_lr: float = 4.0  # policy-gradient step size
    predictor_lr: float = 0.2  # Adam step size of the learned predictor
    prefix_share: float = 0.5  # share of prefix examples in a predictor batch (paper: ~6%; see README)
    eval_every: int = 5  # steps between exact accuracy evaluations
    out_dir: str | None = None  # run directory for metrics.jsonl, trees and plots
    save_trees_every: int = 0  # write the step's trees every k steps (0: never)
    progress: bool = True  # a progress line on stderr


class MethodRun:
    """State of one method's run: policy, predictor, data order and random streams."""

    def __init__(self, method: Method, args: SimulateArgs, train: list[TestbedTask], evals: list[TestbedTask]):
        self.method, self.args = method, args
        self.train, self.evals = train, evals
        self.tasks = {t.index: t for t in train + evals}
        self.policy = SoftmaxPolicy(args.testbed, args.warm_start)
        self.right = args.testbed.right_actions()
        self.rng = np.random.default_rng(args.seed + 1)  # rollouts and random branching
        self.data_rng = np.random.default_rng(args.seed + 2)  # same prompt order for every method
        self.learned = learned_predictor(args.testbed, self.tasks, lr=args.predictor_lr, seed=args.seed)
        self.history = RewardHistoryPredictor()
        self.oracle = OraclePredictor(self.tasks, self.policy)
        self.predictor = {"learned": self.learned, "oracle": self.oracle, "history": self.history}[method.predictor]

    def pool(self) -> list[TestbedTask]:
        idx = self.data_rng.choice(len(self.train), size=self.args.plan.pool, replace=False)
        return [self.train[i] for i in idx]

    def rollout(self, tree: RolloutTree, env: TestbedEnv, parent_id: str, origin: str, snapshots: dict | None) -> None:
        """Run the policy from `env`'s state until the episode ends, appending turns under `parent_id`."""
        done = False
        while not done:
            turn = env.turn
            action, logp = self.policy.act(env.task, turn, self.rng)
            obs, reward, done, info = env.step(action)
            node = tree.add_turn(
                parent_id, action=str(action), observation=obs, origin=origin, terminal=done,
                reward=reward if done else None, logprobs=[logp],
                info={"turn": info["turn"], "mistakes": info["mistakes"], "kind": env.task.kind, "at": turn, "a": action},
            )
            if snapshots is not None and not done:
                snapshots[node.node_id] = env.fork()
            parent_id = node.node_id

    def step(self, step: int) -> tuple[dict, list[RolloutTree]]:
        method, plan, clock = self.method, self.args.plan, {}
        pool = self.pool()
        trees = [RolloutTree(t.index, prompt=t.index) for t in pool]
        for tree in trees:
            tree.root.info = {"turn": 0, "mistakes": 0}

        t0 = time.perf_counter()
        v = self.predictor.predict([(t, t.root_id) for t in trees])
        for tree, vi in zip(trees, v):
            tree.root.predicted = float(vi)
        clock["predictor"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        m = allocate_method_roots(method, v, plan, seed=self.args.seed * 100003 + step)
        clock["allocate"] = time.perf_counter() - t0
        clock["generate"] = 0.0

        for tree, task, mi in zip(trees, pool, m):
            if mi == 0:
                continue
            t0 = time.perf_counter()
            snapshots: dict[str, TestbedEnv] = {}
            for _ in range(mi):  # stage 1: bare rollouts of this prompt
                env = TestbedEnv(self.args.testbed, self.rng.spawn(1)[0], self.right)
                env.reset(task)
                self.rollout(tree, env, tree.root_id, BARE, snapshots if method.branches else None)
            clock["generate"] += time.perf_counter() - t0
            if not method.branches:
                continue
            anchors = tree.anchors()  # stage 2 for this prompt, without waiting for the others
            if not anchors:
                continue
            t0 = time.perf_counter()
            values = self.predictor.predict([(tree, node.node_id) for node, _ in anchors])
            clock["predictor"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            for (node, _), val in zip(anchors, values):
                node.predicted = float(val)
            q = prefix_flip_prob(np.array([r for _, r in anchors]), values)
            k = allocate_method_prefixes(method, q, int(mi) * plan.branch_factor, self.rng)
            clock["allocate"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            for (node, _), kj in zip(anchors, k):
                for _ in range(kj):
                    self.rollout(tree, snapshots[node.node_id].fork(), node.node_id, BRANCH, None)
            clock["generate"] += time.perf_counter() - t0

        active = [t for t in trees if t.root.children]
        for tree in active:
            tree.compute_targets()

        t0 = time.perf_counter()
        examples, targets = training_examples(active, self.args.prefix_share, self.rng)
        pred_loss = self.learned.update(examples, targets)
        self.history.update(examples, targets)
        clock["predictor"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        rows = []
        for tree in active:
            rows += turn_rows(tree, compute_advantages(method.advantage, tree))
        if rows:
            info = [r["info"] for r in rows]
            self.policy.update(
                np.array([i["kind"] for i in info]), np.array([i["at"] for i in info]),
                np.array([i["a"] for i in info]), np.array([r["advantage"] for r in rows]),
                lr=self.args.policy_lr, scale=plan.total,
            )
        clock["update"] = time.perf_counter() - t0

        budget = tree_budget(trees)
        record = {
            "method": method.name, "step": step,
            "effective_ratio": effective_ratio(trees), "active_prompts": len(active),
            "train_reward": mean_reward(active), "rollouts": budget.rollouts,
            "continuations": budget.continuations, "flips": continuation_flips(active)[0],
            "turns": budget.turns, "prefix_turns": budget.prefix_turns,
            "predictor_loss": pred_loss, **{f"time_{k}": v for k, v in clock.items()},
            **step_diagnostics(active),
        }
        return record, trees


def run_simulation(args: SimulateArgs) -> dict[str, list[dict]]:
    """Run every method; returns the per-step records by method and writes them if out_dir is set."""
    methods = [get_method(name) for name in args.methods]
    if args.steps < 1:
        raise ValueError(f"steps must be >= 1, got {args.steps}")
    train = make_tasks(args.testbed, args.train_tasks, seed=args.seed * 7 + 11)
    evals = make_tasks(args.testbed, args.eval_tasks, seed=args.seed * 7 + 13, start_index=args.train_tasks)
    out = Path(args.out_dir) if args.out_dir else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("")
        (out / "predictions.jsonl").write_text("")
        (out / "args.json").write_text(json.dumps(asdict(args), indent=2, default=str))
    results: dict[str, list[dict]] = {}
    for mi, method in enumerate(methods):
        run = MethodRun(method, args, train, evals)
        records, start = [], time.perf_counter()
        acc = run.policy.accuracy(evals)
        for step in range(args.steps):
            record, trees = run.step(step)
            if (step + 1) % args.eval_every == 0 or step == args.steps - 1:
                acc = run.policy.accuracy(evals)
                record["accuracy"] = acc
            record["wall_s"] = time.perf_counter() - start
            records.append(record)
            if out:
                with open(out / "metrics.jsonl", "a") as fh:
                    fh.write(json.dumps(record) + "\n")
                with open(out / "predictions.jsonl", "a") as fh:
                    for rec in node_records(t for t in trees if t.root.children):
                        fh.write(json.dumps({"method": method.name, "step": step, **rec}) + "\n")
                if args.save_trees_every and (step + 1) % args.save_trees_every == 0:
                    save_trees(out / f"trees_{method.name}.jsonl", [t for t in trees if t.root.children], append=True)
            if args.progress:
                er = np.mean([r["effective_ratio"] for r in records])
                print(f"\r[{mi + 1}/{len(methods)}] {method.name:<18} step {step + 1:>3}/{args.steps}  "
                      f"effective ratio {er:.3f}  accuracy {acc:.3f}", end="", file=sys.stderr, flush=True)
        if args.progress:
            print(file=sys.stderr)
        results[method.name] = records
    return results


def average_runs(runs: list[dict[str, list[dict]]]) -> dict[str, list[dict]]:
    """Step-wise mean of every numeric field over runs with different seeds (same methods and steps)."""
    out: dict[str, list[dict]] = {}
    for name in runs[0]:
        out[name] = []
        for step, first in enumerate(runs[0][name]):
            recs = [run[name][step] for run in runs]
            avg = {}
            for k, v in first.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and all(k in r for r in recs):
                    mean = float(np.mean([r[k] for r in recs]))
                    v = int(round(mean)) if isinstance(v, int) else mean
                avg[k] = v
            avg["step"] = step
            out[name].append(avg)
    return out


def summarize(results: dict[str, list[dict]], baseline: str = "grpo") -> list[dict]:
    """One row per method: final accuracy, mean effective ratio (and vs the baseline), budget, time."""
    rows = []
    base_er = np.mean([r["effective_ratio"] for r in results[baseline]]) if baseline in results else None
    for name, recs in results.items():
        er = float(np.mean([r["effective_ratio"] for r in recs]))
        turns = sum(r["turns"] for r in recs)
        continuations = sum(r["continuations"] for r in recs)
        rows.append({
            "method": name,
            "final_accuracy": recs[-1]["accuracy"],
            "effective_ratio": er,
            "er_vs_" + baseline: (er / base_er) if base_er else float("nan"),
            "rollouts": sum(r["rollouts"] for r in recs),
            "turns": turns,
            "prefix_share": continuations / max(sum(r["rollouts"] for r in recs), 1),
            "flip_rate": sum(r["flips"] for r in recs) / continuations if continuations else float("nan"),
            "wall_s": recs[-1]["wall_s"],
        })
    return rows


def format_table(rows: list[dict]) -> str:
    cols = list(rows[0])
    cells = [[f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])
