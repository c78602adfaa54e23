"""What a TRACE step costs in wall-clock on a real engine, against GRPO and the peers at equal rollouts.

    python bench/step_cost.py                                        # HF backend, shipped tiny model, calculator
    .venv-vllm/bin/python bench/step_cost.py policy.backend=vllm     # vLLM's engine (its own environment)
    python bench/step_cost.py policy.model=smollm2-135m env=math budget.prompts=4 budget.rollouts_per_prompt=4

Every method grows trees from one frozen policy on the same candidate pools (any `trace-rl rollout` setting is
accepted as key=value), `--steps` measured steps per seed after one discarded warm-up step (the engine's own
warm-up stays out of the figures), methods in an order rotated per seed. Each step's caches are emptied first, as
`train`'s learner does, so prefix-cache hits are the step's own. A step's wall clock is split into

    generate   backend calls (the union of their intervals: the engine busy)
    env        environment steps (wall during which any ran)
    predictor  V~ of roots and anchors, and its update
    allocate   stage 1 and stage 2
    other      the rest: bookkeeping and the event loop between rounds

which add up to the step exactly under round batching (the default), where no two of them run at once. Under eager
and continuous batching environment steps run during generation: `other` is then what is left after that overlap
(it absorbs an overlap smaller than itself) and `overlap` the excess, so the split there is approximate. Also
counted: backend calls (rounds, under round batching; one per episode turn under continuous), tokens generated,
prompt tokens served from the prefix cache, the engine's busy share (the step's tokens per second of wall over
those of one backend call with as many rows and tokens: the best the engine does with this work), and how a call's
cost per decode iteration grows with its rows (rows^b, fitted over the run's calls). `--update` adds one policy
update per method on its last step's trees (a copy of the model; the sampled policy stays frozen) and, on vLLM, one
weight sync; `--batchings round,continuous` compares batching policies on one engine; `--json FILE[.gz]` keeps the
run and `--from FILE` prints its tables again (`step_cost_tables`).

The figure of interest is paired by seed: a method's step wall over GRPO's, against its generated tokens over
GRPO's. A ratio of the two near 1 means the step costs what its tokens cost; above 1, its calls cost more than
their tokens (fewer rows a call, more calls). A limit: generation is from the frozen start policy, so lengths are
the start policy's; an update changes them, and with them every figure.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import inspect
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from step_cost_tables import (  # beside this script (sys.path[0] when it runs)
    StepCost,
    report,
    reprint,
    stored,
)

DEFAULT_METHODS = ("grpo", "pcl", "trace", "trace_root_only", "trace_prefix_only", "trace_uniform")


@dataclass
class Call:
    """One backend call: when it ran, its rows, their prompt tokens, those it prefilled, tokens generated."""

    start: float
    end: float
    rows: int
    prompt_tokens: int
    computed_tokens: int
    generated: int
    longest: int = 0  # the most tokens one row generated: the call's decode iterations


class RecordingBackend:
    """A backend that passes every call to `inner` and records it (`calls`); everything else is `inner`'s."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        agen = getattr(inner, "agenerate", None)
        self._keys = agen is not None and "keys" in inspect.signature(agen).parameters

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _record(self, prompts, gens, start: float) -> None:
        self.calls.append(
            Call(
                start,
                time.perf_counter(),
                len(prompts),
                sum(len(p) for p in prompts),
                sum(g.prefix_tokens_computed for g in gens),
                sum(len(g.token_ids) for g in gens),
                max((len(g.token_ids) for g in gens), default=0),
            )
        )

    def generate(self, prompts, params, seed=None, seeds=None):
        start = time.perf_counter()
        gens = self.inner.generate(prompts, params, seed, seeds)
        self._record(prompts, gens, start)
        return gens

    async def agenerate(self, prompts, params, seeds=None, keys=None):
        start = time.perf_counter()
        extra = {"keys": keys} if self._keys and keys is not None else {}
        gens = await self.inner.agenerate(prompts, params, seeds=seeds, **extra)
        self._record(prompts, gens, start)
        return gens


