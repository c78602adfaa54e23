"""`trace-rl view TREES.jsonl ...`: one self-contained HTML page of rollout trees (`viewer`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError


@dataclass
class ViewConfig:
    """`trace-rl view TREES.jsonl ...`: one self-contained HTML page that shows each prompt's tree."""

    trees: list[str] = field(default_factory=list)  # trees files (trees_<method>.jsonl, sft_eval_trees.jsonl)
    out: str = "tree.html"  # the HTML file to write
    title: str = "TRACE rollout trees"  # the page's title

    def __post_init__(self):
        if not self.trees:
            raise ValueError("trees: give one or more trees files, e.g. trace-rl view runs/simulate/trees_trace.jsonl")
        missing = [t for t in self.trees if not Path(t).is_file()]
        if missing:
            raise ValueError(f"trees: no file {missing[0]}")
        if not self.out:
            raise ValueError("out: give the HTML file to write")


def run(cfg: ViewConfig, yaml_text: str = "") -> dict:
    """Read the trees files and write the page; returns {'out': the page, 'trees': how many it shows}."""
    from ..viewer import load_entries, write_tree_html

    try:
        entries = load_entries(list(cfg.trees))
    except (ValueError, FileNotFoundError) as err:  # load_entries' own messages name the file and line
        raise ConfigError(f"trees: {err}") from None
    if not entries:
        raise ConfigError(f"trees: {', '.join(cfg.trees)} hold no trees (written by simulate, rollout, train or sft)")
    path = write_tree_html(entries, cfg.out, title=cfg.title)
    print(f"wrote {path} (one self-contained file: open it in a browser)")
    return {"out": str(path), "trees": len(entries)}
