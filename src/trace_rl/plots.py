"""PNG plots of per-step metrics, one line per method; matplotlib is imported here only (Agg backend).

`plot_metric` takes, per method, either one run (a list of per-step records) or several seeds' runs (a list of
such lists). Several seeds draw the mean over the seeds that logged the key at that step, with a shaded band:
min-max over seeds by default, or mean +- one standard deviation; the title says which. Records without the
key, or with a NaN there, are skipped, so metrics logged every few steps (accuracy) plot as their own points;
a band over at most BAR_POINTS points is drawn as error bars instead of shading.

Steps are 0-based in the records and drawn 1-based, as the progress lines print them, on integer ticks; a
record at step -1 is the state before training (`with_start` adds the accuracy before from the first record)
and is drawn at 0, which the axis then includes.
Every point carries a marker (a run shorter than an evaluation interval has one point, which a bare line
would not show; past MAX_MARKERS points, a marker every few steps, staggered between methods). Methods differ by
colour, marker, line style and line width, and each method's line is shifted sideways by DODGE of the axis
width per method (about 1% at 40 steps; ticks stay on whole steps), so methods with equal curves stay visible
next to each other instead of one hiding the others.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
LINESTYLES = ("-", "--", "-.", ":")
MIN_SPAN = 0.04  # smallest y range, as a share of the largest |value|: 1e-4 apart must not fill the plot
MAX_MARKERS = 16  # markers per line; more points than this get a marker every few steps
DODGE = 0.004  # sideways shift between neighbouring methods, as a share of the step axis (at least 10 steps)
BAR_POINTS = 5  # a seeds' band over this few points is drawn as error bars: shading between sparse points misleads
BANDS = {"minmax": "spread: min–max over seeds", "std": "spread: mean ± 1 std over seeds"}

Records = list[dict]
# what a command prints instead of its plots where matplotlib is missing (the vLLM environment has none)
SKIPPED = "plots skipped: matplotlib is not installed (pip install 'trace-rl[plots]'; scripts/install.sh installs it)"


def plots_available() -> bool:
    """Whether matplotlib can be imported; where it cannot, prints SKIPPED (one line, stderr) and returns False.
    A command asks this before it draws, so a run that finished its work never ends in a failing exit for want
    of its plots: it says in one line that they were skipped, and its other files are written as always."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(SKIPPED, file=sys.stderr)
        return False
    return True


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over `window` points; the first points average what came before them."""
    if window <= 1 or len(y) < window:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    head = c[1:window] / np.arange(1, window)
    return np.concatenate([head, (c[window:] - c[:-window]) / window])


def _seeds(runs: Records | list[Records]) -> list[Records]:
    """One run (records) or several seeds' runs (lists of records) -> a list of runs."""
    if not runs:
        return []
    return [runs] if isinstance(runs[0], dict) else list(runs)


def _points(run: Records, key: str) -> dict[int, float]:
    out = {}
    for rec in run:
        val = rec.get(key)
        if isinstance(val, (int, float)) and not isinstance(val, bool) and np.isfinite(val):
            out[int(rec["step"])] = float(val)
    return out


def aggregate(seeds: list[Records], key: str, band: str = "minmax") -> tuple[np.ndarray, ...]:
    """(steps, mean, low, high) over the seeds that logged `key` at each step (low = high = mean for one seed)."""
    if band not in BANDS:
        raise ValueError(f"band must be one of {sorted(BANDS)}, got {band!r}")
    per_seed = [_points(run, key) for run in seeds]
    steps = sorted(set().union(*per_seed)) if per_seed else []
    mean, low, high = [], [], []
    for s in steps:
        vals = np.array([p[s] for p in per_seed if s in p])
        mean.append(vals.mean())
        if band == "std":
            low.append(vals.mean() - vals.std())
            high.append(vals.mean() + vals.std())
        else:
            low.append(vals.min())
            high.append(vals.max())
    return np.array(steps, dtype=int), np.array(mean), np.array(low), np.array(high)


Runs = dict[str, Records] | dict[str, list[Records]]


def with_start(records: Records, key: str = "eval/accuracy") -> Records:
    """`records` preceded by a step -1 record holding `key` before training (read from `eval/accuracy_before`
    of the first record that has it), so an accuracy curve starts where training did; unchanged without one."""
    before = next((r[f"{key}_before"] for r in records if f"{key}_before" in r), None)
    if before is None:
        return records
    return [{"step": -1, key: before}, *records]


