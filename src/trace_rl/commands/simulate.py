"""`trace-rl simulate`: every method trains the testbed policy at equal rollout budget, over one seed or several;
the run loop is `testbed.simulate`, this module turns its records into the summary table, the seed statistics
(`testbed.report`) and the plots."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import write_config
from ..strict_json import dumps
from ..testbed.simulate import SimulateConfig


def baseline_of(ran, methods: list[str]) -> str:
    """The method others are measured against: GRPO when it ran, else uniform TRACE, else the first listed."""
    return "grpo" if "grpo" in ran else ("trace_uniform" if "trace_uniform" in ran else methods[0])


def run(cfg: SimulateConfig, yaml_text: str) -> list[dict]:
    """Run every seed, print and write summary.json / summary.txt and the plots; returns the summary rows."""
    from ..plots import per_seed, plot_metric, plots_available
    from ..rollout.report import average_runs, format_table, summarize
    from ..testbed.report import format_seed_table, plot_accuracy_vs_cost, seed_statistics
    from ..testbed.simulate import run_seeds

    out = Path(cfg.out)
    write_config(yaml_text, out)
    seeds = list(cfg.seeds) or [cfg.seed]
    runs = run_seeds(cfg, out)
    results = average_runs(runs)
    baseline = baseline_of(results, cfg.methods)
    rows = summarize(results, baseline=baseline)
    accuracy = ""
    if len(seeds) > 1:
        stats = seed_statistics(runs, baseline=baseline)
        for row, stat in zip(rows, stats):
            row["er_per_seed"] = " ".join(
                f"{np.mean([r['rollout/effective_ratio'] for r in run[row['method']]]):.3f}" for run in runs
            )
            row["accuracy_over_seeds"] = stat
        accuracy = (
            f"exact held-out accuracy over seeds {seeds}: mean [95% interval]; differences paired by seed at "
            f"equal rollouts\n{format_seed_table(stats, baseline=baseline)}\n\n"
        )
    table = format_table([{k: v for k, v in r.items() if k != "accuracy_over_seeds"} for r in rows])
    if len(seeds) > 1:
        table = accuracy + f"mean over seeds {seeds}\n" + table
    print(table)
    (out / "summary.json").write_text(dumps(rows, indent=2))
    (out / "summary.txt").write_text(table + "\n")
    pngs = ""
    if plots_available():  # else one line says they were skipped
        per = per_seed(runs) if len(seeds) > 1 else results
        title = "Effective ratio (share of mixed trees)"
        plot_metric(per, "rollout/effective_ratio", out / "effective_ratio.png", title, smooth=5)
        plot_metric(per, "eval/accuracy", out / "accuracy.png", "Exact held-out accuracy")
        plot_accuracy_vs_cost(runs, out / "accuracy_vs_rollouts.png")
        plot_accuracy_vs_cost(runs, out / "accuracy_vs_turns.png", cost="turns")
        pngs = ", effective_ratio.png, accuracy.png, accuracy_vs_rollouts.png, accuracy_vs_turns.png"
    where = ", ".join(f"{out}/seed{s}/metrics.jsonl" for s in seeds) if len(seeds) > 1 else f"{out}/metrics.jsonl"
    print(f"\nwrote {out}/config.yaml, {where}, {out}/summary.json{pngs}")
    return rows
