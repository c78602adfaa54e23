"""The package layout: packages depend downward only, no import cycles, no private names imported across modules,
the core imports numpy alone, and the stdlib-only sandbox tests run where math-verify is missing.

The rank table below is the one statement of the layers: docs/design.md's "Layers" table is written from it
(`python tests/test_layout.py` rewrites it) and a test checks that the page still matches."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "trace_rl"
DESIGN = ROOT / "docs" / "design.md"
CORE = {
    "tree",
    "paths",
    "allocation",
    "advantages",
    "metrics",
    "methods",
    "method_table",
    "knapsack",
    "vip",
    "seeding",
    "stats",
    "trace_config",
    "registry",
    "strict_json",
    "errors",
    "safe_read",
    "setting_bounds",
}
# lower ranks first: a module imports only from lower ranks or from its own package
RANK = {
    "plots": 1,
    "experimental": 1,
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
    "results": 9,
    "commands": 10,
    "cli": 11,
}
# what each unit holds, for the docs' table (a unit missing here fails test_every_unit_is_ranked_and_described)
HOLDS = {
    "core": "rollout trees and their paths to training rows, exact allocators, Knapsack RL's and VIP's allocators, "
    "the registries of strategies, estimators, predictors and methods (`module:attr` of one's own), "
    "methods and TRACE's one configuration (method, advantage, budget, predictor kind and prefix share, weighting), "
    "advantage estimators, step metrics, paired statistics over seeds, named random streams, "
    "strict JSON for every file a run writes, the user-error types the command line shows as one line, reading "
    "files a user names or a damaged disk may have replaced (regular files only, every line and file bounded, "
    "strict JSON), the bounds every setting is held to (lengths, list sizes, counts, finite numbers, seeds); "
    "numpy only",
    "plots": "PNG plots of metrics (matplotlib)",
    "experimental": "the experimental methods and their strategies (research variants: `trace_cost`, `trace_mix`, the "
    "`active_*` root objectives, ...), named by the core's registries and imported only when chosen; the root "
    "objectives; the calibration layers of the success predictor (flip, root) on their aged logistic layer",
    "lm": "tokenizers and offline models (tiny CPU default, SmolLM2-135M, MiniLM); the warm-start cache; "
    "the KV-cache keyword",
    "backends": "token-in/token-out protocol; scripted, Hugging Face, vLLM, OpenAI-compatible server",
    "predictors": "V~: protocol and training examples, reward history, logistic, text features, LM critic, VIP's "
    "Gaussian process and its prompt embeddings, diagnostics, calibration",
    "envs": "env protocol and ReAct action format; the plug-in registry (`EnvPlugin`: name, settings, spec builder; "
    "built-ins, entry points, `module:attr`); calculator and its task presets, math + sandbox, QA + retrieval "
    "server, BFCL; task loaders",
    "agent": "ReAct turns over token histories",
    "rollout": "the one TRACE step and the one episode loop (`engine`, `grow`: generic over an Actor; the "
    "engine's flat evaluation), the one run loop of every command (`run_loop`: pool, step, the `Learner`'s "
    "update, evaluation, records), the Ray executor, the LM actor, the metrics schema, the one report of methods x "
    "seeds at equal cost (curves, intervals, tables, on `stats`), pass@k evaluation",
    "stack": "the settings groups every LM command shares (policy, predictor, engine; env: `env.name` and the "
    "chosen plug-in's own group `env.<name>.*`; torch-free) and the one builder of the LM stack "
    "(`build_stack`): env spec, model and reference model, policy backend (hf, vllm or server), predictor, "
    "actor, engine",
    "testbed": "synthetic env with exact V, tabular policy with its Actor and its learner, oracle, `simulate`, "
    "propositions",
    "train": "the policy update (losses, tree packing, the learning-rate schedule) and the LM learner, the trainer, "
    "checkpoints, loggers, `sft`, `compare`'s training runs (the shared start evaluation, run settings, the table)",
    "integrations": "rows for verl and TRL; the verl plugin, the TRL rollout_func",
    "viewer": "HTML tree view",
    "config": "typed configs from YAML and key=value overrides; choice groups (env) typed by the choice made, and "
    "a command's class by a choice at its top (compare's `command`)",
    "diagnose": "`diagnose`: the predictor's calibration from a run",
    "results": "the compact results store (what the published tables read of a study's runs) and the published "
    "tables and figures `report` regenerates from it",
    "commands": "one module per command: its config (or the one its layer builds) and `run(cfg, yaml_text) -> "
    "summary`; `rollout` (the LM stack without the update), `eval`, `train`'s report and plots, `simulate`'s "
    "summary over seeds, `compare` (seeds x methods over `train` or `rollout`, each run through its runner)",
    "cli": "the `trace-rl` command: the public command table (config and runner of each, imported on use) and "
    "the dispatcher",
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


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in SRC.rglob("*.py")}


def _module_imports(module: str, source: str, package: bool = False) -> list[tuple[str, str | None]]:
    """(imported trace_rl module, imported name or None) of every import in `module`'s source, functions
    included; a name that is a submodule counts as that module."""
    me = module.split(".")
    here = me if package else me[:-1]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] == "trace_rl"]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join(base + (node.module.split(".") if node.module else []))
            if target.split(".")[0] != "trace_rl":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub, None) if sub in MODULES else (target, alias.name))
    return out


def _violations() -> set[str]:
    found, graph = set(), {}
    for mod, path in MODULES.items():
        graph[mod] = set()
        for target, name in _module_imports(mod, path.read_text(), path.name == "__init__.py"):
            if target != mod:
                graph[mod].add(target)
            if name and name.startswith("_") and not name.startswith("__") and target != mod:
                found.add(f"private: {mod} imports {name} from {target}")
    for cycle in _cycles(graph):
        found.add("cycle: " + " -> ".join(cycle + cycle[:1]))
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module, as the modules of a cycle through
    its smallest name (Tarjan's algorithm, then a breadth-first path back)."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(set(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for comp in comps:
        start = min(comp)
        prev, frontier = {start: None}, [start]
        while frontier and start not in [w for v in frontier for w in graph[v]]:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & comp):
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        path = [last]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        out.append(path[::-1])
    return out


def test_no_import_cycles_and_no_private_names_across_modules():
    found = sorted(_violations())
    assert not found, "violations:\n" + "\n".join(found)


def test_the_checks_see_a_cycle_and_a_private_import():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    src = "from ..allocation import _seed, plan\nfrom . import engine\nimport trace_rl.tree\n"
    assert _module_imports("trace_rl.rollout.x", src) == [
        ("trace_rl.allocation", "_seed"),
        ("trace_rl.allocation", "plan"),
        ("trace_rl.rollout.engine", None),
        ("trace_rl.tree", None),
    ]


def layer_table() -> str:
    """docs/design.md's "Layers" table, from RANK, CORE and HOLDS."""
    units = sorted(RANK, key=lambda u: (RANK[u], u))
    lines = ["| rank | units | holds |", "|---|---|---|"]
    core = ", ".join(f"`{m}`" for m in sorted(CORE))
    lines.append(f"| 0 | core: {core} (top level of `trace_rl`) | {HOLDS['core']} |")
    for rank in sorted(set(RANK.values())):
        for u in [u for u in units if RANK[u] == rank]:
            name = f"`{u}/`" if (SRC / u).is_dir() else f"`{u}.py`"
            lines.append(f"| {rank} | {name} | {HOLDS[u]} |")
    return "\n".join(lines) + "\n"