def _first_step(runs: Runs) -> int:
    return min((int(r["step"]) + 1 for v in runs.values() for run in _seeds(v) for r in run), default=1)


def _last_step(runs: Runs) -> int:
    return max((int(r["step"]) + 1 for v in runs.values() for run in _seeds(v) for r in run), default=1)


def _draw(
    ax, runs: Runs, key: str, smooth: int, band: str, last: int, xlabel: str = "step", first: int = 1
) -> tuple[int, bool]:
    """Draw one line (and band) per method of `runs` on `ax`; returns (lines drawn, any method had 2+ seeds).

    A method's colour, marker and offset follow its position in `runs`, so panels drawn from dicts with the
    same keys use the same style per method, and a method without data leaves its style unused.
    """
    from matplotlib.ticker import MaxNLocator

    # Sideways offsets: DODGE of the axis per method, all of them together at most a quarter step.
    dodge = min(DODGE * max(last, 10), 0.25 / max(1, len(runs) - 1))
    drawn, multi, shown = 0, False, []
    for i, (name, method_runs) in enumerate(runs.items()):
        seeds = _seeds(method_runs)
        x, y, lo, hi = aggregate(seeds, key, band)
        if not len(x):
            continue
        y, lo, hi = (_smooth(a, smooth) for a in (y, lo, hi))
        x = x + 1 + dodge * (i - (len(runs) - 1) / 2)
        color = f"C{i % 10}"
        n_seeds = sum(bool(_points(run, key)) for run in seeds)
        multi |= n_seeds > 1
        if n_seeds > 1 and len(x) <= BAR_POINTS:
            ax.errorbar(x, y, yerr=[y - lo, hi - y], fmt="none", ecolor=color, capsize=3, alpha=0.8, zorder=9 + i)
        elif n_seeds > 1:  # shading thins out as more methods overlap, so the lines stay readable
            ax.fill_between(x, lo, hi, color=color, alpha=max(0.05, 0.3 / len(runs)), linewidth=0, zorder=1 + i)
        every = max(1, int(np.ceil(len(x) / MAX_MARKERS)))
        ax.plot(
            x,
            y,
            color=color,
            linestyle=LINESTYLES[i % len(LINESTYLES)],
            marker=MARKERS[i % len(MARKERS)],
            markevery=(i % every, every),  # staggered, so equal curves still show every method's markers
            markersize=6.5 - 0.5 * (i % 4),
            markerfacecolor=color if i % 2 == 0 else "white",  # alternate filled and hollow markers
            linewidth=max(1.0, 2.6 - 0.3 * i),  # later (upper) lines thinner: a lower equal line stays visible
            alpha=0.9,
            label=name if n_seeds <= 1 else f"{name} ({n_seeds} seeds)",
            zorder=10 + i,
        )
        drawn += 1
        shown.extend([lo.min(), hi.max()])
    if not drawn:
        ax.text(0.5, 0.5, f"no record holds {key!r}", ha="center", va="center", transform=ax.transAxes)
    half_dodge = dodge * len(runs) / 2
    # the whole run from step 1 (0 with a start record), however sparse the key
    ax.set_xlim(min(first, 1) - 0.5 - half_dodge, last + 0.5 + half_dodge)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if shown and max(shown) - min(shown) < MIN_SPAN * max(map(abs, shown)):
        mid, half = (max(shown) + min(shown)) / 2, MIN_SPAN * max(map(abs, shown)) / 2
        ax.set_ylim(mid - half, mid + half)
    ax.ticklabel_format(axis="y", useOffset=False)  # an offset label (+4.798e-1) hides what the values are
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    return drawn, multi


