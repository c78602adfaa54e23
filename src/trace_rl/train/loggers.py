"""Where a training run's step records go: `logger=[console,jsonl,tensorboard,wandb]` (verl's convention).

`console` prints one line per step, `jsonl` appends the flat record to metrics.jsonl (the one schema of
`rollout.records`), `tensorboard` and `wandb` are used only when their packages are installed: a sink that is
asked for but missing is reported in one line and skipped, so a run never dies for want of a dashboard.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..rollout.records import MetricsWriter

SINKS = ("console", "jsonl", "tensorboard", "wandb")
CONSOLE_KEYS = (
    ("rollout/effective_ratio", "er", "{:.3f}"),
    ("rollout/success_rate", "reward", "{:.3f}"),
    ("train/loss", "loss", "{:+.4f}"),
    ("train/clip_frac", "clip", "{:.3f}"),
    ("train/grad_norm", "|g|", "{:.2f}"),
    ("eval/accuracy", "eval acc", "{:.3f}"),
    ("timing_s/total", "rollout s", "{:.1f}"),
    ("timing_s/update", "update s", "{:.1f}"),
)


class StepLogger:
    """The step records of a run (from step `start`: a resumed run's metrics.jsonl keeps the records of the steps
    before it and drops those it redoes, `MetricsWriter`) to every sink asked for."""

    def __init__(
        self, sinks: list[str], out: Path, config: dict | None = None, start: int = 0, run_name: str = "trace-rl"
    ):
        unknown = [s for s in sinks if s not in SINKS]
        if unknown:
            raise ValueError(f"logger: unknown {unknown}; choose from {', '.join(SINKS)}")
        self.sinks, self.out = list(sinks), Path(out)
        self.jsonl = None
        if "jsonl" in sinks:
            self.jsonl = MetricsWriter(self.out / "metrics.jsonl", start, lambda line: print(line, file=sys.stderr))
        self.tb = self.wandb = None
        if "tensorboard" in sinks:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.out / "tensorboard"))
            except ImportError:
                print(
                    "logger: tensorboard was asked for but is not installed (pip install tensorboard); skipped",
                    file=sys.stderr,
                )
        if "wandb" in sinks:
            try:
                import wandb

                self.wandb = wandb.init(
                    project="trace-rl",
                    name=run_name,
                    config=config,
                    dir=str(self.out),
                    resume="allow" if start else None,
                )
            except ImportError:
                print("logger: wandb was asked for but is not installed (pip install wandb); skipped", file=sys.stderr)

    def log(self, record: dict) -> None:
        step = int(record["step"]) + 1
        if self.jsonl:
            self.jsonl.write(record)
        numeric = {k: v for k, v in record.items() if "/" in k and isinstance(v, (int, float))}
        if self.tb:
            for k, v in numeric.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb:
            self.wandb.log(numeric, step=step)
        if "console" in self.sinks:
            parts = [f"step {step:>4}"] + [
                f"{label} {fmt.format(record[k])}" for k, label, fmt in CONSOLE_KEYS if k in record
            ]
            print("  ".join(parts), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()