BEGIN = "<!-- layer table: written by `python tests/test_layout.py` from its rank table; do not edit by hand -->\n"
END = "<!-- end of layer table -->\n"


def _design_with(table: str) -> str:
    text = DESIGN.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + table + END + tail


def test_every_unit_is_ranked_and_described():
    units = {_unit(p) for p in SRC.rglob("*.py")} - {"__init__"}
    assert units - CORE == set(RANK), "rank every top-level module and package of trace_rl in RANK"
    assert set(HOLDS) == set(RANK) | {"core"}


def test_the_design_doc_quotes_the_rank_table():
    text = DESIGN.read_text()
    assert BEGIN in text and END in text, f"{DESIGN.name} lost its layer-table markers"
    assert text == _design_with(layer_table()), "docs/design.md's layer table is stale: run python tests/test_layout.py"


if __name__ == "__main__":  # rewrite docs/design.md's layer table from the rank table
    DESIGN.write_text(_design_with(layer_table()))
    print(f"wrote the layer table of {DESIGN}")


MAX_FUNCTION_LINES = 90  # a function longer than this is split into named helpers


def _long_functions(source: str, name: str = "<source>") -> list[str]:
    """`name:line function (n lines)` for each function or method of `source` longer than MAX_FUNCTION_LINES,
    counted from its `def` line to its last line (decorators not counted)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_every_function_in_the_package_is_at_most_90_lines():
    long = [
        f for path in sorted(SRC.rglob("*.py")) for f in _long_functions(path.read_text(), str(path.relative_to(SRC)))
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_length_check_sees_a_long_function_and_a_long_method():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    fits = f"def f():\n{body}"  # def line + 89: exactly the limit
    method = "class C:\n    def g(self):\n" + "".join(f"    {line}\n" for line in body.splitlines()) + "        y = 0\n"
    assert _long_functions(fits) == []
    assert _long_functions(f"{fits}    y = 0\n", "m.py") == ["m.py:1 f (91 lines)"]
    assert _long_functions(method) == ["<source>:2 g (91 lines)"]


MAX_FILE_LINES = 500  # a module longer than this holds more than one concept: split it, re-exporting its names


def _long_files(paths: list[Path]) -> list[str]:
    """`path (n lines)` for each file of `paths` longer than MAX_FILE_LINES."""
    counts = {path: len(path.read_text().splitlines()) for path in paths}
    return [f"{path.relative_to(SRC)} ({n} lines)" for path, n in counts.items() if n > MAX_FILE_LINES]


def test_every_file_in_the_package_is_at_most_500_lines():
    long = _long_files(sorted(SRC.rglob("*.py")))
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_the_file_length_check_sees_a_long_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    fits, long = tmp_path / "fits.py", tmp_path / "long.py"
    fits.write_text("x = 0\n" * MAX_FILE_LINES)
    long.write_text("x = 0\n" * (MAX_FILE_LINES + 1))
    assert _long_files([fits, long]) == ["long.py (501 lines)"]
