"""metrics.jsonl is strict JSON (jq reads it): a NaN or an infinity is written as null and read back as NaN; files
written before, with bare NaN, still read; resume trimming drops a torn or garbage line with one warning."""

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


def test_trimming_refuses_a_fifo_instead_of_waiting_on_it(tmp_path):
    import os

    path = tmp_path / "metrics.jsonl"
    os.mkfifo(path)
    with pytest.raises(UserError, match="metrics.jsonl.*FIFO"):
        keep_records_before(path, 2)
