"""The published figures, drawn from the compact results store (`trace-rl report update=true`): the testbed's
accuracy against rollouts, and stage 2's flip calibration before and after its layers on the LM task.

Each function reads what its table reads (`results.published`) and writes one PNG; matplotlib is imported when
one is drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..predictors.calibration import depth_names
from ..testbed.report import plot_accuracy_vs_cost
from .published import Arm, MissingRuns, Stores, flips_of, testbed_runs

__all__ = ["FIGURES", "MissingRuns", "Stores"]


def testbed_accuracy(stores: Stores, folder: Path) -> Path:
    """Mean exact held-out accuracy against rollouts, one line per method, seed bands."""
    path = Path(folder) / "testbed_accuracy_vs_rollouts.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_accuracy_vs_cost(testbed_runs(stores), path)
    return path


ARMS = {"TRACE default (q of V~)": Arm("lm_default", "trace"), "both calibration layers": Arm("lm_calibrated", "trace")}


def lm_flip_calibration(stores: Stores, folder: Path) -> Path:
    """Predicted against realised flip share of the prefixes stage 2 chose, by depth, per arm, with the realised
    share's 95% interval and the continuations behind each point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    top = 0.0  # the axes end a little above the largest prediction or interval drawn
    for i, (label, arm) in enumerate(ARMS.items()):
        flips = flips_of(stores, arm)
        rows = {d: flips[d] for d in depth_names(4) if d in flips}
        pred, real = [r["pred"] for r in rows.values()], [r["real"] for r in rows.values()]
        err = [[r["real"] - r["real_lo"] for r in rows.values()], [r["real_hi"] - r["real"] for r in rows.values()]]
        ax.errorbar(pred, real, yerr=err, marker="os"[i % 2], capsize=3, label=label, linestyle="none")
        for j, (name, r) in enumerate(rows.items()):
            # the first arm labels each point below-right of it; the second, whose points sit together near the
            # diagonal, stacks its labels up-left with a leader line so none covers another
            leader = {"xytext": (-30, 22 + 11 * j), "ha": "right", "arrowprops": {"arrowstyle": "-", "color": "0.6"}}
            side = {"xytext": (4, -10)} if i % 2 == 0 else leader
            text = f"d{name} ({r['continuations']:,})"
            ax.annotate(text, (r["pred"], r["real"]), fontsize=7, textcoords="offset points", **side)
        top = max(top, *pred, *(r["real_hi"] for r in rows.values()))
    top = min(1.0, 1.1 * top)
    ax.plot([0, top], [0, top], ":", color="0.5", label="perfect")
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="predicted flip share (what stage 2 allocated on)")
    ax.set_ylabel("realised flip share [95%]")
    ax.set_title("Stage 2's chosen prefixes, by depth (continuations)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(folder) / "lm_flip_calibration.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


FIGURES: dict[str, Callable[[Stores, Path], Path]] = {
    "testbed_accuracy_vs_rollouts": testbed_accuracy,
    "lm_flip_calibration": lm_flip_calibration,
}
