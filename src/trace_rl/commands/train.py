"""`trace-rl train`: the trainer (`train.trainer`) from a resolved config, then its one-line report and the
run's plots from its metrics records. The config stays with the trainer because `compare` builds one per run;
`compare command=train` runs each of its runs here, handing the evaluation of the start it shares between a
pair's runs (`before`, `on_before`: `train.trainer.train`'s)."""

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
    """Train (or resume), print accuracy before and after and the mean effective ratio, plot; returns the
    trainer's summary (what train_summary.json holds)."""
    from ..rollout.records import read_metrics
    from ..train.trainer import train

    s = train(cfg, yaml_text, before=before, on_before=on_before)
    before, after = ("-" if s[k] is None else f"{s[k]:.3f}" for k in ("accuracy_before", "accuracy_after"))
    print(
        f"held-out accuracy: {before} before, {after} after {s['steps']} steps "
        f"({s['rollouts']:,} rollouts); peak resident memory {s['peak_rss_gib']:.2f} GiB"
    )
    out = Path(cfg.out)
    records = next(iter(read_metrics(out / "metrics.jsonl").values()), [])
    er = np.mean([r["rollout/effective_ratio"] for r in records]) if records else float("nan")
    print(f"effective ratio (mean over steps): {er:.3f}")
    try:
        plot_run(cfg.method, records, out)
        print(f"plots: {cfg.out}/effective_ratio.png, accuracy.png, loss.png, chain.png; metrics: {out}/metrics.jsonl")
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install 'trace-rl[plots]')", file=sys.stderr)
    return s


def plot_run(method: str, records: list[dict], out: Path) -> None:
    """A training run's PNGs: effective ratio, held-out accuracy from the start (step 0), loss and the chain."""
    from ..plots import plot_chain, plot_metric, with_start

    by = {method: records}
    plot_metric(by, "rollout/effective_ratio", out / "effective_ratio.png", "Effective ratio per step")
    acc = {method: with_start(records)}  # from the accuracy before training, at step 0
    plot_metric(acc, "eval/accuracy", out / "accuracy.png", "Held-out accuracy")
    plot_metric(by, "train/loss", out / "loss.png", "Policy loss")
    plot_chain(by, out / "chain.png", "Effective ratio -> signal -> update size -> accuracy")
