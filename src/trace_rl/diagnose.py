"""Predictor quality by depth for a finished run, as tables and two PNG plots (behind `trace-rl diagnose`).

Reads RUN_DIR/predictions.jsonl, or RUN_DIR/seed*/predictions.jsonl for a multi-seed run (one record per node
the allocator scored: method, step, depth, predicted, target), and writes into `out_dir`, which defaults to the
run directory:

- calibration_by_depth.png: mean empirical success V^ per predicted-value bin, one line per depth, one panel per
  method on a grid at most three panels wide (seeds pooled);
- spearman_over_steps.png: Spearman(V~, V^) per step, a panel for the roots and one for the prefixes, one line
  per method; several seeds draw the mean and a min-max band.

The table adds, per depth, the flip calibration of the chosen prefixes (predicted vs realised flip rate of
their continuations; `predictors.diagnostics.flip_rows`) where the records carry it (tree methods of
`trace-rl train`, `rollout` and `simulate`). A `trace-rl compare` directory is read per method:
RUN_DIR/<method>/seed*/predictions.jsonl. Both plots come from predictions.jsonl alone, so they do not depend
on how metrics.jsonl names its keys.
`format_diagnosis` prints p-values in scientific notation below 0.001 instead of rounding them to 0.000.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .plots import grid_shape, plot_panels
from .predictors.diagnostics import flip_rows, spearman_rho, summarize_records

CALIBRATION_PNG = "calibration_by_depth.png"
SPEARMAN_PNG = "spearman_over_steps.png"
MIN_PER_DEPTH = 10  # fewer predictions at a depth than this draw no calibration line
MIN_PER_BIN = 3  # a calibration point needs this many predictions in its bin


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{lineno}: not JSON") from None
    return rows


def load_run(run_dir: str | Path) -> dict[str, list[dict]]:
    """Prediction records per seed: {"": records} for a one-seed run, {"seed0": ..., "seed1": ...} otherwise."""
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory {run} does not exist")
    if (run / "predictions.jsonl").is_file():
        return {"": _read_jsonl(run / "predictions.jsonl")}
    seeds = sorted(run.glob("seed*/predictions.jsonl"))
    if not seeds:  # a compare directory: <method>/seed*/
        seeds = sorted(run.glob("*/seed*/predictions.jsonl"))
        if seeds:
            # records name the allocation only; the directory also names the advantage (trace_adv-grpo)
            return {
                f"{p.parent.parent.name}/{p.parent.name}": [
                    {**r, "method": p.parent.parent.name} for r in _read_jsonl(p)
                ]
                for p in seeds
            }
    if not seeds:
        raise FileNotFoundError(f"no predictions.jsonl in {run} (written by trace-rl simulate / rollout)")
    return {p.parent.name: _read_jsonl(p) for p in seeds}


def diagnose(run_dir: str | Path, max_depth: int = 4, out_dir: str | Path | None = None) -> dict[str, list[dict]]:
    """Per method, one row per depth (n, Spearman rho and p, ECE, Brier); writes the two plots into out_dir."""
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    seeds = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_method: dict[str, list[dict]] = {}
    for recs in seeds.values():
        for r in recs:
            by_method.setdefault(r["method"], []).append(r)
    if not by_method:
        raise ValueError(f"{run_dir}: predictions.jsonl holds no records")
    tables = {m: summarize_records(recs, max_depth=max_depth) for m, recs in by_method.items()}
    for m, rows in tables.items():
        flips = flip_rows(by_method[m], max_depth=max_depth)
        if flips:
            empty = dict.fromkeys(("chosen", "continuations", "pred_flip", "real_flip"), float("nan"))
            for row in rows:
                row.update(flips.get(row["depth"], empty))
    plot_calibration(by_method, out / CALIBRATION_PNG, max_depth)
    panels: dict[str, dict[str, list[list[dict]]]] = {"roots (depth 0)": {}, "prefixes (depth >= 1)": {}}
    for method in by_method:
        for (_label, curves), roots in zip(panels.items(), (True, False)):
            curves[method] = [
                spearman_by_step([r for r in recs if r["method"] == method and (r["depth"] == 0) == roots])
                for recs in seeds.values()
            ]
    plot_panels(
        panels, "spearman", out / SPEARMAN_PNG, "Predictor rank correlation per step", ylabel="Spearman(V~, V^)"
    )
    return tables


def spearman_by_step(records: list[dict]) -> list[dict]:
    """[{"step", "spearman"}] per step of `records`; steps where rho is undefined are left out."""
    steps: dict[int, list[dict]] = {}
    for r in records:
        steps.setdefault(int(r["step"]), []).append(r)
    out = []
    for step in sorted(steps):
        rho = spearman_rho([r["predicted"] for r in steps[step]], [r["target"] for r in steps[step]])
        if not math.isnan(rho):
            out.append({"step": step, "spearman": rho})
    return out


def plot_calibration(by_method: dict[str, list[dict]], path: Path, max_depth: int) -> Path:
    """Reliability curves per depth, one square panel per method; the last depth pools the deeper ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(by_method)
    rows, cols = grid_shape(len(names))
    fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols, 3.6 * rows), dpi=100, squeeze=False)
    bins = np.linspace(0, 1, 11)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for k, (ax, name) in enumerate(zip(axes.flat, names)):
        recs = by_method[name]
        for d in range(max_depth + 1):
            sel = [r for r in recs if (r["depth"] == d if d < max_depth else r["depth"] >= d)]
            if len(sel) < MIN_PER_DEPTH:
                continue
            p = np.array([r["predicted"] for r in sel])
            t = np.array([r["target"] for r in sel])
            idx = np.minimum(np.digitize(p, bins) - 1, 9)
            keep = [b for b in range(10) if (idx == b).sum() >= MIN_PER_BIN]
            ax.plot(
                [p[idx == b].mean() for b in keep],
                [t[idx == b].mean() for b in keep],
                marker="osD^v"[d % 5],
                ms=4,
                lw=1.3,
                color=f"C{d}",
                label=f"depth {d}{'+' if d == max_depth else ''} (n={len(sel)})",
            )
        ax.plot([0, 1], [0, 1], "k:", lw=1)
        ax.set(xlim=(0, 1), ylim=(0, 1), aspect="equal", title=name)
        ax.title.set_fontsize(10)
        if k % cols == 0:
            ax.set_ylabel("empirical success V^")
        if k >= len(names) - cols:
            ax.set_xlabel("predicted V~")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Calibration by depth (dotted: perfect)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def format_p(p: float) -> str:
    """A p-value for people: 3 decimals from 0.001 up, scientific notation below (never a bare 0.000)."""
    if math.isnan(p):
        return "nan"
    if p == 0.0:
        return "<1e-300"  # below what a double holds; the statistic, not the p-value, carries information here
    return f"{p:.3f}" if p >= 1e-3 else f"{p:.1e}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Header, a dashed rule and rows, padded to each column's widest cell (first column left-aligned)."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    return ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in lines]


def format_diagnosis(tables: dict[str, list[dict]]) -> str:
    """The tables `diagnose` returns as text: one block per method, columns aligned."""
    blocks = []
    for method, rows in tables.items():
        if not rows:
            continue
        cols = list(rows[0])
        cells = [
            [
                format_p(r[c])
                if c == "p_value"
                else ("-" if math.isnan(r[c]) else f"{r[c]:.3f}")
                if isinstance(r[c], float)
                else str(r[c])
                for c in cols
            ]
            for r in rows
        ]
        blocks.append("\n".join([method, *_table(cols, cells)]))
    return "\n\n".join(blocks)
