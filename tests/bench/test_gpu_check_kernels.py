"""bench/gpu_check_kernels.py on CPU (the kernel under test is `blocks` there; flex on CUDA): every check passes on
the code as it is, and a kernel that ignores the tree mask fails its check."""

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

_spec = importlib.util.spec_from_file_location(
    "gpu_check_kernels", Path(__file__).resolve().parents[2] / "bench" / "gpu_check_kernels.py"
)
kernels = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check_kernels"] = kernels
_spec.loader.exec_module(kernels)


def test_every_kernel_check_passes_on_cpu_with_its_tolerance():
    rows = kernels.all_checks("cpu")
    assert [r["check"] for r in rows if not r["passed"]] == []
    assert len(rows) == 8 and all(r["tolerance"] for r in rows)
    kv = [r for r in rows if r["check"].startswith("HF backend")]
    assert all(r["prefix_tokens_computed"] < r["prompt_tokens"] for r in kv)  # the KV cache was branched, not redone


def test_a_kernel_that_ignores_the_tree_mask_fails(monkeypatch):
    from trace_rl.train import tree_attention

    def causal(query, key, value, tree, scaling):  # siblings see each other: what the tree mask exists to stop
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
        return out.transpose(1, 2)

    monkeypatch.setattr(tree_attention, "_blocks_attention", causal)
    rows = kernels.kernel_vs_dense("cpu")
    assert not any(r["passed"] for r in rows), rows
