"""bench/bench_bfcl_step.py runs against the current BFCL environment and bounded runner (it once imported a helper
that a refactor removed, and failed on its first measurement): three measurements, each with the bounded-run
figures. No timing is asserted."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("bfcl_eval")
pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_bfcl_step.py"
_spec = importlib.util.spec_from_file_location("bench_bfcl_step", SCRIPT)
bench_bfcl_step = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_bfcl_step)  # runs nothing: main() is behind __name__ == "__main__"


def test_smallest_run(capsys):
    bench_bfcl_step.main(n=2, mib=1)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert all("ms per one-call step" in line and "an empty bounded run" in line for line in lines)
