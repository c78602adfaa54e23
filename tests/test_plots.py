import math

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")  # the plots extra; a core-only install skips this file
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb

from trace_rl.plots import aggregate, grid_shape, metric_figure, per_seed, plot_metric


def _run(values: dict[int, float], key: str = "eval/accuracy") -> list[dict]:
    """Records for steps 0..max, holding `key` only at the given steps (as accuracy is logged)."""
    last = max(values)
    return [
        {"step": s, "rollout/effective_ratio": 0.3, **({key: values[s]} if s in values else {})}
        for s in range(last + 1)
    ]


def _lines(fig) -> list:
    return [ln for ax in fig.axes for ln in ax.lines]


def _pixels_of(path, color: str, tol: float = 0.12) -> int:
    img = plt.imread(path)[..., :3]
    return int((np.abs(img - np.array(to_rgb(color))).max(axis=-1) < tol).sum())


def test_aggregate_mean_and_bands_over_seeds_with_missing_steps():
    seeds = [_run({0: 0.2, 4: 0.4}), _run({0: 0.6, 4: 0.8, 9: 1.0})]
    x, mean, lo, hi = aggregate(seeds, "eval/accuracy")
    assert x.tolist() == [0, 4, 9]
    assert np.allclose(mean, [0.4, 0.6, 1.0]) and np.allclose(lo, [0.2, 0.4, 1.0]) and np.allclose(hi, [0.6, 0.8, 1.0])
    _, mean, lo, hi = aggregate(seeds, "eval/accuracy", band="std")
    assert np.allclose(hi - mean, [0.2, 0.2, 0.0]) and np.allclose(mean - lo, [0.2, 0.2, 0.0])
    with pytest.raises(ValueError, match="band"):
        aggregate(seeds, "eval/accuracy", band="iqr")


def test_records_without_the_key_or_with_nan_are_skipped():
    run = [{"step": 0, "k": 1.0}, {"step": 1}, {"step": 2, "k": float("nan")}, {"step": 3, "k": 2.0}]
    x, mean, _, _ = aggregate([run], "k")
    assert x.tolist() == [0, 3] and mean.tolist() == [1.0, 2.0]


def test_a_single_logged_point_is_drawn_with_a_marker(tmp_path):
    runs = {"grpo": _run({2: 0.47981}), "trace": _run({2: 0.47991})}
    path = plot_metric(runs, "eval/accuracy", tmp_path / "acc.png", "Accuracy")
    fig = metric_figure({"": runs}, "eval/accuracy", "Accuracy")
    try:
        lines = _lines(fig)
        assert len(lines) == 2 and all(ln.get_marker() not in (None, "None", "") for ln in lines)
        ax = fig.axes[0]
        lo, hi = ax.get_ylim()
        assert hi - lo >= 0.01  # 1e-4 apart is not blown up to fill the axes
        assert not ax.yaxis.get_major_formatter().get_useOffset()
    finally:
        plt.close(fig)
    assert _pixels_of(path, "C0") > 20  # the grpo point is on the PNG, not a blank plot


def test_step_ticks_are_whole_numbers_and_start_at_step_one():
    runs = {"grpo": [{"step": s, "k": s / 10} for s in range(3)]}
    fig = metric_figure({"": runs}, "k", "t")
    try:
        ax = fig.axes[0]
        left, right = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if left <= t <= right]
        assert ticks == [1.0, 2.0, 3.0]
        assert _lines(fig)[0].get_xdata()[0] == pytest.approx(1.0)
    finally:
        plt.close(fig)


def test_equal_curves_stay_distinguishable():
    same = [{"step": s, "k": 0.1 * s} for s in range(8)]
    fig = metric_figure({"": {"grpo": same, "pcl": same, "treepo": same}}, "k", "t")
    try:
        lines = _lines(fig)
        styles = {(ln.get_marker(), ln.get_linestyle(), ln.get_color()) for ln in lines}
        assert len(styles) == 3
        xs = [ln.get_xdata()[0] for ln in lines]
        assert len(set(xs)) == 3 and max(xs) - min(xs) < 0.3  # shifted apart, by a fraction of a step
        widths = [ln.get_linewidth() for ln in lines]
        assert widths == sorted(widths, reverse=True)  # the line drawn on top is the thinnest
    finally:
        plt.close(fig)


