"""bench/gpu_check.sh's refusals, one line each, exit 2, before any work: no nvidia-smi; and, on a machine whose
(fake) nvidia-smi reports a GPU, a CPU-only torch, from the interpreter the user chose (PYTHON, else python3 on
PATH), never a virtual environment of the repository's (a CPU-only .venv-vllm once ran there and died later)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
BENCH = Path(__file__).resolve().parents[2] / "bench"
pytestmark = [
    pytest.mark.skipif(os.name != "posix", reason="a bash script"),
    pytest.mark.skipif(torch.version.cuda is not None, reason="needs the CPU-only torch this refusal is about"),
]
GPU = 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"'  # what nvidia-smi -L prints on such a machine


def _tree(tmp_path: Path) -> Path:
    """A copy of the check in a checkout whose .venv-vllm holds a python that must never be run."""
    root = tmp_path / "repo"
    (root / "bench").mkdir(parents=True)
    for name in ("gpu_check.sh", "gpu_check.py"):
        shutil.copy(BENCH / name, root / "bench" / name)
    wrong = root / ".venv-vllm" / "bin" / "python"
    wrong.parent.mkdir(parents=True)
    wrong.write_text("#!/bin/sh\necho 'the repository venv ran' >&2\nexit 3\n")
    wrong.chmod(0o755)
    return root


def _run(root: Path, tools: dict[str, str], **env) -> subprocess.CompletedProcess:
    """The script with PATH holding only `tools` (name -> shell body) and the utilities it calls."""
    bin_dir = root.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("bash", "env", "dirname", "timeout", "sh"):
        if shutil.which(name) and not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(shutil.which(name))
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    full = {"PATH": str(bin_dir), "HOME": str(root.parent), **env}
    script = root / "bench" / "gpu_check.sh"
    return subprocess.run([shutil.which("bash"), str(script)], env=full, capture_output=True, text=True, timeout=120)


def test_no_gpu_is_one_line(tmp_path):
    r = _run(_tree(tmp_path), {})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("gpu_check: no nvidia-smi on PATH: this needs a CUDA GPU")


def test_a_cpu_only_torch_on_a_gpu_machine_is_one_line_from_the_chosen_python(tmp_path):
    root = _tree(tmp_path)
    python3 = f'exec {sys.executable} "$@"'  # the environment on PATH: this test's own, whose torch is CPU-only
    r = _run(root, {"nvidia-smi": GPU, "python3": python3})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a CPU-only build (torch.version.cuda is None)" in lines[0], r.stderr
    assert "repository venv" not in r.stderr and r.stdout == ""
    chosen = _run(root, {"nvidia-smi": GPU}, PYTHON=sys.executable)  # PYTHON wins, with no python3 on PATH
    assert chosen.returncode == 2 and "CPU-only build" in chosen.stderr and chosen.stderr.count("\n") == 1
