"""The verl bridge's one compatibility module: the only place that imports verl, and on another verl it fails in
one line at import. The version check runs anywhere (a stand-in `verl` module); the seams' check needs verl."""

import ast
import importlib
import sys
import types
from pathlib import Path

import pytest

VERL = Path(__file__).resolve().parents[2] / "src" / "trace_rl" / "integrations" / "verl"


def _verl_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "verl"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "verl":
            out.append(node.module)
    return out


def test_only_the_compat_module_imports_verl():
    found = {p.name: _verl_imports(p) for p in sorted(VERL.glob("*.py"))}
    assert found.pop("compat.py"), "compat.py is where verl is imported"
    assert not any(found.values()), {k: v for k, v in found.items() if v}


def test_another_verl_is_refused_in_one_line_before_anything_else_of_it_is_imported(monkeypatch):
    fake = types.ModuleType("verl")
    fake.__version__ = "0.10.0"
    for name in [m for m in sys.modules if m == "verl" or m.startswith("verl.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "trace_rl.integrations.verl.compat", raising=False)
    monkeypatch.setitem(sys.modules, "verl", fake)  # a bare module: importing any verl submodule would fail
    with pytest.raises(ImportError) as err:
        importlib.import_module("trace_rl.integrations.verl.compat")
    msg = str(err.value)
    assert "written against verl 0.9.1" in msg and "found verl 0.10.0" in msg and "\n" not in msg, msg
    monkeypatch.delitem(sys.modules, "trace_rl.integrations.verl.compat", raising=False)


def test_the_private_seams_exist_in_this_verl_and_a_missing_one_is_one_line():
    pytest.importorskip("verl")
    from trace_rl.integrations.verl import compat

    compat.check_seams()
    with pytest.raises(ImportError, match=r"^trace-rl's verl plugin needs ToolAgentLoop._gone of verl 0.9.1"):
        compat.check_seams({compat.ToolAgentLoop: ("_gone",)})
