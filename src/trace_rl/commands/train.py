"""`trace-rl train`: the trainer (`train.trainer`) from a resolved config, then the run's plots from its metrics
records (skipped in one line where matplotlib is missing) and its final lines (`summary_lines`). The config
stays with the trainer because `compare` builds one per run; `compare command=train` runs each of its runs here,
handing the evaluation of the start it shares between a pair's runs (`before`, `on_before`:
`train.trainer.train`'s)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..train.trainer import TrainConfig


def run(
    cfg: TrainConfig,
    yaml_text: str,
    before: dict | None = None,
    on_before: Callable[[dict], None] | None = None,
) -> dict:
    """Train (or resume), plot, print the final lines (`summary_lines`); returns the trainer's summary (what
    train_summary.json holds)."""
    from ..plots import plots_available
    from ..rollout.records import read_metrics
    from ..train.trainer import train

    s = train(cfg, yaml_text, before=before, on_before=on_before)
    out = Path(cfg.out)
    records = next(iter(read_metrics(out / "metrics.jsonl").values()), [])
    plotted = plots_available()  # else one line says the plots were skipped
    if plotted:
        plot_run(cfg.method, records, out)
    sys.stdout.flush()  # the progress went to stderr: the summary comes after it, also when both are piped
    print("\n".join(summary_lines(s, cfg, records, plotted)), flush=True)
    return s


def _with_se(value: float | None, se: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if se is None or not np.isfinite(se) else f"{value:.3f} ± {se:.3f}"


def summary_lines(s: dict, cfg: TrainConfig, records: list[dict], plotted: bool = True) -> list[str]:
    """The run's final lines (what the README's set-up promises of `make demo`): held-out accuracy before and
    after with its standard error over tasks, on how many tasks and samples; the mean effective ratio; where the
    checkpoints, the metrics and the plots are."""
    from ..train.checkpoint import checkpoints

    out = Path(cfg.out)
    before_se = (s.get("before") or {}).get("accuracy_se")
    before, after = _with_se(s["accuracy_before"], before_se), _with_se(s["accuracy_after"], s.get("accuracy_se"))
    lines = [
        f"held-out accuracy on {cfg.eval_tasks} tasks x {cfg.eval_samples} samples: {before} before, {after} after "
        f"{s['steps']} step{'s' if s['steps'] != 1 else ''} ({s['rollouts']:,} rollouts; ± one standard error over "
        "tasks)"
    ]
    er = np.mean([r["rollout/effective_ratio"] for r in records]) if records else float("nan")
    lines.append(f"effective ratio (mean over steps): {er:.3f}; peak resident memory {s['peak_rss_gib']:.2f} GiB")
    saved = checkpoints(out)
    where = f"{saved[-1][1]} (the newest of {len(saved)}; resume=true continues from it)" if saved else "none"
    lines.append(f"checkpoints: {where}; metrics: {out / 'metrics.jsonl'}")
    if plotted:
        lines.append(f"plots: {out}/effective_ratio.png, accuracy.png, loss.png, chain.png")
    return lines


def plot_run(method: str, records: list[dict], out: Path) -> None:
    """A training run's PNGs: effective ratio, held-out accuracy from the start (step 0), loss and the chain."""
    from ..plots import plot_chain, plot_metric, with_start

    by = {method: records}
    plot_metric(by, "rollout/effective_ratio", out / "effective_ratio.png", "Effective ratio per step")
    acc = {method: with_start(records)}  # from the accuracy before training, at step 0
    plot_metric(acc, "eval/accuracy", out / "accuracy.png", "Held-out accuracy")
    plot_metric(by, "train/loss", out / "loss.png", "Policy loss")
    plot_chain(by, out / "chain.png", "Effective ratio -> signal -> update size -> accuracy")