def test_several_seeds_draw_mean_and_band_and_say_so(tmp_path):
    from matplotlib.collections import PolyCollection
    from matplotlib.container import ErrorbarContainer

    seeds = [[{"step": s, "k": 0.1 * s + 0.05 * i} for s in range(12)] for i in range(3)]
    fig = metric_figure({"": {"trace": seeds, "grpo": seeds[0]}}, "k", "ER")
    try:
        ax = fig.axes[0]
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == 1  # trace; grpo is a single run
        assert np.allclose(bands[0].get_paths()[0].vertices[:, 1].max(), 0.1 * 11 + 0.1)  # max over seeds
        mean = next(ln for ln in ax.lines if ln.get_label() == "trace (3 seeds)")
        assert np.allclose(mean.get_ydata(), [0.1 * s + 0.05 for s in range(12)])
        assert "min–max" in fig._suptitle.get_text()
        assert ax.get_legend_handles_labels()[1] == ["trace (3 seeds)", "grpo"]
    finally:
        plt.close(fig)
    sparse = [[{"step": s, "k": 0.5 + 0.1 * i} for s in (4, 9)] for i in range(3)]  # accuracy every 5 steps
    fig = metric_figure({"": {"trace": sparse}}, "k", "Accuracy", band="std")
    try:
        bars = [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
        assert len(bars) == 1 and "± 1 std" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
    assert plot_metric({"trace": seeds}, "k", tmp_path / "std.png", "ER", band="std").is_file()


def test_a_key_no_record_holds_still_writes_a_figure_that_says_so(tmp_path):
    fig = metric_figure({"": {"grpo": [{"step": 0, "a": 1.0}]}}, "b", "t")
    try:
        assert not _lines(fig) and any("no record holds 'b'" in t.get_text() for t in fig.axes[0].texts)
    finally:
        plt.close(fig)


def test_per_seed_and_grid_shape():
    a, b = {"grpo": [{"step": 0}]}, {"grpo": [{"step": 1}]}
    assert per_seed([a, b]) == {"grpo": [a["grpo"], b["grpo"]]}
    assert grid_shape(7) == (3, 3) and grid_shape(2) == (1, 2) and grid_shape(1) == (1, 1)
    assert math.prod(grid_shape(12)) >= 12


def test_accuracy_starts_at_step_zero_with_the_accuracy_before():
    from trace_rl.plots import with_start

    recs = [{"step": 0, "eval/accuracy_before": 0.5}, {"step": 1}, {"step": 2, "eval/accuracy": 0.7}]
    assert with_start(recs)[0] == {"step": -1, "eval/accuracy": 0.5} and with_start(recs)[1:] == recs
    assert with_start(recs[1:]) == recs[1:]  # no start recorded: unchanged
    fig = metric_figure({"": {"grpo": with_start(recs)}}, "eval/accuracy", "t")
    try:
        line = _lines(fig)[0]
        assert line.get_xdata().tolist() == [0.0, 3.0] and line.get_ydata().tolist() == [0.5, 0.7]
        assert fig.axes[0].get_xlim()[0] < 0  # the start is inside the axes
    finally:
        plt.close(fig)


def test_chain_plot_has_a_panel_per_link(tmp_path):
    from trace_rl.plots import CHAIN, plot_chain

    recs = [
        {"step": s, "rollout/effective_ratio": 0.3, "train/grad_norm": 1.0, "eval/accuracy_before": 0.4}
        for s in range(3)
    ]
    recs[-1]["eval/accuracy"] = 0.6
    path = plot_chain({"grpo": [recs, recs]}, tmp_path / "chain.png", "chain")
    assert path.is_file() and len(CHAIN) == 6
