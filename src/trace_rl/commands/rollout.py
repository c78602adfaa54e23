"""`trace-rl rollout`: grow trees with several methods from one frozen policy at equal budget and compare.

No policy update: every method samples from the same model, sees the same candidate pools, and runs the one
TRACE step (`engine`) with the LM actor, so its predictor learns online from its own trees (a fresh predictor
per method), as in training. It is built on the LM stack (`stack.build`) as `train` is: the same policy,
backend, env and engine, and the same run loop (`rollout.run_loop`), without a learner. `run` writes the summary
table (`rollout.report.summarize`) and the effective-ratio plot.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..config import write_config
from ..rollout.records import MetricsWriter
from ..rollout.run_loop import RunLoop, progress_line
from ..seeding import derive_seed
from ..stack.build import build_env, build_predictor, build_stack
from ..stack.config import LMRunConfig, check_seed
from ..trace_config import TraceConfig, check_methods

DEFAULT_METHODS = ("grpo", "pcl", "treepo", "trace_root_only", "trace")


@dataclass
class RolloutConfig(LMRunConfig):
    """`trace-rl rollout`: methods compared on LM agents' trees from one frozen policy."""

    out: str = "runs/rollout"  # run directory: config.yaml, metrics.jsonl, summary, plots, trees
    seed: int = 0  # one seed reproduces the run (pools, samples, predictor)
    steps: int = 10  # candidate pools to grow trees on (the predictor learns online)
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))  # each grows trees on the same pools
    save_trees: bool = False  # write every method's trees (token ids, masks, log-probs, rewards) to trees_<m>.jsonl
    progress: bool = True  # a progress line on stderr
    # executor, ray, budget, policy, predictor, env, engine: inherited from LMRunConfig, as in `train`

    def __post_init__(self):
        super().__post_init__()
        check_methods(self.methods, oracle=False)
        check_seed(self.seed)
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not self.out:
            raise ValueError("out must be a directory path, got an empty string")


def _tokens(records: list[dict]) -> str:
    """The progress line's tail: tokens generated so far."""
    return f"tokens {sum(r['rollout/generated_tokens'] for r in records):,}"


def run_rollout(cfg: RolloutConfig, yaml_text: str = "") -> dict[str, list[dict]]:
    """Every method over the same pools; returns the flat records by method and writes them under cfg.out, with
    `yaml_text` as its config.yaml. Nothing is written before the env and the stack are built, so a refusal
    there (a missing corpus, a model that cannot load) leaves no directory behind."""
    out = Path(cfg.out)
    spec = build_env(cfg.env)
    warmup = cfg.predictor.warmup_trees()
    if warmup:
        print(
            f"predictor warm-up: {len(warmup)} trees, {sum(len(t.rewards()) for t in warmup)} rollouts from "
            f"{cfg.predictor.warmup} (spent before this run, not counted in its budget)"
        )
    stack = build_stack(cfg.policy, spec, cfg.engine, seed=cfg.seed, executor=cfg.executor, ray=cfg.ray)
    tasks = spec.train(cfg.budget.pool * cfg.steps, derive_seed(cfg.seed, "pools"))
    pools = [tasks[i * cfg.budget.pool : (i + 1) * cfg.budget.pool] for i in range(cfg.steps)]
    if yaml_text:
        write_config(yaml_text, out)
    writer, preds = MetricsWriter(out / "metrics.jsonl"), MetricsWriter(out / "predictions.jsonl")
    for name in cfg.methods:
        (out / f"trees_{name}.jsonl").unlink(missing_ok=True)
    # The model, tokenizer and imports never die: keep them out of the collector's scans (full collections
    # took a few % of a tiny-model run's wall-clock and made the overhead figure jumpy).
    gc.freeze()
    results: dict[str, list[dict]] = {}
    try:
        for name in cfg.methods:
            trace = TraceConfig(name, budget=cfg.budget, predictor=cfg.predictor.settings())
            method = trace.method_spec
            engine = stack.engine(build_predictor(cfg.predictor, method, cfg.seed, warmup), trace)
            loop = RunLoop(
                engine,
                method,
                pool=lambda step: pools[step],
                seed=cfg.seed,
                log=writer.write,
                predictions=preds,
                trees=out / f"trees_{name}.jsonl" if cfg.save_trees else None,
                progress=progress_line(f"{name:<18}", cfg.steps, _tokens) if cfg.progress else None,
            )
            results[name] = loop.run(cfg.steps)
            if cfg.progress:
                print(file=sys.stderr)
    finally:
        gc.unfreeze()  # a caller that runs main() again (the tests) gets its garbage collected as before
        stack.close()
    return results


def run(cfg: RolloutConfig, yaml_text: str) -> list[dict]:
    """Grow every method's trees, print and write rollout_summary.json / .txt and the plot; returns the rows."""
    from ..plots import plot_metric, plots_available
    from ..rollout.report import format_table, summarize, write_summary

    out = Path(cfg.out)
    results = run_rollout(cfg, yaml_text)
    rows = summarize(results)
    write_summary(out / "rollout_summary", rows, format_table(rows))
    files = "config.yaml, rollout_summary.json, metrics.jsonl, predictions.jsonl"
    if plots_available():
        title = "Effective ratio (share of mixed trees)"
        plot_metric(results, "rollout/effective_ratio", out / "effective_ratio.png", title)
        files += ", effective_ratio.png"
    print(f"\nwrote {out}/{files}")
    return rows
