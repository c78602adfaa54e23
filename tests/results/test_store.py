"""The compact results store: what it keeps of a run, byte-for-byte writes, strict JSON, bounded checked reads."""

import gzip
import json
import math

import pytest

from trace_rl.results import store


def _lm_run(root, method="trace", pair="ws2-seed100", steps=3, anchors=True):
    run = root / method / pair
    run.mkdir(parents=True)
    summary = {
        "method": method,
        "seed": 100,
        "steps": steps,
        "accuracy_before": 0.5,
        "accuracy_after": 0.6,
        "accuracy_se": 0.01,
        "rollouts": 64 * steps,
        "warm_start": {"weights_digest": "abc"},
        "out": str(run),
    }
    (run / "train_summary.json").write_text(json.dumps(summary))
    recs = [
        {
            "method": method,
            "step": s,
            "rollout/effective_ratio": 1 / 3,
            "rollout/generated_tokens": 100 + s,
            "train/rollouts_total": 64 * (s + 1),
            "predictor/ece": 0.1,
            "rollout/flips": math.nan,
        }
        for s in range(steps)
    ]
    recs[-1]["eval/accuracy"] = 0.6
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if anchors:
        preds = [
            {"method": method, "step": 0, "depth": 0, "predicted": 0.5, "target": 1.0},
            {"method": method, "step": 0, "depth": 1, "predicted": 0.4, "bare_reward": 1.0, "flip_pred": 0.6},
            {
                "method": method,
                "step": 1,
                "depth": 2,
                "predicted": 0.123456789,
                "bare_reward": 0.0,
                "flip_pred": 0.123456789,
                "continuations": 2,
                "flips": 1,
            },
        ]
        (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in preds))
    return run


def test_a_run_keeps_its_summary_the_named_step_metrics_and_only_the_chosen_prefixes(tmp_path):
    _lm_run(tmp_path)
    (line,) = store.compact_study(tmp_path)
    assert line["method"] == "trace" and line["pair"] == "ws2-seed100" and line["warm"] == 2
    assert line["summary"]["accuracy_after"] == 0.6 and "out" not in line["summary"]
    assert line["warm_start"] == "abc"
    assert set(line["records"][0]) == {
        "step",
        "rollout/effective_ratio",
        "rollout/generated_tokens",
        "train/rollouts_total",
        "rollout/flips",
    }
    assert line["records"][0]["rollout/effective_ratio"] == 0.333333  # 6 significant digits
    assert line["records"][0]["rollout/flips"] is None  # NaN kept as null: strict JSON
    assert line["anchors"] == [[1, 2, 0.123457, 0.0, 2, 1, 0.123457]]  # the prefix with continuations only


def test_methods_and_anchors_filter_what_a_study_keeps(tmp_path):
    _lm_run(tmp_path, "trace")
    _lm_run(tmp_path, "grpo", anchors=False)
    _lm_run(tmp_path, "pcl")
    lines = store.compact_study(tmp_path, methods=("trace", "pcl"), anchors=("trace",))
    assert [(line["method"], "anchors" in line) for line in lines] == [("pcl", False), ("trace", True)]


def test_writes_are_byte_for_byte_and_read_back(tmp_path):
    _lm_run(tmp_path / "study")
    lines = store.compact_study(tmp_path / "study")
    a = store.write_store(tmp_path / "a.jsonl.gz", lines).read_bytes()
    b = store.write_store(tmp_path / "b.jsonl.gz", lines).read_bytes()
    assert a == b
    back = store.read_store(tmp_path / "a.jsonl.gz")
    assert back == json.loads(json.dumps(lines))
    assert math.isnan(store.records_as_nan(back[0]["records"])[0]["rollout/flips"])


def test_a_study_without_runs_and_damaged_stores_are_one_line(tmp_path):
    with pytest.raises(store.StoreError, match="no finished run"):
        store.compact_study(tmp_path)
    bad = tmp_path / "x.jsonl.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(store.StoreError, match="not a readable results store"):
        store.read_store(bad)
    with gzip.open(bad, "wb") as gz:
        gz.write(
            b'{"store": 1, "runs": 2}\n{"kind": "lm", "method": "m", "pair": "seed1", "summary": {}, "records": []}\n'
        )
    with pytest.raises(store.StoreError, match="1 runs where its header says 2"):
        store.read_store(bad)
    with gzip.open(bad, "wb") as gz:
        gz.write(b'{"store": 1, "runs": 1}\n{"kind": "lm"}\n')
    with pytest.raises(store.StoreError, match=":2: not a run line"):
        store.read_store(bad)
    with gzip.open(bad, "wb") as gz:
        gz.write(b'{"store": 1, "runs": 1}\n' + b"[" * 100_000 + b"\n")
    with pytest.raises(store.StoreError, match="not a readable results store"):
        store.read_store(bad)


def test_a_run_line_over_the_bound_is_refused(tmp_path, monkeypatch):
    _lm_run(tmp_path / "study", steps=50)
    path = store.write_store(tmp_path / "s.jsonl.gz", store.compact_study(tmp_path / "study"))
    monkeypatch.setattr(store, "MAX_LINE_BYTES", 1000)
    with pytest.raises(store.StoreError, match="a run line over 1,000 bytes"):
        store.read_store(path)


def test_a_simulate_study_keeps_one_line_per_seed_and_method(tmp_path):
    for seed in (0, 1):
        d = tmp_path / f"seed{seed}"
        d.mkdir()
        recs = [
            {"method": m, "step": 0, "eval/accuracy_before": 0.1, "rollout/rollouts": 256} for m in ("grpo", "trace")
        ]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = store.compact_study(tmp_path)
    assert [(line["kind"], line["pair"], line["method"]) for line in lines] == [
        ("testbed", "seed0", "grpo"),
        ("testbed", "seed0", "trace"),
        ("testbed", "seed1", "grpo"),
        ("testbed", "seed1", "trace"),
    ]
