"""BFCL's installed data, as `envs.bfcl_env` reads it: the multi-turn task files (`load_bfcl`, ground truth under
'answer'), the function docs of its backend classes (`tool_docs`, `describe`) and bfcl-eval's own formatting of
decoded calls (`official_execution_list`). Needs the bfcl-eval package (`pip install --no-deps bfcl-eval mpmath`);
its files are the package's own, read as installed.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
from pathlib import Path

CATEGORIES = ("multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param")


def bfcl_root() -> Path:
    """The installed bfcl_eval package's folder; FileNotFoundError naming the install command without it."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("BFCL needs the bfcl-eval package: pip install --no-deps bfcl-eval mpmath")
    return Path(list(spec.submodule_search_locations)[0])


def _literal(value):
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def load_bfcl(category: str = "multi_turn_base", limit: int | None = None) -> list[dict]:
    """Entries with their ground truth under 'answer'; list-valued fields stored as strings are parsed."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; choose from {CATEGORIES}")
    root = bfcl_root() / "data"
    entries = [json.loads(l) for l in (root / f"BFCL_v4_{category}.json").read_text().splitlines() if l.strip()]
    truth = {}
    for line in (root / "possible_answer" / f"BFCL_v4_{category}.json").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            truth[row["id"]] = row["ground_truth"]
    out = []
    for i, e in enumerate(entries[:limit]):
        e = {k: _literal(v) for k, v in e.items()}
        e.update(index=i, answer=truth[e["id"]], data_source=f"bfcl_{category}", category=category)
        out.append(e)
    return out


def tool_docs(classes: list[str]) -> dict[str, dict]:
    """The function docs of BFCL's backend classes `classes`, by function name."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    docs = {}
    for cls in classes:
        path = bfcl_root() / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls]
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                docs[d["name"]] = d
    return docs


def describe(doc: dict) -> str:
    """One line a model reads for a function: its name, arguments (type, optional) and description's start."""
    props = doc.get("parameters", {}).get("properties", {})
    req = set(doc.get("parameters", {}).get("required", []))
    args = ", ".join(f"{k}: {v.get('type', '?')}{'' if k in req else '=optional'}" for k, v in props.items())
    desc = doc.get("description", "").split("Tool description:")[-1].strip()
    return f"{doc['name']}({args}): {desc[:160]}"


@functools.cache
def official_execution_list():
    """bfcl-eval's decoded_output_to_execution_list: how its prompting decoder (default_decode_execute_prompting)
    writes decoded calls back as the strings the runner executes and the checker scores. Its module imports
    tree_sitter and more at import time (a --no-deps install lacks them), so the two pure formatting functions
    are taken from the installed source and run as they are. The decoder's parsing half is not used here: it
    `eval`s arithmetic and lambdas in arguments, which this environment refuses (arguments are literals)."""
    path = bfcl_root() / "model_handler" / "utils.py"
    wanted = {"decoded_output_to_execution_list", "parse_nested_value"}
    nodes = [n for n in ast.parse(path.read_text()).body if getattr(n, "name", "") in wanted]
    namespace: dict = {}
    exec(compile(ast.Module(nodes, []), str(path), "exec"), namespace)  # noqa: S102 (the package's own code)
    return namespace["decoded_output_to_execution_list"]
