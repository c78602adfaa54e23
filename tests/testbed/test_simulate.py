import json

import numpy as np

from trace_rl.methods import BudgetPlan
from trace_rl.testbed.propositions import check_propositions
from trace_rl.testbed.simulate import SimulateArgs, format_table, run_simulation, summarize

SMALL = dict(steps=4, train_tasks=128, eval_tasks=32, eval_every=2, progress=False,
             plan=BudgetPlan(prompts=8, rollouts_per_prompt=4, pool_factor=3, max_per_prompt=6))


def test_one_seed_reproduces_a_run():
    a = run_simulation(SimulateArgs(methods=("trace", "grpo"), seed=3, **SMALL))
    b = run_simulation(SimulateArgs(methods=("trace", "grpo"), seed=3, **SMALL))
    strip = lambda res: [{k: v for k, v in r.items() if not k.startswith(("time_", "wall"))} for rs in res.values() for r in rs]
    assert strip(a) == strip(b)
    c = run_simulation(SimulateArgs(methods=("trace",), seed=4, **SMALL))
    assert strip(c) != strip({"trace": a["trace"]})


def test_equal_budget_and_outputs(tmp_path):
    methods = ("grpo", "pcl", "knapsack_rl", "treepo", "trace", "trace_oracle")
    res = run_simulation(SimulateArgs(methods=methods, out_dir=str(tmp_path), save_trees_every=2, **SMALL))
    total = SMALL["plan"].total
    for name, recs in res.items():
        for r in recs:
            assert r["rollouts"] <= total
            assert r["rollouts"] >= total - 4 * SMALL["plan"].prompts  # only unspendable prefix budget is lost
            assert 0.0 <= r["effective_ratio"] <= 1.0
        assert "accuracy" in recs[-1]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(methods) * SMALL["steps"]
    assert json.loads(lines[0])["method"] == "grpo"
    assert (tmp_path / "trees_trace.jsonl").exists()
    rows = summarize(res)
    assert rows[0]["er_vs_grpo"] == 1.0
    assert "trace_oracle" in format_table(rows)


def test_trace_beats_uniform_effective_ratio_with_the_oracle():
    args = dict(SMALL, steps=6)
    res = run_simulation(SimulateArgs(methods=("grpo", "trace_oracle"), seed=0, **args))
    er = {k: np.mean([r["effective_ratio"] for r in v]) for k, v in res.items()}
    assert er["trace_oracle"] > 1.5 * er["grpo"]


def test_propositions_hold_exactly():
    r = check_propositions(tasks=16, episodes=400, seed=1)
    assert r["prop1_max_rise_exact"] <= 1e-12
    assert r["prop2_max_abs_gap_exact"] <= 1e-12
    assert abs(r["prop2_mc_qv"] - r["prop2_v0_1_minus_v0"]) < 5 * r["prop2_mc_stderr"] + 1e-3
