"""`trace-rl diagnose RUN_DIR`: predictor quality by depth from a run's predictions.jsonl, with PNG plots.

Reads RUN_DIR/predictions.jsonl (or RUN_DIR/seed*/predictions.jsonl) and metrics.jsonl; writes
calibration_by_depth.png (mean empirical success per predicted-value bin, one line per depth) and
spearman_over_steps.png (root and prefix rank correlation per step, one line per method).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .diagnostics import summarize_records


def _read_jsonl(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        with open(path) as fh:
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        raise ValueError(f"{path}:{lineno}: not JSON") from None
    return rows


def load_run(run_dir: str | Path) -> tuple[list[dict], list[dict]]:
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory {run} does not exist")
    preds = sorted(run.glob("predictions.jsonl")) or sorted(run.glob("seed*/predictions.jsonl"))
    if not preds:
        raise FileNotFoundError(f"no predictions.jsonl in {run} (written by trace-rl simulate / rollout)")
    metrics = sorted(run.glob("metrics.jsonl")) or sorted(run.glob("seed*/metrics.jsonl"))
    return _read_jsonl(preds), _read_jsonl(metrics)


def diagnose(run_dir: str | Path, max_depth: int = 4) -> dict[str, list[dict]]:
    """Per method, one row per depth: n, Spearman rho and p, ECE, Brier; also writes the plots."""
    preds, metrics = load_run(run_dir)
    by_method: dict[str, list[dict]] = {}
    for r in preds:
        by_method.setdefault(r["method"], []).append(r)
    tables = {m: summarize_records(recs, max_depth=max_depth) for m, recs in by_method.items()}
    _plot_calibration(by_method, Path(run_dir) / "calibration_by_depth.png", max_depth)
    _plot_spearman(metrics, Path(run_dir) / "spearman_over_steps.png")
    return tables


def _plot_calibration(by_method: dict[str, list[dict]], path: Path, max_depth: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(by_method)
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.8), dpi=100, squeeze=False)
    bins = np.linspace(0, 1, 11)
    for ax, name in zip(axes[0], names):
        recs = by_method[name]
        for d in range(max_depth + 1):
            sel = [r for r in recs if (r["depth"] == d if d < max_depth else r["depth"] >= d)]
            if len(sel) < 10:
                continue
            p = np.array([r["predicted"] for r in sel])
            t = np.array([r["target"] for r in sel])
            idx = np.minimum(np.digitize(p, bins) - 1, 9)
            xs = [p[idx == b].mean() for b in range(10) if (idx == b).sum() >= 3]
            ys = [t[idx == b].mean() for b in range(10) if (idx == b).sum() >= 3]
            ax.plot(xs, ys, "o-", ms=3, label=f"depth {d}{'+' if d == max_depth else ''} (n={len(sel)})")
        ax.plot([0, 1], [0, 1], "k:", lw=1)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("predicted V~")
        ax.set_ylabel("empirical success V^")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_spearman(metrics: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    methods = sorted({m["method"] for m in metrics})
    for name in methods:
        for key, style in (("diag_spearman_root", "-"), ("diag_spearman_prefix", "--")):
            pts = {}
            for m in metrics:
                if m["method"] == name and key in m and m[key] == m[key]:
                    pts.setdefault(m["step"], []).append(m[key])
            if pts:
                steps = sorted(pts)
                ax.plot(np.array(steps) + 1, [np.mean(pts[s]) for s in steps], style,
                        label=f"{name} {'roots' if 'root' in key else 'prefixes'}")
    ax.set_xlabel("step")
    ax.set_ylabel("Spearman(V~, V^)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
