"""`trace-rl eval`: pass@1 and pass@k of a model on an environment's benchmarks, or on a task file, through the
LM stack (`stack.build.build_stack`) and the engine's flat evaluation (`rollout.evaluate`); one table row per
benchmark, per-sample results on request."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import write_config
from ..errors import ConfigError, UserError
from ..stack.config import EngineConfig, LMEnvConfig, LMPolicyConfig, check_seed, env_config
from ..strict_json import dumps


@dataclass
class EvalConfig:
    """`trace-rl eval`: accuracy of a model on an environment's benchmarks (pass@1, pass@k)."""

    bench: list[str] = field(default_factory=list)  # benchmarks to run (default: all of the env's)
    data: str = ""  # a task file instead (verl / Search-R1 / SkyRL parquet or JSON-lines rows; its system kept)
    limit: int = 0  # first N tasks of each benchmark (0: all)
    k: list[int] = field(default_factory=lambda: [1])  # k of pass@k
    eval_samples: int = 1  # samples per task (at least the largest k); train's name for it too
    seed: int = 0  # one seed reproduces the samples
    out: str = ""  # a directory for per-sample results (samples.jsonl) and the resolved config (default: none)
    policy: LMPolicyConfig = field(default_factory=LMPolicyConfig)
    env: LMEnvConfig = field(default_factory=env_config)

    def __post_init__(self):
        if self.limit < 0:
            raise ValueError(f"limit must be >= 0 (0: every task), got {self.limit}")
        if self.eval_samples < 1:
            raise ValueError(f"eval_samples must be >= 1, got {self.eval_samples}")
        if not self.k or min(self.k) < 1:
            raise ValueError(f"k must be one or more integers >= 1, got {self.k}")
        check_seed(self.seed)
        if self.data and not Path(self.data).is_file():
            raise ValueError(f"data: no file {self.data}")
        if self.data and self.bench:
            raise ValueError("bench: give either data=FILE or bench names, not both")


def read_run(out: str | Path):
    """(the settings, the environment's spec) of a finished `trace-rl eval out=DIR` run, from its config.yaml: what
    an analysis of its samples.jsonl rebuilds the tasks with (`spec.benchmarks[name](limit)`)."""
    from ..config import load_config
    from ..stack.build import build_env

    cfg, _ = load_config(EvalConfig, ["--config", str(Path(out) / "config.yaml")])
    return cfg, build_env(cfg.env)


def run(cfg: EvalConfig, yaml_text: str) -> list[dict]:
    """Every chosen benchmark in turn; prints the table, writes samples.jsonl and config.yaml under `out` when
    set; returns one row per benchmark (pass@k and success by difficulty)."""
    from ..rollout.evaluate import check_context, evaluate
    from ..rollout.report import format_table
    from ..stack.build import build_env, build_stack

    spec = build_env(cfg.env)
    if cfg.data:
        from ..envs.data import load_tasks

        try:  # read before the model loads: a file that holds no rows stops the command before any work
            rows = load_tasks(cfg.data, cfg.limit or None)
        except UserError as err:
            raise ConfigError(f"data: {err}") from None
        spec.benchmarks = {Path(cfg.data).stem: lambda n: rows}
    benches = list(cfg.bench) or list(spec.benchmarks)
    unknown = [b for b in benches if b not in spec.benchmarks]
    if unknown:
        raise ConfigError(f"bench: unknown {unknown} for env {cfg.env.name}; choose from {', '.join(spec.benchmarks)}")
    samples = max(max(cfg.k), cfg.eval_samples)
    stack = build_stack(cfg.policy, spec, EngineConfig(), seed=cfg.seed)
    engine = stack.engine()  # evaluates only: no predictor, no budget
    rows = []
    out = Path(cfg.out) if cfg.out else None
    try:
        bench_tasks = {bench: spec.benchmarks[bench](cfg.limit or None) for bench in benches}
        for bench, tasks in bench_tasks.items():  # the model against every benchmark's tasks, before any output
            try:
                check_context(engine.actor, tasks, bench)
            except ValueError as err:
                raise ConfigError(f"policy.model: {err}") from None
        if out:
            write_config(yaml_text, out)
            (out / "samples.jsonl").write_text("")
        for i, (bench, tasks) in enumerate(bench_tasks.items(), 1):
            results: list = []
            label = f"{bench} (benchmark {i} of {len(bench_tasks)})" if len(bench_tasks) > 1 else bench
            res = evaluate(engine, tasks, samples=samples, ks=tuple(cfg.k), seed=cfg.seed, label=label, results=results)
            rows.append({"benchmark": bench, **res})
            if out:
                with open(out / "samples.jsonl", "a", encoding="utf-8") as fh:
                    for r in results:
                        fh.write(dumps({"benchmark": bench, **r}) + "\n")
    finally:
        stack.close()
    print(format_table(rows))
    if out:
        print(f"\nwrote {out}/samples.jsonl (one line per sample) and {out}/config.yaml")
    return rows
