"""`trace-rl report`: every published table and figure, regenerated from the compact results store.

Three uses:

- `trace-rl report` prints every table of `results.published.TABLES` and says which stored runs are missing (and
  the command that makes them) for the ones it cannot print;
- `trace-rl report update=true` also rewrites each document's blocks (`<!-- report:NAME -->` ... `<!-- /report -->`
  in README.md and results/README.md) and draws the figures into `figures` (the README's);
- `trace-rl report keep=runs/lm_default` stores a finished study compactly (`results.store`) under the name of its
  folder (or `as=NAME`), keeping the methods and the chosen prefixes the published tables read of it.

Limits: the documents and the store are found from the working directory (the repository root), so a pip-installed
package has the tables' definitions but not the stored runs: it reports them missing.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

BLOCK = re.compile(r"(<!-- report:(\w+) -->\n)(.*?)(<!-- /report -->)", re.S)
DOCUMENTS = ("README.md", "results/README.md")


@dataclass
class ReportConfig:
    """`trace-rl report`: the published tables and figures from the stored runs; `keep=DIR` stores a study."""

    store: str = "results"  # the folder of stored studies (<study>.jsonl.gz)
    tables: str = ""  # only these tables, comma-separated (default: all)
    update: bool = False  # rewrite the documents' report blocks and draw the figures
    figures: str = "docs/img"  # where update=true draws the figures
    keep: str = ""  # a finished compare or simulate output directory to store compactly
    name: str = ""  # the stored study's name with keep= (default: the directory's name)


def blocks(text: str) -> dict[str, str]:
    """{table name: the block's content} of a document."""
    return {m.group(2): m.group(3).rstrip("\n") for m in BLOCK.finditer(text)}


def fill(text: str, rendered: dict[str, str]) -> str:
    """The document with each block of a rendered table replaced by its rendering (others left as they are)."""

    def sub(m: re.Match) -> str:
        name = m.group(2)
        return m.group(1) + rendered[name] + "\n" + m.group(4) if name in rendered else m.group(0)

    return BLOCK.sub(sub, text)


def render(store, names: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """({table: markdown}, {table: why it is missing}) for the named tables; `store` is the folder or its
    `Stores` (each study read once for the tables and figures of one call)."""
    from ..results.published import TABLES, MissingRuns, Stores

    stores = store if isinstance(store, Stores) else Stores(store)
    done, missing = {}, {}
    for name in names:
        try:
            done[name] = TABLES[name](stores)
        except MissingRuns as err:
            missing[name] = str(err)
    return done, missing


def _keep(cfg: ReportConfig) -> dict:
    from ..results.published import STUDIES
    from ..results.store import StoreError, compact_study, write_store

    where = Path(cfg.keep)
    name = cfg.name or where.name
    study = STUDIES.get(name)
    try:
        lines = compact_study(where, study.methods if study else None, study.anchors if study else None)
    except (StoreError, OSError, KeyError, ValueError) as err:
        raise ConfigError(f"keep: {cfg.keep} is not a finished study ({err})") from None
    path = write_store(Path(cfg.store) / f"{name}.jsonl.gz", lines)
    print(f"stored {len(lines)} runs of {where} as {path} ({path.stat().st_size / 1024:,.0f} KiB)")
    return {"stored": str(path), "runs": len(lines)}


def run(cfg: ReportConfig, yaml_text: str = "") -> dict:
    from ..results.published import TABLES

    if cfg.keep:
        return _keep(cfg)
    names = [n.strip() for n in cfg.tables.split(",") if n.strip()] or list(TABLES)
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        raise ConfigError(f"tables: unknown {', '.join(unknown)}; choose from {', '.join(TABLES)}")
    from ..results.published import Stores

    stores = Stores(Path(cfg.store))
    done, missing = render(stores, names)
    for name, table in done.items():
        print(f"## {name}\n\n{table}\n")
    for name, why in missing.items():
        print(f"missing: {name}: {why}", file=sys.stderr)
    if cfg.update:
        for doc in map(Path, DOCUMENTS):
            if doc.is_file():
                text = doc.read_text()
                new = fill(text, done)
                if new != text:
                    doc.write_text(new)
                    print(f"updated {doc}")
        _figures(stores, Path(cfg.figures))
    return {"tables": list(done), "missing": missing}


def _figures(stores, folder: Path) -> None:
    from ..results.figures import FIGURES, MissingRuns

    for name, draw in FIGURES.items():
        try:
            print(f"wrote {draw(stores, folder)}")
        except MissingRuns as err:
            print(f"missing: figure {name}: {err}", file=sys.stderr)
        except ImportError:
            print(f"figure {name} skipped: matplotlib is not installed (pip install 'trace-rl[plots]')")
