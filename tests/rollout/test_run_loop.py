"""The one run loop on the testbed (its tabular learner, exact evaluation): a run split at a step gives the records
of one run, the files hold what the loop returns, hooks run in order, without a learner nothing is trained, and
the progress line every command shares."""

import json
from dataclasses import replace

import numpy as np

from trace_rl.methods import BudgetPlan, get_method
from trace_rl.testbed.env import make_tasks
from trace_rl.testbed.simulate import SimulateConfig, method_loop

CFG = SimulateConfig(
    steps=5,
    eval_every=2,
    train_tasks=64,
    eval_tasks=16,
    progress=False,
    budget=BudgetPlan(prompts=4, rollouts_per_prompt=4, pool_factor=2, max_per_prompt=6),
)


def loop_of(method: str = "trace", seed: int = 1):
    env = replace(CFG.env, seed=seed)
    train = make_tasks(env, CFG.train_tasks, seed=11)
    evals = make_tasks(env, CFG.eval_tasks, seed=12, start_index=CFG.train_tasks)
    return method_loop(get_method(method), CFG, seed, train, evals)


def untimed(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("timing_s/")} for r in records]


def test_a_run_split_at_a_step_gives_the_records_of_one_run():
    whole, _ = loop_of()
    expected = whole.run(CFG.steps, before={"accuracy_before": 0.5})
    split, _ = loop_of()
    records = split.run(2, before={"accuracy_before": 0.5}) + split.run(CFG.steps, start=2)
    assert untimed(records) == untimed(expected)
    assert [r["step"] for r in records] == list(range(CFG.steps))
    assert ["eval/accuracy_before" in r for r in records] == [True, False, False, False, False]  # step 0 only
    assert ["eval/accuracy" in r for r in records] == [False, True, False, True, True]  # every 2 and the last
    assert all("timing_s/update" in r and r["train/rows"] > 0 for r in records)


def test_the_files_hold_what_the_loop_returns_and_the_hooks_run_in_order(tmp_path):
    from trace_rl.rollout.records import MetricsWriter

    loop, _ = loop_of()
    seen: list[tuple] = []
    metrics = MetricsWriter(tmp_path / "metrics.jsonl")

    def log(record):
        seen.append(("log", record["step"]))
        metrics.write(record)

    def finish(record, result):
        seen.append(("finish", result.step))
        record.train["rollouts_seen"] = result.rollouts

    loop.log, loop.predictions = log, MetricsWriter(tmp_path / "predictions.jsonl")
    loop.trees, loop.trees_every = tmp_path / "trees.jsonl", 2
    loop.finish, loop.saved = finish, lambda step: seen.append(("saved", step))
    loop.progress = lambda records: seen.append(("progress", len(records)))
    records = loop.run(3)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == records
    assert all(r["train/rollouts_seen"] == r["rollout/rollouts"] for r in records)
    order = [[("finish", s), ("log", s), ("saved", s), ("progress", s + 1)] for s in range(3)]
    assert seen == [call for step in order for call in step]  # a checkpoint comes after the record it holds
    preds = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert preds and {p["step"] for p in preds} == {0, 1, 2} and {p["method"] for p in preds} == {"trace"}
    trees = [json.loads(line) for line in (tmp_path / "trees.jsonl").read_text().splitlines()]
    assert trees and {t["step"] for t in trees} == {1}  # every 2 steps: after the second


def test_without_a_learner_the_policy_stays_as_it_was_and_nothing_is_trained():
    loop, policy = loop_of("grpo")
    start = policy.theta.copy()
    loop.learner = None
    records = loop.run(2)
    assert np.array_equal(policy.theta, start)
    assert not any(k.startswith("train/") or k == "timing_s/update" for r in records for k in r)
    trained, _ = loop_of("grpo")
    assert trained.run(1)[0]["rollout/success_rate"] == records[0]["rollout/success_rate"]  # the same first step


def test_the_progress_line_rewrites_one_line_with_the_running_mean_and_the_commands_tail(capsys):
    from trace_rl.rollout.run_loop import progress_line

    now = iter([100.0, 130.0, 160.0])  # made at 100 s; two steps done at 130 s, all ten at 160 s
    show = progress_line(
        "[1/2] trace", 10, lambda recs: f"tokens {len(recs) * 1000:,}", width=3, clock=lambda: next(now)
    )
    show([{"rollout/effective_ratio": 0.5}, {"rollout/effective_ratio": 0.25}])
    err = capsys.readouterr().err
    # 15 s a step over the first two: 8 steps left are about 2 minutes
    assert err == "\r[1/2] trace step   2/10  effective ratio (running mean) 0.375  tokens 2,000  about 2m00s left"
    show([{"rollout/effective_ratio": 0.5}] * 10)
    assert capsys.readouterr().err.endswith("tokens 10,000")  # done: no time left printed


def test_durations_and_time_left_read_as_a_person_would_say_them():
    from trace_rl.rollout.run_loop import duration, time_left

    assert [duration(s) for s in (0, 44.6, 60, 185, 3600 * 2 + 7 * 60 + 20)] == ["0s", "45s", "1m00s", "3m05s", "2h07m"]
    assert time_left(30.0, 3, 12) == "about 1m30s left"
    assert time_left(0.0, 0, 12) == "" and time_left(50.0, 12, 12) == ""
