"""`trace-rl fetch-data`: the pinned math and QA data sets, SHA-256 checked; the logic lives beside the loaders
that read them (`envs.data_fetch`), this is the command's entry with the runners' signature."""

from __future__ import annotations

from ..envs.data_fetch import FetchDataConfig, run_fetch

__all__ = ["FetchDataConfig", "run"]


def run(cfg: FetchDataConfig, yaml_text: str = "") -> dict:
    """Fetch what is missing; returns {'fetched': the files written this time}."""
    return {"fetched": [str(p) for p in run_fetch(cfg)]}
