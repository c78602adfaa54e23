"""The package layout: packages depend downward only, the core imports numpy alone, and the stdlib-only
sandbox tests run where math-verify is missing."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "trace_rl"
CORE = {"tree", "allocation", "advantages", "metrics", "methods", "knapsack", "seeding"}
# lower ranks first: a module imports only from lower ranks or from its own package
RANK = {
    "plots": 1,
    "lm": 1,
    "backends": 2,
    "predictors": 3,
    "envs": 3,
    "agent": 4,
    "rollout": 5,
    "stack": 6,
    "testbed": 7,
    "train": 7,
    "integrations": 8,
    "viewer": 8,
    "config": 8,
    "diagnose": 9,
    "cli": 10,
}


def _unit(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    return rel.parts[0]


def _imports(path: Path) -> list[tuple[str, int]]:
    """(first-level trace_rl unit, line) of every import in the file, top level or inside functions."""
    out = []
    here = path.relative_to(SRC).parent.parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[: len(here) - node.level + 1]) if node.level > 1 else list(here)
                parts = base + (node.module.split(".") if node.module else [])
                if not parts:  # `from . import x` at the top level
                    parts = [alias.name for alias in node.names][:1]
                out.append((parts[0], node.lineno))
            elif node.module and node.module.startswith("trace_rl."):
                out.append((node.module.split(".")[1], node.lineno))
    return out


def _rank(unit: str) -> int:
    return 0 if unit in CORE else RANK.get(unit, 99)


def test_packages_depend_downward_only():
    bad = []
    for path in SRC.rglob("*.py"):
        unit = _unit(path)
        if unit == "__init__":
            continue
        for target, line in _imports(path):
            if target == unit or (target in CORE and unit in CORE):
                continue
            if not _rank(target) < _rank(unit):
                bad.append(f"{path.relative_to(SRC)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_the_core_imports_numpy_and_the_standard_library_only():
    allowed = set(sys.stdlib_module_names) | {"numpy", "trace_rl"}
    for name in CORE:
        tree = ast.parse((SRC / f"{name}.py").read_text())
        for node in ast.walk(tree):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            )
            for mod in mods:
                assert mod.split(".")[0] in allowed, f"{name}.py imports {mod}"


def test_sandbox_tests_run_without_math_verify(tmp_path):
    pytest.importorskip("math_verify")  # the stand-in below only means something where the real one exists
    (tmp_path / "math_verify.py").write_text("raise ImportError('math-verify is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC.parent)])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-o",
            "addopts=",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
            str(SRC.parents[1] / "tests" / "envs" / "test_sandbox.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "skipped" not in proc.stdout and " passed" in proc.stdout
