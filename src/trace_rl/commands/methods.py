"""`trace-rl methods`: every method with its status, what it changes and when to use it, stable ones first; the
README's method table is rendered from the same entries (`methods_markdown`), and a test checks that they agree.

The entries are the registry's (`trace_config.METHODS`): the built-ins and any method registered in this process;
a method of one's own given as module:attr is not listed (it is not known until named)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from ..trace_config import METHODS, STATUSES, Method

# the README's sentence above the table (its links are the README's, relative to the repository's root)
README_LEAD = (
    "At equal cost in rollouts; `trace-rl methods` lists each method (this table is rendered from it), the baselines "
    "as their authors' code computes them ([docs/baselines.md](docs/baselines.md)), settings in "
    "[docs/usage.md](docs/usage.md#methods); `method=module:attr` runs one of one's own."
)
# the README's one row for every experimental method (it has at most 180 lines; `trace-rl methods` lists each)
EXPERIMENTAL_ROW = ("research variants of TRACE (`trace-rl methods` says what each changes)", "to study them")


@dataclass
class MethodsConfig:
    """`trace-rl methods`: every method with its status, what it changes and when to use it."""

    markdown: bool = False  # print the README's Markdown table instead of the text listing


def listed_methods() -> list[Method]:
    """Every registered method, stable ones first (each status in registry order)."""
    entries = [METHODS[name] for name in METHODS]
    return [m for status in STATUSES for m in entries if m.status == status]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def readme_rows() -> list[tuple[str, str, str, str]]:
    """(methods, status, what they change, when to use them) of the README's table: the stable methods that share
    when to use them (the ablations, the baselines) in one row, their changes joined; every experimental method in
    one row."""
    groups: dict[tuple[str, str], list[Method]] = {}
    for m in listed_methods():
        key = ("experimental", "") if m.status == "experimental" else (m.status, m.use)
        groups.setdefault(key, []).append(m)
    rows = []
    for (status, use), members in groups.items():
        names = ", ".join(f"`{m.name}`" for m in members)
        if status == "experimental":
            rows.append((names, status, *EXPERIMENTAL_ROW))
        else:
            changes = "; ".join(f"{m.name}: {m.changes}" if len(members) > 1 else m.changes for m in members)
            rows.append((names, status, changes, use))
    return rows


def methods_markdown() -> str:
    """The README's block between its `methods:begin` and `methods:end` markers: the sentence and the table."""
    lines = [*textwrap.wrap(README_LEAD, 118, break_on_hyphens=False), ""]
    lines += ["| methods | status | what it changes | when to use it |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in readme_rows()]
    return "\n".join(lines) + "\n"


def methods_text() -> str:
    """The listing `trace-rl methods` prints: one block per method, stable first."""
    out = []
    for status in STATUSES:
        group = [m for m in listed_methods() if m.status == status]
        if group:
            out.append(f"{status}:")
            for m in group:
                out.append(f"  {m.name:<22} {m.changes}")
                out.append(f"  {'':<22} use: {m.use}")
    return "\n".join(out) + "\n"


def run(cfg: MethodsConfig, yaml_text: str = "") -> dict:
    """Print the listing (or the Markdown table); returns {'methods': names, stable first}."""
    print(methods_markdown() if cfg.markdown else methods_text(), end="")
    return {"methods": [m.name for m in listed_methods()]}
