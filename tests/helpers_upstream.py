"""Upstream's code for the tests that run a port beside it (bench/upstream_code.py loads it from the file an
environment variable names), and the recorded upstream outputs that let the same comparison run without it.

`upstream_or_skip(var)` skips the test with the line that says what to set when `var` is unset, and fails it in one
line when `var` names a file that is missing or the wrong one (a developer who set it wants the comparison).
`load_fixture` / `write_fixture` read and write the JSON tables of upstream outputs next to the tests."""

import hashlib
import importlib.util
import json
import os
import sys
from datetime import date
from pathlib import Path
from types import ModuleType

import pytest

_spec = importlib.util.spec_from_file_location(
    "upstream_code", Path(__file__).resolve().parents[1] / "bench" / "upstream_code.py"
)
upstream_code = importlib.util.module_from_spec(_spec)
sys.modules["upstream_code"] = upstream_code  # its dataclass looks its module up there
_spec.loader.exec_module(upstream_code)


def upstream_or_skip(var: str, provide: dict[str, ModuleType] | None = None) -> ModuleType:
    try:
        module, error = upstream_code.load(var, provide), None
    except ValueError as exc:
        module, error = None, str(exc)
    if error:  # outside the except block, so the report is the one line alone
        pytest.fail(error, pytrace=False)
    if module is None:
        pytest.skip(upstream_code.unset_line(var))
    return module


def load_fixture(path: Path) -> dict:
    return json.loads(path.read_text())


def provenance(var: str | tuple[str, ...], script: str, versions: str, what: str) -> dict:
    """Where a table of upstream outputs came from: the upstream file `var` names (or each of several), its
    sha256, when and by which test script it was made, the library versions and the calls it records."""
    names = (var,) if isinstance(var, str) else var
    refs, paths = [upstream_code.REFERENCES[v] for v in names], [Path(os.environ[v]) for v in names]
    return {
        "upstream": "; ".join(f"{ref.repo} @ {ref.commit}, {ref.path}" for ref in refs),
        "run_from": "; ".join(f"{p.name}, sha256 {hashlib.sha256(p.read_bytes()).hexdigest()}" for p in paths),
        "made": f"{date.today().isoformat()} by `python {script}`",
        "versions": f"{versions}, python {sys.version.split()[0]}",
        "what": what,
    }


def write_fixture(path: Path, provenance: dict, tables: dict[str, list[dict]]) -> None:
    """One case a line, so a regenerated table diffs case by case."""
    lines = ["{", f'  "provenance": {json.dumps(provenance)},']
    for t, (name, rows) in enumerate(tables.items()):
        lines.append(f'  "{name}": [')
        lines += [f"    {json.dumps(row)}" + ("," if i < len(rows) - 1 else "") for i, row in enumerate(rows)]
        lines.append("  ]" + ("," if t < len(tables) - 1 else ""))
    path.write_text("\n".join(lines + ["}"]) + "\n")
    assert load_fixture(path)["provenance"] == provenance  # the hand-joined lines are valid JSON
