"""`trace-rl eval policy.backend=vllm` at the default evaluation's size (640 tasks x 2 samples) in the REAL vLLM
engine (vLLM's CPU build; skipped where vLLM does not import; runs in .venv-vllm).

The size that killed the engine on CPU (`CPU Generator does not use offset`: seeded requests split by chunked
prefill, from 128 tasks up) with the backend's defaults, on the tiny random Llama with short generations (the
request count and the seeds are what mattered, not the length); and the run ends without vLLM's teardown
traceback (the backend cancels the engine's output handler before shutdown)."""

import json

import pytest

pytest.importorskip("vllm")

from trace_rl.cli import main  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402


def test_eval_at_the_default_size_completes_with_every_sample(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # the backend's own CPU default
    model, tok = create_tiny_model(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "eval"
    args = [
        f"policy.model={tmp_path / 'tiny'}",
        "policy.backend=vllm",
        "policy.max_new_tokens=8",
        "limit=640",
        "eval_samples=2",
        f"out={out}",
    ]
    assert main(["eval", *args]) == 0
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 1280 and {(r["index"], r["sample"]) for r in rows} == {
        (i, j) for i in range(640) for j in (0, 1)
    }
    err = capfd.readouterr().err
    assert "EngineDeadError" not in err and "Task was destroyed" not in err
