"""`trace-rl verl-data`: verl's parquet rows of an environment's tasks; the logic lives with the verl bridge
(`integrations.verl.data`), this is the command's entry with the runners' signature."""

from __future__ import annotations

from ..integrations.verl.data import VerlDataConfig, write_verl_data

__all__ = ["VerlDataConfig", "run"]


def run(cfg: VerlDataConfig, yaml_text: str = "") -> dict:
    """Write both files and say how many rows each holds; returns {file: rows}."""
    written = write_verl_data(cfg)
    for path, n in written.items():
        print(f"{path}: {n} rows")
    return {str(path): n for path, n in written.items()}
