"""PNG plots of per-step metrics, one line per method. matplotlib is imported here only (Agg backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or len(y) < window:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    head = c[1:window] / np.arange(1, window)
    return np.concatenate([head, (c[window:] - c[:-window]) / window])


def plot_metric(results: dict[str, list[dict]], key: str, path: str | Path, title: str, smooth: int = 1) -> Path:
    """One line per method of `key` over steps (records without the key are skipped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for name, recs in results.items():
        pts = [(r["step"] + 1, r[key]) for r in recs if key in r]
        if not pts:
            continue
        x, y = map(np.asarray, zip(*pts))
        style = "-" if name.startswith("trace") else "--"
        ax.plot(x, _smooth(y.astype(float), smooth), style, label=name, linewidth=1.6)
    ax.set_xlabel("step")
    ax.set_ylabel(key.replace("_", " "))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
