"""The install scripts, run for real with a stand-in python that logs instead of installing.

Each script sources scripts/lib_env.sh for its start (repository root, venv, pip, TORCH_SPEC); this checks,
without building anything, that every script still finds it from another working directory, creates its
venv where VENV says, and runs each pip command from the repository root (`-e .` needs it). What pip would
do with the requirements is not checked here (building the real environments takes minutes and the network).
"""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_PYTHON = """#!/bin/sh
echo "$0 $* @ $(pwd)" >> "$LOG"
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="the install scripts are bash")


def _run(script: str, tmp_path: Path, **env: str) -> list[str]:
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "bin").mkdir(exist_ok=True)
    bwrap = tmp_path / "bin" / "bwrap"  # present, so install.sh does not reach for apt-get
    bwrap.write_text("#!/bin/sh\n")
    bwrap.chmod(0o755)
    log = tmp_path / "log.txt"
    log.unlink(missing_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("TORCH_SPEC", "VENV", "CORE_ONLY", "MODELS")}
    full = {
        **base,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "PYTHON": str(fake),
        "VENV": str(tmp_path / "venv"),
        "LOG": str(log),
        **env,
    }
    subprocess.run(["bash", str(ROOT / "scripts" / script)], cwd=tmp_path, env=full, check=True, timeout=60)
    return log.read_text().splitlines()


@pytest.mark.parametrize("script", ["install.sh", "install_verl_env.sh", "install_vllm_env.sh"])
def test_each_script_builds_its_venv_from_the_repository_root(script, tmp_path):
    lines = _run(script, tmp_path)
    venv_python = str(tmp_path / "venv" / "bin" / "python")
    assert lines[0] == f"{tmp_path / 'python3'} -m venv {tmp_path / 'venv'} @ {ROOT}"
    assert all(line.startswith(venv_python) and line.endswith(f"@ {ROOT}") for line in lines[1:]), lines
    assert "--upgrade pip" in lines[1]
    assert any(line.split(" @ ")[0].endswith("install -q --disable-pip-version-check torch==2.13.0") for line in lines)
    assert any(" -e ." in line for line in lines), "the project itself is installed, editable"


def test_an_existing_venv_is_reused_and_torch_spec_is_honoured(tmp_path):
    _run("install.sh", tmp_path)
    lines = _run("install.sh", tmp_path, TORCH_SPEC="torch==2.13.0+cu128")
    assert not any("-m venv" in line for line in lines)
    assert any("torch==2.13.0+cu128 @" in line for line in lines)


def test_core_only_installs_the_project_without_torch(tmp_path):
    lines = _run("install.sh", tmp_path, CORE_ONLY="1")
    assert not any("torch" in line for line in lines)
    assert lines[-1].split(" @ ")[0].endswith("install -q --disable-pip-version-check -e .[dev]")
