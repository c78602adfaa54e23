"""`trace-rl diagnose RUN_DIR`: the predictor's quality by depth from a run's records (`trace_rl.diagnose`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..config import check_count
from ..errors import ConfigError

MAX_DEPTH = 1_000


@dataclass
class DiagnoseConfig:
    """`trace-rl diagnose RUN_DIR`: predictor quality by depth (Spearman, calibration, Brier) for a run."""

    run_dir: str = ""  # the run directory to read (predictions.jsonl, metrics.jsonl)
    max_depth: int = 4  # depths beyond this are pooled
    out: str = ""  # where the plots go (default: the run directory)

    def __post_init__(self):
        if not self.run_dir:
            raise ValueError("run_dir: give the run directory, e.g. trace-rl diagnose runs/simulate")
        # the tables and plots loop over depths: a million took minutes; a trajectory of 1,000 turns is none we know
        check_count("max_depth", self.max_depth, MAX_DEPTH, why="deeper prefixes are pooled in the last row")


def run(cfg: DiagnoseConfig, yaml_text: str = "") -> dict:
    """Print the tables by depth and the calibration, write the plots; returns {'plots': the files written}."""
    from ..diagnose import diagnose, format_calibration, format_diagnosis

    out = cfg.out or cfg.run_dir
    try:
        found = diagnose(cfg.run_dir, max_depth=cfg.max_depth, out_dir=out)
    except FileNotFoundError as err:
        raise ConfigError(f"run_dir: {err}") from None
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"run_dir: {cfg.run_dir} does not hold a readable run ({err})") from None
    print(format_diagnosis(found.tables))
    print()
    print(format_calibration(found))
    if found.plots:
        print(f"\nwrote {', '.join(str(p) for p in found.plots)}")
    else:
        print(f"\n{found.note}", file=sys.stderr)
    return {"plots": [str(p) for p in found.plots]}