def busy_seconds(calls: list[Call]) -> float:
    """The union of the calls' intervals: seconds during which at least one call was in the engine."""
    total, end = 0.0, float("-inf")
    for c in sorted(calls, key=lambda c: c.start):
        if c.end > end:
            total += c.end - max(c.start, end)
            end = c.end
    return total


def split_step(result, calls: list[Call]) -> tuple[dict, float]:
    """The step's wall (`result.time['total']`) as PARTS that add up to it, and the overlap subtracted: the engine's
    own clock for env, predictor and allocate, the recorded calls for generate, `other` the remainder. Where the
    parts sum past the wall (eager batching: environment steps during generation), `other` is 0 and the excess
    is the overlap: generate + env + predictor + allocate + other - overlap == wall."""
    t = result.time
    parts = {
        "generate": busy_seconds(calls),
        "env": t["env"],
        "predictor": t["predictor"],
        "allocate": t["allocate"],
    }
    rest = t["total"] - sum(parts.values())
    parts["other"] = max(rest, 0.0)
    return parts, max(-rest, 0.0)


def stage_times(result) -> dict:
    """When the step's rounds turned: the first prompt's bare rollouts ending, the first and last stage 2 starting."""
    out = {}
    bare = [t for what, _, t in result.events if what == "bare_done"]
    stage2 = [t for what, _, t in result.events if what == "stage2_start"]
    if bare:
        out["first_bare_done"] = min(bare)
        out["last_bare_done"] = max(bare)
    if stage2:
        out["first_stage2"], out["last_stage2"] = min(stage2), max(stage2)
    return out


def step_cost(name: str, seed: int, step: int, result, calls: list[Call]) -> StepCost:
    """The cost record of one grown step from its result and the backend calls it made."""
    parts, overlap = split_step(result, calls)
    prompt = sum(c.prompt_tokens for c in calls)
    return StepCost(
        method=name,
        seed=seed,
        step=step,
        wall=result.time["total"],
        parts=parts,
        overlap=overlap,
        rollouts=result.rollouts,
        tokens=result.generated_tokens,
        rounds=len(calls),
        call_tokens=sum(c.generated for c in calls),
        prompt_tokens=prompt,
        cached_tokens=prompt - sum(c.computed_tokens for c in calls),
        stages=stage_times(result),
        calls=[(c.rows, c.longest, c.end - c.start) for c in calls],
    )


def reference_rate(backend, trees, rows: int, tokens: int, params, calls: int = 2) -> float | None:
    """Tokens/s of one backend call (the best of `calls`; None for 0) with `rows` rows (the trees' root prompts, in
    turn) and about as many tokens per row as the step generated per rollout: what the engine does when nothing
    waits."""
    from trace_rl.backends.base import SamplingParams

    roots = [t.root.token_ids for t in trees if t.root.children and t.root.token_ids]
    if calls < 1 or not roots or rows < 1 or tokens < 1:
        return None
    prompts = [roots[i % len(roots)] for i in range(rows)]
    per_row = max(1, round(tokens / rows))
    ref = SamplingParams(params.temperature, params.top_p, per_row)
    best = 0.0
    for _ in range(calls):  # the best of a few: one call's figure moves with whatever else the machine did then
        backend.clear_cache()
        t0 = time.perf_counter()
        gens = backend.generate(prompts, ref, seeds=list(range(rows)))
        seconds = time.perf_counter() - t0
        best = max(best, sum(len(g.token_ids) for g in gens) / seconds if seconds > 0 else 0.0)
    return best