def _legend(fig, axes: list) -> None:
    """One legend for all panels: inside a lone panel with a few lines, else beside the plots, off the data."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if len(axes) == 1 and len(seen) <= 4:
        if seen:
            axes[0].legend(fontsize=8)
        fig.tight_layout()
        return
    right = 0.74 if len(axes) == 1 else 0.82
    fig.tight_layout(rect=(0, 0, right, 1))
    fig.legend(
        list(seen.values()), list(seen), fontsize=8, loc="center left", bbox_to_anchor=(right, 0.5), frameon=False
    )


def plot_metric(
    runs: Runs,
    key: str,
    path: str | Path,
    title: str,
    smooth: int = 1,
    band: str = "minmax",
    ylabel: str | None = None,
    xlabel: str = "step",
) -> Path:
    """Plot `key` over steps, one line per method (mean and band for several seeds); returns the PNG path.

    `smooth` > 1 draws a trailing moving average of that many logged points (the band is smoothed alike).
    A key no record holds still writes a figure, saying so, so a caller's list of files stays true.
    """
    return plot_panels({"": runs}, key, path, title, smooth=smooth, band=band, ylabel=ylabel, xlabel=xlabel)


def plot_panels(
    panels: dict[str, Runs],
    key: str,
    path: str | Path,
    title: str,
    smooth: int = 1,
    band: str = "minmax",
    ylabel: str | None = None,
    xlabel: str = "step",
) -> Path:
    """`plot_metric` for several panels side by side (one per entry, titled by its name) sharing one legend.

    A method keeps its style across panels when every panel's dict lists the methods in the same order.
    """
    import matplotlib.pyplot as plt

    fig = metric_figure(panels, key, title, smooth=smooth, band=band, ylabel=ylabel, xlabel=xlabel)
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def metric_figure(
    panels: dict[str, Runs],
    key: str,
    title: str,
    smooth: int = 1,
    band: str = "minmax",
    ylabel: str | None = None,
    xlabel: str = "step",
):
    """The matplotlib Figure that `plot_panels` saves; whoever calls this closes it (plt.close)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if band not in BANDS:
        raise ValueError(f"band must be one of {sorted(BANDS)}, got {band!r}")
    last = max((_last_step(runs) for runs in panels.values()), default=1)
    first = min((_first_step(runs) for runs in panels.values()), default=1)
    fig, axes = plt.subplots(1, len(panels), figsize=(2 + 5.5 * len(panels), 4.2), dpi=110, squeeze=False, sharey=True)
    multi = False
    for ax, (name, runs) in zip(axes[0], panels.items()):
        multi |= _draw(ax, runs, key, smooth, band, last, xlabel, first)[1]
        if name:
            ax.set_title(name, fontsize=10)
    axes[0][0].set_ylabel(ylabel or key.replace("_", " "))
    fig.suptitle(f"{title}\nmean over seeds, {BANDS[band]}" if multi else title, fontsize=11)
    _legend(fig, list(axes[0]))
    return fig


def grid_shape(panels: int, max_cols: int = 3) -> tuple[int, int]:
    """(rows, cols) of a near-square grid for `panels` subplots, at most `max_cols` wide."""
    cols = max(1, min(max_cols, panels))
    return int(np.ceil(panels / cols)) if panels else 1, cols


def per_seed(runs: Sequence[dict[str, Records]]) -> dict[str, list[Records]]:
    """Seeds' {method: records} results -> {method: [records of each seed]}, the multi-seed input of plot_metric."""
    out: dict[str, list[Records]] = {}
    for run in runs:
        for name, recs in run.items():
            out.setdefault(name, []).append(recs)
    return out


CHAIN = (
    ("rollout/effective_ratio", "effective ratio"),
    ("train/adv_nonzero_token_share", "trained tokens with A ≠ 0"),
    ("train/adv_abs", "mean |A| in the loss"),
    ("train/grad_norm", "gradient norm (before clipping)"),
    ("train/update_kl", "KL(before ‖ after update)"),
    ("eval/accuracy", "held-out accuracy"),
)


def plot_chain(runs: Runs, path: str | Path, title: str, smooth: int = 3, band: str = "minmax") -> Path:
    """The chain from allocation to accuracy, one panel per link (CHAIN), one line per method: what the budget
    bought (effective ratio), how much of the loss carried signal, how far the update moved, and the accuracy
    (with its start at step 0). Per-step links are smoothed over `smooth` steps; accuracy is not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = {m: [with_start(r) for r in _seeds(v)] for m, v in runs.items()}
    rows, cols = grid_shape(len(CHAIN))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), dpi=100, squeeze=False)
    last = _last_step(runs)
    for ax, (key, label) in zip(axes.flat, CHAIN):
        data = acc if key == "eval/accuracy" else runs
        _draw(ax, data, key, 1 if key == "eval/accuracy" else smooth, band, last, "step", _first_step(data))
        ax.set_title(label, fontsize=10)
    fig.suptitle(title, fontsize=11)
    _legend(fig, list(axes.flat))
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
