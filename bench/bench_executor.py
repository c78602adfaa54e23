"""Executors compared on the testbed: trees per second with the local executor and with Ray workers, Ray's
overhead per tree task, and when each prompt's stage 2 starts.

    python bench/bench_executor.py                 # 2 Ray workers, 5 steps of 32 prompts x 8 rollouts
    python bench/bench_executor.py --workers 4 --steps 10

Prints measured figures only. The testbed's turns cost microseconds, so this measures the executors'
own cost (scheduling, shipping the actor and the trees), not a speed-up: Ray pays off when a tree's turns are
slow (a real model, tool calls), which the overhead per task tells you how to judge.
"""

from __future__ import annotations

import argparse
import statistics
import time

from trace_rl.methods import BudgetPlan, get_method
from trace_rl.rollout.engine import LocalExecutor, TreeRolloutEngine
from trace_rl.testbed.actor import TestbedActor
from trace_rl.testbed.env import TestbedConfig, make_tasks
from trace_rl.testbed.policy import SoftmaxPolicy
from trace_rl.testbed.predictors import learned_predictor


def run(executor, steps: int, plan: BudgetPlan) -> tuple[float, int, list[float], list[float]]:
    """(seconds, trees, stage-2 start offsets, bare-done-to-stage-2 gaps) over `steps` steps."""
    config = TestbedConfig()
    tasks = make_tasks(config, plan.pool * steps, seed=0)
    policy = SoftmaxPolicy(config, 5.0)
    predictor = learned_predictor(config, {t.index: t for t in tasks}, lr=0.2)
    engine = TreeRolloutEngine(TestbedActor(config, policy), predictor, plan, seed=0, executor=executor)
    trees, starts, gaps, t0 = 0, [], [], time.perf_counter()
    for step in range(steps):
        res = engine.grow(tasks[step * plan.pool : (step + 1) * plan.pool], get_method("trace"), step)
        trees += len(res.active)
        done = {i: s for what, i, s in res.events if what == "bare_done"}
        for what, i, s in res.events:
            if what == "stage2_start":
                starts.append(s)
                gaps.append(s - done[i])
    return time.perf_counter() - t0, trees, starts, gaps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    plan = BudgetPlan()
    from trace_rl.rollout.ray_executor import RayConfig, RayExecutor

    t0 = time.perf_counter()
    ray_ex = RayExecutor(RayConfig(workers=args.workers))  # before `import ray`: it keeps the cluster on 127.0.0.1
    startup = time.perf_counter() - t0
    import ray

    run(ray_ex, 1, plan)  # the first step starts the workers' interpreters: not charged to either side
    rows = []
    for name, ex in (("local", LocalExecutor()), (f"ray ({args.workers} workers)", ray_ex)):
        seconds, trees, starts, gaps = run(ex, args.steps, plan)
        rows.append((name, seconds, trees, starts, gaps))
    ray.shutdown()
    print(f"testbed, {args.steps} steps of {plan.prompts} prompts x {plan.rollouts_per_prompt} rollouts (trace)")
    print(f"ray local cluster start: {startup:.1f} s (once per run)")
    local_s, local_trees = rows[0][1], rows[0][2]
    for name, seconds, trees, starts, gaps in rows:
        print(
            f"{name:<18} {trees / seconds:8.1f} trees/s   stage 2 starts a median {statistics.median(starts):.3f} s "
            f"into its step (ray: its task), {1000 * statistics.median(gaps):.2f} ms after its own bare rollouts end"
        )
    ray_s, ray_trees = rows[1][1], rows[1][2]
    per_task = (ray_s / ray_trees - local_s / local_trees) * args.workers
    print(f"ray overhead per tree task: {1000 * per_task:.1f} ms of worker time (vs the local executor)")


if __name__ == "__main__":
    main()