class UpdateTimer:
    """One policy update on a step's trees, on a copy of the start model with a fresh optimizer each time (the
    sampled policy stays frozen); with `sync`, one weight sync of the copy into the backend is timed once."""

    def __init__(self, model_name: str, trace_defaults: dict):
        from trace_rl.lm.models import load_model
        from trace_rl.train.update import UpdateConfig

        self.model, _ = load_model(model_name)
        self.start = copy.deepcopy(self.model.state_dict())
        self.cfg, self.temperature = UpdateConfig(), trace_defaults.get("temperature", 1.0)

    def time_update(self, trace, trees) -> float:
        from trace_rl.advantages import batch_advantages
        from trace_rl.train.update import make_optimizer, update_policy

        active = [t for t in trees if t.root.children]
        self.model.load_state_dict(self.start)
        self.model.train()
        optimizer = make_optimizer(self.model, self.cfg)
        t0 = time.perf_counter()
        update_policy(
            self.model,
            optimizer,
            active,
            batch_advantages(trace.advantage_name, active),
            self.cfg,
            temperature=self.temperature,
            weighting=trace.weighting,
        )
        return time.perf_counter() - t0

    def time_sync(self, backend) -> float:
        t0 = time.perf_counter()
        backend.update_weights(self.model.state_dict())
        return time.perf_counter() - t0


def grow_steps(stack, recorder, cfg, name: str, pools: list, seed: int, steps: int, warmup: int = 0):
    """`steps` steps of method `name` on `pools` (the first `warmup` of them discarded); returns each measured
    step's (StepResult, calls)."""
    from trace_rl.stack.build import build_predictor
    from trace_rl.trace_config import TraceConfig

    trace = TraceConfig(name, budget=cfg.budget, predictor=cfg.predictor.settings())
    engine = stack.engine(build_predictor(cfg.predictor, trace.method_spec, seed, []), trace)
    out = []
    for step in range(warmup + steps):
        stack.backend.clear_cache()  # as train's learner does: a step's cache hits are its own
        recorder.calls = []
        result = engine.grow(pools[step], trace.method_spec, step)
        if step >= warmup:
            out.append((result, list(recorder.calls)))
    return trace, out


def measure(
    stack, recorder, cfg, methods, seeds, steps: int, batchings=("round",), updater=None, log=print, reference=2
) -> list[StepCost]:
    """Every method under every batching policy on every seed's pools, in an order rotated per seed; one discarded
    warm-up step first."""
    from trace_rl.seeding import derive_seed

    pool_size = cfg.budget.pool
    warm = stack.spec.train(pool_size, derive_seed(10_000, "warm-up"))
    t0 = time.perf_counter()
    grow_steps(stack, recorder, cfg, "grpo", [warm], 0, 0, warmup=1)
    log(f"warm-up step: {time.perf_counter() - t0:.1f} s (not counted)")
    runs = [(b, m) for b in batchings for m in methods]
    rows, done, start = [], 0, time.perf_counter()
    for k, seed in enumerate(seeds):
        tasks = stack.spec.train(pool_size * steps, derive_seed(seed, "pools"))
        pools = [tasks[i * pool_size : (i + 1) * pool_size] for i in range(steps)]
        for batching, name in runs[k % len(runs) :] + runs[: k % len(runs)]:
            stack.engine_config.batching = batching  # the next engine's actor batches this way
            trace, grown = grow_steps(stack, recorder, cfg, name, pools, seed, steps)
            costs = [step_cost(name, seed, i, res, calls) for i, (res, calls) in enumerate(grown)]
            for c in costs:
                c.batching = batching
            last, _ = grown[-1]
            costs[-1].reference_tps = reference_rate(
                stack.backend, last.trees, last.rollouts, last.generated_tokens, stack.params, reference
            )
            if updater is not None:
                costs[-1].update = updater.time_update(trace, last.trees)
            rows += costs
            done += 1
            wall = sum(c.wall for c in costs) / len(costs)
            log(f"[{done}/{len(runs) * len(seeds)}] seed {seed} {batching:<10} {name:<18} step {wall:6.2f} s  "
                f"tokens {costs[-1].tokens:>7,}  "
                f"({time.perf_counter() - start:.0f} s so far)")  # fmt: skip
    return rows


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="other arguments: trace-rl rollout's key=value settings"
    )
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma-separated methods (grpo first)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds: pools and sampling")
    ap.add_argument("--steps", type=int, default=2, help="measured steps per method and seed")
    ap.add_argument("--batchings", default="", help="comma-separated batching policies to compare (default: the "
                    "setting engine.batching): round, eager, continuous (vllm, server)")  # fmt: skip
    ap.add_argument("--reference", type=int, default=2, help="reference calls per method for the busy share "
                    "(the best is kept; 0: none)")  # fmt: skip
    ap.add_argument("--update", action="store_true", help="time one policy update per method (and a weight sync)")
    ap.add_argument("--from", dest="from_json", default="", help="print the tables of a stored run (a --json file)")
    ap.add_argument("--json", default="", help="write every step's record and the table here (.json.gz: compressed)")
    args, settings = ap.parse_known_args(argv)
    bad = [s for s in settings if "=" not in s or s.startswith("-")]
    if bad:
        ap.error(f"unknown argument {bad[0]!r}: see --help for the options; settings are trace-rl rollout's key=value")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    args.methods = [m for m in args.methods.split(",") if m]
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    return args, settings


