"""TRACE with its learned predictor (method `trace`, not the oracle) beats GRPO's effective ratio on every seed.

The learned V~ starts uninformed and is fitted online to the trees the run grows; the oracle version is tested
in test_simulate.py. What is compared is the whole method at equal budget (root allocation by V~ and stage-2
branching together), not the predictor alone. Small settings, about a second per seed."""

import numpy as np
import pytest

from trace_rl.methods import BudgetPlan
from trace_rl.testbed.simulate import SimulateConfig, run_simulation

SETTINGS = dict(
    steps=8,
    train_tasks=256,
    eval_tasks=16,
    eval_every=8,
    progress=False,
    budget=BudgetPlan(prompts=16, rollouts_per_prompt=4, pool_factor=3, max_per_prompt=6),
)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_learned_trace_beats_grpo_effective_ratio(seed):
    res = run_simulation(SimulateConfig(methods=["grpo", "trace"], seed=seed, **SETTINGS))
    er = {m: np.mean([r["rollout/effective_ratio"] for r in recs]) for m, recs in res.items()}
    assert er["trace"] > er["grpo"], er
