"""Presets of `simulate`, the multi-seed accuracy statistics on hand-built runs, and `reuse` of finished seeds."""

import math

import pytest

from trace_rl.config import ConfigError, load_config
from trace_rl.methods import BudgetPlan
from trace_rl.rollout.report import accuracy_at, accuracy_curve
from trace_rl.testbed import simulate as sim
from trace_rl.testbed.env import DEFAULT_MIX, TestbedConfig
from trace_rl.testbed.report import format_seed_table, paired_difference, seed_statistics
from trace_rl.testbed.simulate import PRESETS, SimulateConfig, TestbedPolicyConfig, run_seeds


def test_the_default_preset_is_learning_and_contrast_keeps_the_earlier_values():
    cfg = SimulateConfig()
    assert cfg.preset == "learning"
    assert cfg.policy.warm_start == PRESETS["learning"]["policy.warm_start"] == 1.5
    assert cfg.env.difficulty_mix == PRESETS["learning"]["env.difficulty_mix"]
    old = SimulateConfig(preset="contrast")
    assert old.policy.warm_start == 5.0 and old.env.difficulty_mix == (0.45, 0.10, 0.45)
    assert TestbedConfig().mix == DEFAULT_MIX  # outside simulate an unset mix is the old default


def test_explicit_keys_win_over_the_preset():
    cfg = SimulateConfig(preset="contrast", policy=TestbedPolicyConfig(warm_start=3.0))
    assert cfg.policy.warm_start == 3.0 and cfg.env.difficulty_mix == (0.45, 0.10, 0.45)
    cfg, text = load_config(SimulateConfig, ["preset=contrast", "env.difficulty_mix=0.2,0.6,0.2"])
    assert cfg.policy.warm_start == 5.0 and cfg.env.difficulty_mix == (0.2, 0.6, 0.2)
    assert "warm_start: 5.0" in text  # the resolved values are what config.yaml records
    cfg, _ = load_config(SimulateConfig, ["policy.warm_start=5.0"])  # the learning preset, one key changed
    assert cfg.preset == "learning" and cfg.policy.warm_start == 5.0
    with pytest.raises(ConfigError, match="preset"):
        load_config(SimulateConfig, ["preset=fast"])


def _run(before, points):
    """Records of one method: eval/accuracy_before at step 0, then (rollouts, turns, accuracy or None) per step."""
    recs = []
    for i, (rollouts, turns, acc) in enumerate(points):
        r = {"rollout/rollouts": rollouts, "rollout/turns": turns}
        if i == 0:
            r["eval/accuracy_before"] = before
        if acc is not None:
            r["eval/accuracy"] = acc
        recs.append(r)
    return recs


def test_curve_starts_at_zero_and_accumulates_cost():
    recs = _run(0.2, [(10, 30, None), (10, 30, 0.4), (10, 30, None), (10, 30, 0.5)])
    xs, ys = accuracy_curve(recs)  # from the accuracy before training the first record holds
    assert xs.tolist() == [0, 20, 40] and ys.tolist() == [0.2, 0.4, 0.5]
    assert accuracy_curve(recs, cost="rollout/turns")[0].tolist() == [0, 60, 120]
    assert accuracy_at(accuracy_curve(recs), 30) == pytest.approx(0.45)


