"""Where a training run's step records go: `logger=[console,jsonl,tensorboard,wandb]` (verl's convention).

`console` prints one line per step (the step of the run's total, the figures of `CONSOLE_KEYS`, and the time
left at the pace of the steps logged so far: their rollout, update and evaluation seconds), `jsonl` appends the
flat record to metrics.jsonl (the one schema of `rollout.records`), `tensorboard` and `wandb` are used only when
their packages are installed: a sink that is asked for but missing is reported in one line and skipped, so a run
never dies for want of a dashboard.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..rollout.records import MetricsWriter
from ..rollout.run_loop import time_left

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
    before it and drops those it redoes, `MetricsWriter`) to every sink asked for; `steps`, the run's total, goes
    into the console line (0: no total, no time left)."""

    def __init__(
        self,
        sinks: list[str],
        out: Path,
        config: dict | None = None,
        start: int = 0,
        run_name: str = "trace-rl",
        steps: int = 0,
    ):
        unknown = [s for s in sinks if s not in SINKS]
        if unknown:
            raise ValueError(f"logger: unknown {unknown}; choose from {', '.join(SINKS)}")
        self.sinks, self.out = list(sinks), Path(out)
        self.start, self.steps = start, steps
        self.spent, self.logged = 0.0, 0  # seconds of the steps logged by this process, and how many
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
        self.spent += sum(float(record.get(f"timing_s/{k}") or 0.0) for k in ("total", "update", "eval"))
        self.logged += 1
        if "console" in self.sinks:
            print(self.console_line(record, step), file=sys.stderr, flush=True)

    def console_line(self, record: dict, step: int) -> str:
        """'step   3/40  er 0.412  ...  about 2m10s left': 1-based step of the total, figures, time left."""
        head = f"step {step:>4}" + (f"/{self.steps}" if self.steps else "")
        parts = [head] + [f"{label} {fmt.format(record[k])}" for k, label, fmt in CONSOLE_KEYS if k in record]
        left = time_left(self.spent, self.logged, self.steps - self.start) if self.steps else ""
        return "  ".join(parts + ([left] if left else []))

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()
