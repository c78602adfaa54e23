"""bench/step_cost.py's accounting, not its timings: the parts of a step add up to its wall clock, the recorded
backend calls hold every token the step generated, and the paired ratios are per seed against GRPO's steps."""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses and step_cost look it up
    spec.loader.exec_module(module)  # runs nothing: main() is behind __name__ == "__main__"
    return module


tables = _load("step_cost_tables")
step_cost = _load("step_cost")


def call(start, end, generated=1):
    return step_cost.Call(start, end, rows=1, prompt_tokens=4, computed_tokens=1, generated=generated)


def test_busy_seconds_is_the_union_of_the_calls():
    calls = [call(0.0, 1.0), call(0.5, 2.0), call(3.0, 3.5), call(3.1, 3.2)]
    assert step_cost.busy_seconds(calls) == pytest.approx(2.5)
    assert step_cost.busy_seconds([]) == 0.0


@pytest.mark.parametrize("total", [10.0, 4.0])  # 4 s: the parts overlap (eager batching) by 2 s
def test_the_parts_add_up_to_the_step(total):
    result = SimpleNamespace(time={"generate": 5.0, "env": 1.0, "predictor": 0.5, "allocate": 0.5, "total": total})
    parts, overlap = step_cost.split_step(result, [call(0.0, 2.0), call(1.0, 4.0)])
    assert parts["generate"] == 4.0  # the calls' union, not the engine's sum of call times
    assert sum(parts.values()) - overlap == pytest.approx(total)
    assert min(parts.values()) >= 0 and overlap >= 0 and (parts["other"] == 0 or overlap == 0)


def cost(method, seed, wall, tokens):
    parts = dict.fromkeys(tables.PARTS, wall / 5)
    return tables.StepCost(method, seed, 0, wall, parts, 0.0, 8, tokens, 3, tokens, 10, 5)


def test_ratios_are_paired_by_seed():
    rows = [cost("grpo", 0, 2.0, 100), cost("trace", 0, 1.0, 40), cost("grpo", 1, 4.0, 200), cost("trace", 1, 4.0, 100)]
    table = {r["method"]: r for r in tables.summarize(rows)}
    assert table["grpo"]["wall_ratio"][0] == table["grpo"]["excess"][0] == 1.0
    assert table["trace"]["wall_ratio"][0] == pytest.approx((0.5 + 1.0) / 2)  # seed by seed, not pooled
    assert table["trace"]["token_ratio"][0] == pytest.approx((0.4 + 0.5) / 2)
    assert table["trace"]["excess"][0] == pytest.approx((1.25 + 2.0) / 2)
    assert "missed" in tables.goal_line(list(table.values()))


def test_a_run_on_the_tiny_model_accounts_for_every_token_and_second(capsys, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    argv = ["--seeds", "0,1", "--steps", "1", "--methods", "grpo,trace", "budget.prompts=2", "budget.pool_factor=2"]
    out = step_cost.main(argv + ["--json", str(tmp_path / "run.json.gz")])
    text = capsys.readouterr().out
    assert "goal (trace wall/grpo" in text and "trace_root_only" not in text
    steps = out["steps"]
    assert sorted((s["method"], s["seed"]) for s in steps) == [("grpo", 0), ("grpo", 1), ("trace", 0), ("trace", 1)]
    for s in steps:
        assert s["call_tokens"] == s["tokens"] > 0  # the recorder saw every call of the step
        assert sum(s["parts"].values()) - s["overlap"] == pytest.approx(s["wall"])
        # round batching: generation, env steps and predictor take turns (up to the clocks' thread hand-offs, ~1 ms)
        assert s["overlap"] <= 0.02 * s["wall"]
        assert s["rounds"] >= 1 and 0 <= s["cached_tokens"] <= s["prompt_tokens"]
        assert s["rollouts"] <= 16 and s["reference_tps"] > 0
    grpo = {s["seed"]: s for s in steps if s["method"] == "grpo"}
    trace = next(r for r in out["tables"]["round"] if r["method"] == "trace")
    expected = [s["tokens"] / grpo[s["seed"]]["tokens"] for s in steps if s["method"] == "trace"]
    assert trace["token_ratio"][0] == pytest.approx(sum(expected) / 2)
    again = step_cost.main(["--from", str(tmp_path / "run.json.gz")])  # the stored run prints the same tables
    assert json.dumps(again["tables"]) == json.dumps(out["tables"])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a stored step_cost run"):
        step_cost.main(["--from", str(tmp_path / "bad.json")])


def test_a_bad_setting_is_one_line():
    with pytest.raises(SystemExit) as stop:
        step_cost.main(["--seeds", "0", "policy.backend=nope"])
    assert "policy.backend" in str(stop.value) and "\n" not in str(stop.value)
    with pytest.raises(SystemExit) as stop:
        step_cost.main(["--seeds", "0", "--batchings", "round,continuous"])  # the hf backend serves one call at a time
    assert "engine.batching=continuous needs a backend that serves calls at once" in str(stop.value)
    with pytest.raises(SystemExit) as stop:
        step_cost.main(["--seeds", "0", "executor=ray"])
    assert "executor: step_cost records the backend's calls in this process" in str(stop.value)


def test_batching_policies_are_compared_method_by_method_and_seed_by_seed():
    rows = [cost("grpo", 0, 2.0, 100), cost("grpo", 1, 4.0, 100), cost("grpo", 0, 1.0, 100), cost("grpo", 1, 3.0, 100)]
    rows[2].batching = rows[3].batching = "continuous"
    (line,) = tables.across_batchings(rows)
    assert line.startswith("step wall, continuous over round") and "grpo 0.62 " in line  # (0.5 + 0.75) / 2


def test_row_scaling_recovers_the_exponent_of_the_calls_cost():
    calls = [(rows, 10, 10 * 0.01 * rows**0.5) for rows in (1, 4, 16, 64)]
    slope, used = tables.row_scaling(calls + [(8, 2, 99.0)])  # 2 iterations: too short to count
    assert slope == pytest.approx(0.5) and used == 4
    assert tables.row_scaling([(4, 10, 1.0), (4, 10, 2.0), (4, 10, 3.0)]) is None  # one row count: no slope