def test_seed_statistics_by_hand():
    # two seeds; grpo goes 0.2 -> 0.4 -> 0.6 (seed 0) and 0.2 -> 0.3 -> 0.5 (seed 1) over 20 and 40 rollouts;
    # trace ends at 0.7 and 0.5, crossing grpo's final 0.6 at 30 rollouts on seed 0 (0.5 at 20, 0.7 at 40)
    # and 0.5 at 40 on seed 1 (exactly at its last evaluation)
    grpo = [_run(0.2, [(20, 40, 0.4), (20, 40, 0.6)]), _run(0.2, [(20, 40, 0.3), (20, 40, 0.5)])]
    trace = [_run(0.2, [(20, 20, 0.5), (20, 20, 0.7)]), _run(0.2, [(20, 20, 0.4), (20, 20, 0.5)])]
    runs = [{"grpo": grpo[i], "trace": trace[i]} for i in range(2)]
    rows = {r["method"]: r for r in seed_statistics(runs)}
    t = rows["trace"]
    assert t["final_accuracy"]["mean"] == pytest.approx(0.6)
    # t interval of (0.7, 0.5): half width 12.7062 * 0.14142 / sqrt(2) = 1.27062
    assert t["final_accuracy"]["hi"] - 0.6 == pytest.approx(1.27062, rel=1e-4)
    assert t["gain"]["mean"] == pytest.approx(0.4)
    assert t["rollouts_to_grpo_final"]["mean"] == pytest.approx(35.0) and t["rollouts_to_grpo_final"]["reached"] == 2
    assert t["turns_to_grpo_final"]["mean"] == pytest.approx((30 + 40) / 2)  # 20 turns per step: 30 and 40
    # paired differences trace - grpo at equal rollouts (40): +0.1 and 0.0; resampled means 0, 0.05, 0.1
    assert t["minus_grpo"]["mean"] == pytest.approx(0.05)
    assert t["minus_grpo"]["lo"] == pytest.approx(0.0) and t["minus_grpo"]["hi"] == pytest.approx(0.1)
    g = rows["grpo"]
    assert g["trace_minus"]["mean"] == pytest.approx(0.05) and "minus_grpo" not in g
    assert g["rollouts_to_grpo_final"]["mean"] == pytest.approx(40.0)
    # at equal turns (trace's 40, grpo's 80): trace 0.7 and 0.5 against grpo's 0.4 and 0.3 at 40 turns
    assert t["minus_grpo_turns"]["mean"] == pytest.approx(0.25) and g["trace_minus_turns"]["mean"] == pytest.approx(
        0.25
    )
    table = format_seed_table(list(rows.values()))
    assert "+0.050 [+0.000, +0.100]" in table and "35 [" in table and "+0.250 [+0.200, +0.300]" in table
    pair = paired_difference(grpo, trace, "turns")
    assert pair["per_seed"] == pytest.approx([-0.3, -0.2]) and pair["mean"] == pytest.approx(-0.25)
    assert paired_difference(trace, grpo)["per_seed"] == pytest.approx([0.1, 0.0])  # equal rollouts by default
    with pytest.raises(ValueError, match="same seeds"):
        paired_difference(grpo, trace[:1])


def test_a_method_that_never_reaches_the_target_counts_no_seed():
    grpo = _run(0.2, [(10, 10, 0.6)])
    flat = _run(0.2, [(10, 10, 0.3)])
    row = {r["method"]: r for r in seed_statistics([{"grpo": grpo, "x": flat}])}["x"]
    assert row["rollouts_to_grpo_final"]["reached"] == 0 and math.isnan(row["rollouts_to_grpo_final"]["mean"])
    assert math.isnan(row["final_accuracy"]["lo"])  # one seed: no interval


SMALL = dict(
    steps=2,
    train_tasks=64,
    eval_tasks=16,
    eval_every=1,
    progress=False,
    methods=["grpo"],
    budget=BudgetPlan(prompts=4, rollouts_per_prompt=4, pool_factor=2, max_per_prompt=6),
)


def test_reuse_reads_finished_seeds_with_the_same_settings(tmp_path, monkeypatch):
    first = run_seeds(SimulateConfig(seeds=[0, 1], **SMALL), tmp_path)
    calls = []
    real = sim.run_simulation
    monkeypatch.setattr(sim, "run_simulation", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    again = run_seeds(SimulateConfig(seeds=[0, 1, 2], reuse=True, **SMALL), tmp_path)
    assert calls == [2] and again[:2] == first
    run_seeds(SimulateConfig(seeds=[0, 1], reuse=True, **dict(SMALL, steps=3)), tmp_path)  # settings differ
    assert calls == [2, 0, 1]
