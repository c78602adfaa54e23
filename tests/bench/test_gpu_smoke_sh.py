"""bench/gpu_smoke.sh's refusals on a machine without what it needs: one line each, exit 2, before any work."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_smoke.sh"


def _run(tmp_path: Path, tools: dict[str, str], **env) -> subprocess.CompletedProcess:
    """The script with PATH holding only `tools` (name -> shell body) and the basic utilities it calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "env", "dirname", "timeout"):
        found = shutil.which(name)
        if found:
            (bin_dir / name).symlink_to(found)
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    full = {"PATH": str(bin_dir), "HOME": str(tmp_path), **env}
    return subprocess.run(
        [shutil.which("bash"), str(SCRIPT), "--model", "m"], env=full, capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(os.name != "posix", reason="a bash script")
def test_no_gpu_is_one_line(tmp_path):
    r = _run(tmp_path, {})
    assert r.returncode == 2 and r.stderr.strip().splitlines() == ["gpu_smoke: no nvidia-smi: this needs a CUDA GPU"]


@pytest.mark.skipif(os.name != "posix", reason="a bash script")
def test_an_interpreter_without_vllm_or_pytest_is_named(tmp_path):
    # PYTHON chooses the interpreter; a fake one that fails the named import
    fake = "for a; do case $a in *'import vllm'*) exit ${NO_VLLM:-0};; *'import pytest'*) exit 1;; esac; done"
    r = _run(tmp_path, {"nvidia-smi": "exit 0", "mypy3": fake}, PYTHON="mypy3", NO_VLLM="1")
    assert r.returncode == 2 and "vllm is not installed in mypy3" in r.stderr
    second = tmp_path / "second"
    second.mkdir()
    r = _run(second, {"nvidia-smi": "exit 0", "mypy3": fake}, PYTHON="mypy3")
    assert r.returncode == 2 and "pytest is not installed in mypy3" in r.stderr
