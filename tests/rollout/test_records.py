"""metrics.jsonl is strict JSON (jq reads it): a NaN or an infinity is written as null and read back as NaN; files
written before, with bare NaN, still read; resume trimming drops a torn or garbage line with one warning, reads a
line at a time within the records bounds (one line past them, the file left as it was), and the writer of a
resumed run keeps the records of the steps before it."""

import json
import math

import pytest

from trace_rl.errors import UserError
from trace_rl.rollout.records import MetricsWriter, finite_json, keep_records_before, read_metrics


def strict(line: str):
    return json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in strict JSON"))


def test_non_finite_values_are_written_as_null_and_read_back_as_nan(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    writer.write({"method": "grpo", "step": 0, "eval/accuracy_se_sampling": math.nan, "eval/x": math.inf})
    writer.write({"method": "grpo", "step": 1, "eval/accuracy_se_sampling": 0.01, "rollout/list": [1.0, -math.inf]})
    lines = path.read_text().splitlines()
    recs = [strict(line) for line in lines]
    assert recs[0]["eval/accuracy_se_sampling"] is None and recs[0]["eval/x"] is None
    assert recs[1]["rollout/list"] == [1.0, None]
    back = read_metrics(path)["grpo"]
    assert math.isnan(back[0]["eval/accuracy_se_sampling"]) and back[1]["eval/accuracy_se_sampling"] == 0.01
    assert finite_json({"a": float("nan")}) == '{"a": null}'


def test_an_old_file_with_bare_nan_still_reads(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"method": "trace", "step": 0, "eval/accuracy_se_sampling": NaN}\n')
    assert math.isnan(read_metrics(path)["trace"][0]["eval/accuracy_se_sampling"])


def test_trimming_keeps_earlier_steps_drops_garbage_with_one_line_and_rewrites_strictly(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"method": "trace", "step": 0, "eval/se": NaN}\n'
        '{"method": "trace", "step": 1}\n'
        '["not", "a", "record"]\n'
        '{"method": "trace", "step": 2}\n'
        + "[" * 100_000  # nested deeper than json's parser recurses
        + '\n{"method": "trace", "st'  # torn by a kill
    )
    lines: list[str] = []
    keep_records_before(path, 2, lines.append)
    kept = [strict(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in kept] == [0, 1] and kept[0]["eval/se"] is None
    assert len(lines) == 1 and "dropped 3 line(s)" in lines[0] and "line 3" in lines[0]
    keep_records_before(tmp_path / "absent.jsonl", 2, lines.append)  # nothing to trim: nothing happens
    assert not (tmp_path / "absent.jsonl").exists()


def test_a_writer_resumed_at_step_k_keeps_the_records_before_k_and_appends_the_new_ones(tmp_path):
    """A crash at step 3 (its record half written) and a resume from the checkpoint of step 2: the file ends with
    the old records of steps 0 and 1 and the redone ones, as an uninterrupted run's would."""
    path = tmp_path / "metrics.jsonl"
    first = MetricsWriter(path)
    for step in range(3):
        first.write({"method": "trace", "step": step, "run": "first"})
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"method": "trace", "step": 3, "ru')  # torn by the kill
    lines: list[str] = []
    again = MetricsWriter(path, start=2, warn=lines.append)
    for step in (2, 3):
        again.write({"method": "trace", "step": step, "run": "resumed"})
    recs = [strict(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["run"]) for r in recs] == [(0, "first"), (1, "first"), (2, "resumed"), (3, "resumed")]
    assert len(lines) == 1 and "dropped 1 line(s)" in lines[0]
    MetricsWriter(path)  # a run from the start: nothing of an earlier run is kept
    assert path.read_text() == ""
    MetricsWriter(tmp_path / "new.jsonl", start=2)  # a resume with no file yet starts one
    assert (tmp_path / "new.jsonl").read_text() == ""


def test_trimming_refuses_a_fifo_instead_of_waiting_on_it(tmp_path):
    import os

    path = tmp_path / "metrics.jsonl"
    os.mkfifo(path)
    with pytest.raises(UserError, match="metrics.jsonl.*FIFO"):
        keep_records_before(path, 2)


def test_trimming_reads_a_line_at_a_time_within_the_bounds_and_refuses_past_them(tmp_path, monkeypatch):
    from trace_rl import safe_read

    path = tmp_path / "metrics.jsonl"
    big = '{"method": "trace", "step": 1, "pad": "' + "x" * 300 + '"}\n'
    torn = '{"method": "trace", "step": 2, "note": "caf\u00e9"}\n'.encode()[:-4]  # cut inside a UTF-8 character
    path.write_bytes(b'{"method": "trace", "step": 0}\n' + big.encode() + torn)
    monkeypatch.setitem(safe_read.BOUNDS, "records", safe_read.Bound("a record", 400, 1000))
    lines: list[str] = []
    keep_records_before(path, 5, lines.append)  # within the bounds: a line torn mid-character is dropped, not fatal
    assert [strict(line)["step"] for line in path.read_text().splitlines()] == [0, 1] and "dropped 1" in lines[0]
    before = path.read_bytes()
    monkeypatch.setitem(safe_read.BOUNDS, "records", safe_read.Bound("a record", 200, 1000))
    with pytest.raises(UserError, match=r"cannot rewrite .*metrics.jsonl:2: a line over 200 bytes, the bound on a rec"):
        keep_records_before(path, 5)
    monkeypatch.setitem(safe_read.BOUNDS, "records", safe_read.Bound("a record", 400, 300))
    with pytest.raises(UserError, match=r"over the 300 bytes bound on such a file"):
        keep_records_before(path, 5)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_tiny_run_logs_calibration_that_agrees_with_its_own_counts():
    """The per-step calibration metrics of `step_record`, on a tiny testbed run (the engine every command shares)."""
    from trace_rl.methods import BudgetPlan
    from trace_rl.testbed.simulate import SimulateConfig, run_simulation

    budget = BudgetPlan(prompts=8, rollouts_per_prompt=4, pool_factor=3, max_per_prompt=6)
    cfg = SimulateConfig(
        methods=["trace", "grpo"], seed=2, steps=3, train_tasks=64, eval_tasks=8, progress=False, budget=budget
    )
    res = run_simulation(cfg)
    for rec in res["trace"]:
        assert rec["predictor/calib_root_n"] == rec["rollout/bare_rollouts"]  # every bare rollout, one sample each
        assert rec["predictor/flip_continuations"] == rec["rollout/continuations"]  # each starts at a chosen anchor
        assert rec["predictor/flip_real"] * rec["rollout/continuations"] == pytest.approx(rec["rollout/flips"])
        assert rec["predictor/examples_root"] == rec["alloc/active_prompts"]
        assert 0 < rec["predictor/examples_prefix"] <= rec["predictor/flip_chosen"]  # only chosen anchors teach
        by_depth = [k for k in rec if k.startswith("predictor/flip_d") and k.endswith("_continuations")]
        assert sum(rec[k] for k in by_depth) == rec["predictor/flip_continuations"]
        assert rec["predictor/calib_prefix_n"] == sum(
            rec[k] for k in rec if k.startswith("predictor/calib_prefix_d") and k.endswith("_n")
        )
        for key in ("calib_root_ece", "calib_prefix_ece", "flip_pred", "flip_anchors_pred"):
            assert 0.0 <= rec[f"predictor/{key}"] <= 1.0, key
    for rec in res["grpo"]:  # no prefix is scored: only the roots' calibration
        assert "predictor/calib_root_ece" in rec and not any(
            k.startswith(("predictor/calib_prefix", "predictor/flip")) for k in rec
        )
