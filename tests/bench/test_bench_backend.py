"""bench/bench_backend.py runs against the current backend and engine at its --quick size (the tiny random model,
the fallback where a tiny warm start is not built: tiny@5, which the package does not ship), and its figures hold
what the backend promises whatever the timings: exact token counts, the prefix encoded once for k continuations
and not at all from a warm prefix cache, and a step that spends its budget. No timing is asserted."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_backend.py"
_spec = importlib.util.spec_from_file_location("bench_backend", SCRIPT)
bench_backend = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(bench_backend)  # runs nothing: main() is behind __name__ == "__main__"


def test_quick_run_on_the_fallback_policy(capsys):
    out = bench_backend.main(["--quick", "--model", "tiny@5"])
    text = capsys.readouterr().out
    sizes = bench_backend.QUICK
    assert out["model"] == "random-tiny" and "using random-tiny" in text.splitlines()[0]  # tiny@5 is not built here
    assert [r["tokens"] for r in out["throughput"]] == [b * sizes.new_tokens for b in sizes.batches]
    k = sizes.continuations
    for r, length in zip(out["kv"], sizes.prefixes, strict=True):
        assert (r["computed"], r["recomputed"], r["naive_computed"]) == (length, 0, k * length)
    step = out["step"]
    assert step.rollouts + step.unspent_prefix_budget == sizes.plan.total
    assert step.generated_tokens > 0 and step.predictor_loss is not None
    assert 0 <= step.overhead <= step.time["total"]
    for what in ("tokens/s", "prefix tokens recomputed", "engine overhead"):
        assert what in text


def test_a_model_that_cannot_load_is_one_line_and_no_fallback(capsys):
    with pytest.raises(SystemExit) as stop:
        bench_backend.main(["--quick", "--model", "/no/such/model"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "model: '/no/such/model'" in err