def main(argv: list[str] | None = None) -> dict:
    from trace_rl.commands.rollout import RolloutConfig
    from trace_rl.config import load_config
    from trace_rl.errors import ConfigError
    from trace_rl.stack.build import build_env, build_stack
    from trace_rl.trace_config import check_methods

    args, settings = parse(argv)
    if args.from_json:
        return {"tables": reprint(args.from_json)}
    try:
        cfg, _ = load_config(RolloutConfig, settings + [f"methods=[{','.join(args.methods)}]"])
        check_methods(args.methods, oracle=False)
        args.batchings = [b for b in args.batchings.split(",") if b] or [cfg.engine.batching]
        for b in args.batchings:  # each as engine.batching would be checked, against this backend
            load_config(RolloutConfig, settings + [f"engine.batching={b}"])
        spec = build_env(cfg.env)
        if cfg.executor != "local":
            raise ValueError("executor: step_cost records the backend's calls in this process; use executor=local")
    except (ConfigError, ValueError) as err:
        sys.exit(f"step_cost: {err}")
    if cfg.policy.backend == "vllm":
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its per-request INFO lines would bury the progress
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB, on vLLM's CPU build (ignored on a GPU)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    log(f"step_cost: {cfg.policy.backend} backend, model {cfg.policy.model}, env {cfg.env.name}, {cfg.budget.total} "
        f"rollouts a step from a pool of {cfg.budget.pool}, seeds {args.seeds}, {args.steps} steps, batching "
        f"{','.join(args.batchings)}")  # fmt: skip
    stack = build_stack(cfg.policy, spec, cfg.engine, seed=cfg.seed, executor=cfg.executor, ray=cfg.ray)
    recorder = RecordingBackend(stack.policy.backend)
    stack.policy.backend = recorder
    try:
        updater = UpdateTimer(cfg.policy.model, {"temperature": cfg.policy.temperature}) if args.update else None
        rows = measure(
            stack, recorder, cfg, args.methods, args.seeds, args.steps, args.batchings, updater, log, args.reference
        )
        sync = updater.time_sync(recorder.inner) if updater is not None and cfg.policy.backend == "vllm" else None
    finally:
        stack.close()
    tables = report(rows, args.batchings, sync)
    out = {"settings": settings, "args": {k: v for k, v in vars(args).items()}, "tables": tables, "sync": sync,
           "steps": [stored(r) for r in rows]}  # fmt: skip
    if args.json:
        text = json.dumps(out, indent=None if args.json.endswith(".gz") else 1)
        if args.json.endswith(".gz"):
            Path(args.json).write_bytes(gzip.compress(text.encode(), mtime=0))
        else:
            Path(args.json).write_text(text)
    return out


if __name__ == "__main__":  # vLLM's engine starts worker processes: nothing may run at import
    main()
