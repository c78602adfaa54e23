"""`trace-rl train`: train an LM agent with TRACE (or a baseline) end to end.

`train()` reads in pieces: the resume point, the build, the evaluation of the start, the run loop, checkpoints
and the summary. Each step is the one run loop's (`rollout.run_loop`): candidate pool -> the one TRACE step
(`rollout.engine`: predictor, stage-1 allocation, tree rollouts, targets, predictor update) -> the LM learner
(`train.learner`: the step's learning rate, tree advantages, the tree-packed policy update, weight sync to the
backend, whose KV caches are dropped) -> metrics; held-out evaluation every `eval_every` steps and at the end; a
checkpoint every `save_every` steps and at the end.

Resuming (`resume=true`) loads the newest intact checkpoint (a damaged one is skipped with one line, see
`checkpoint`; a run that already reached `steps` says so and returns its summary) and continues with the same
pools and the same random streams: every random draw of a step comes from the run's seed and the step
(`seeding`), and the backend's caches are emptied at the start of each step, so the steps after a resume produce
the metrics of an uninterrupted run (all but timing).

For `trace-rl compare`: the accuracy before training is in the first step's record (`eval/accuracy_before`) and
the summary; each evaluation logs standard errors over tasks and of the sampling alone (`accuracy_se`); the
summary holds digests of the held-out tasks and training pools (seed-only), so runs on one seed can be checked to
share them. Each step appends the predictor's scored nodes to predictions.jsonl (`trace-rl diagnose`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import resource
import sys
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..methods import BudgetPlan
from ..rollout.records import MetricsWriter, StepRecord
from ..rollout.run_loop import RunLoop
from ..safe_read import read_json
from ..seeding import derive_seed
from ..stack.build import build_env, build_predictor, build_stack
from ..stack.config import LMEnvConfig, LMRunConfig, check_seed, env_config
from ..strict_json import dumps
from ..trace_config import TraceConfig, check_advantage, check_method
from .checkpoint import LAYERS, RunState, entries, restore, resume_point, run_record, save_checkpoint
from .learner import LMLearner
from .loggers import SINKS, StepLogger
from .update import UpdateConfig, make_optimizer


@dataclass
class TrainConfig(LMRunConfig):
    """`trace-rl train`: train an LM agent with TRACE (or a baseline) at a fixed rollout budget per step."""

    out: str = "runs/train"  # run directory: config.yaml, metrics.jsonl, checkpoints global_step_N/, plots
    seed: int = 0  # one seed reproduces the run
    steps: int = 40  # training steps
    method: str = TraceConfig.method  # how rollouts are allocated (methods.METHODS)
    advantage: str = TraceConfig.advantage  # estimator ('': the method's own): trace | grpo | tree_grpo | treepo
    weighting: str = TraceConfig.weighting  # a turn shared by k leaves: first (once) | leaf (k times) | split (1/k)
    resume: bool = False  # continue from the newest complete checkpoint in out
    eval_every: int = 20  # steps between held-out evaluations (and one at the start and the end)
    eval_tasks: int = 640  # held-out tasks per evaluation (640 x 2: the sampling standard error is below 1 point)
    eval_samples: int = 2  # samples per held-out task (accuracy is their mean; pass@k for k = samples)
    save_every: int = 20  # steps between checkpoints (and one at the end)
    keep_last: int = 2  # checkpoints kept on disk
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # console, jsonl, tensorboard, wandb
    progress: bool = True  # progress bars for rollouts, update and evaluation
    # executor, ray, policy, predictor, engine: inherited from LMRunConfig, as in `rollout`; budget and env too,
    # with train's own defaults: 64 rollouts a step (at an equal total, twice the updates of 128 a step learn faster
    # at a stable rate) on the calculator's `train` preset, where training moves held-out accuracy
    budget: BudgetPlan = field(default_factory=lambda: BudgetPlan(prompts=8))  # rollouts per step, and their split
    env: LMEnvConfig = field(default_factory=lambda: env_config("calculator", preset="train"))
    update: UpdateConfig = field(default_factory=UpdateConfig)

    def __post_init__(self):
        check_method(self.method, oracle=False)
        check_advantage(self.advantage)
        for name in ("steps", "eval_every", "eval_tasks", "eval_samples", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {self.keep_last}")
        unknown = [s for s in self.logger if s not in SINKS]
        if unknown:
            raise ValueError(f"logger: unknown {unknown}; choose from {', '.join(SINKS)}")
        if "jsonl" not in self.logger:
            raise ValueError(
                f"logger: must include jsonl, the metrics file that resume, compare and the plots read "
                f"(got {','.join(self.logger) or 'none'})"
            )
        check_seed(self.seed)
        if not self.out:
            raise ValueError("out must be a directory path, got an empty string")
        super().__post_init__()  # the executor
        if not self.policy.temperature > 0:
            raise ValueError("policy.temperature must be > 0 to train: the update needs the sampling log-probs")
        if self.policy.backend == "vllm" and self.policy.vllm.dtype not in ("auto", self.update.dtype):
            raise ValueError(
                f"policy.vllm.dtype: {self.policy.vllm.dtype} differs from update.dtype {self.update.dtype}; the PPO "
                "ratio divides the update's probabilities by the sampler's, so set one dtype (policy.vllm.dtype=auto "
                "follows update.dtype)"
            )
        if self.policy.backend == "server":
            raise ValueError(
                "policy.backend: a server's weights cannot be updated from here; train with hf or vllm "
                "(rollout and eval take backend=server)"
            )
        self.trace_config()  # TRACE's settings together, through the one check

    def trace_config(self) -> TraceConfig:
        """This run's TRACE configuration, from the keys the command line names (method, advantage, budget.*,
        predictor.*: kind, prefix_share, lr and the calibration layers, weighting)."""
        return TraceConfig(self.method, self.advantage, self.budget, self.predictor.settings(), self.weighting)


# what a resume may change: where a run writes and how it reports, how long it runs, where it computes; every
# other setting (and the seed) decides what the steps compute, so a checkpoint of other ones is another run's
RESUMABLE = ("out", "resume", "progress", "logger", "save_every", "keep_last", "steps", "eval_every", "seed")
RESUMABLE_GROUPS = {"executor": None, "ray": None, "policy": ("device", "backend", "server_url")}


def run_identity(cfg: TrainConfig) -> dict:
    """The run a checkpoint of `cfg` belongs to (`checkpoint.run_record`): its seed and the settings above."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in RESUMABLE}
    for group, keys in RESUMABLE_GROUPS.items():
        if keys is None:
            settings.pop(group, None)
        elif isinstance(settings.get(group), dict):
            settings[group] = {k: v for k, v in settings[group].items() if k not in keys}
    return run_record(cfg.seed, json.loads(json.dumps(settings, default=str)))


def ensure_policy(cfg: TrainConfig) -> dict:
    """The default policy 'tiny' (or 'tiny@N') is a warm start: the package ships tiny@0 and tiny@2; another seed
    is built here by `trace-rl sft seed=N` when this code and these library versions have none cached yet (under a
    lock, so concurrent runs build it once).
    Returns what the run records of its start (`warm_start.describe`; the model name alone for other models)."""
    from ..lm import warm_start

    seed = warm_start.parse_tiny(cfg.policy.model)
    if seed is None:
        return {"path": cfg.policy.model}
    ship = warm_start.shipped(seed)
    if ship is not None:  # the same weights on every machine: nothing to build
        return warm_start.describe(ship)
    entry = warm_start.entry_dir(seed)
    if not warm_start.read_manifest(entry):
        from .sft import SFTConfig, run_sft

        steps = SFTConfig.__dataclass_fields__["steps"].default
        held = warm_start.cached_elsewhere(seed)
        why = f" (the cache holds {held}, built by other code or library versions)" if held else ""
        print(
            f"building the warm start {cfg.policy.model} for this machine{why}: trace-rl sft seed={seed}, {steps} "
            "steps, about 6 minutes on a free core (more on a busy one), once: it is cached for later runs. "
            f"({' and '.join(f'tiny@{s}' for s in warm_start.SHIPPED)} ship with the package and need no build)",
            file=sys.stderr,
        )
        run_sft(SFTConfig(seed=seed))
    return warm_start.describe(entry)


def start_comment(start: dict) -> str:
    """YAML comment lines naming the warm start, appended to a run's config.yaml (comments: the file still loads
    as --config)."""
    lines = [f"# warm start: {start.get('path')}"]
    if start.get("key"):
        lines.append(
            f"#   key {start['key']}, weights digest {start['weights_digest']}, "
            f"SFT report success {start['sft_success']:.3f}, versions {json.dumps(start['versions'], sort_keys=True)}"
            + (f", numerics {start['numerics']}" if start.get("numerics") else "")
        )
    return "\n".join(lines) + "\n"


def task_digest(tasks: list[dict], previous: str = "") -> str:
    """A short sha256 of `tasks` (chained onto `previous`): equal digests, equal task lists."""
    text = previous + json.dumps(tasks, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def accuracy_se(results: list[dict], tasks: int) -> tuple[float, float]:
    """Two standard errors of the held-out accuracy (mean success over tasks and samples):
    over tasks, std of the per-task mean / sqrt(tasks), which counts the draw of the tasks and the sampling;
    and of the sampling alone on this fixed task set, sqrt(sum_t c_t (S - c_t) / (S^2 (S - 1))) / tasks with
    c_t successes in S samples (unbiased per-task variance; nan with one sample). Runs that share the held-out
    set (one seed, several methods; before and after) differ by the second, not the first."""
    import numpy as np

    per_task: dict[int, list[float]] = {}
    for r in results:
        per_task.setdefault(r["index"], []).append(float(r["score"] > 0.5))
    means = np.array([np.mean(v) for v in per_task.values()])
    over_tasks = float(means.std(ddof=1) / np.sqrt(tasks)) if tasks > 1 else float("nan")
    s = min(len(v) for v in per_task.values()) if per_task else 0
    if s < 2:
        return over_tasks, float("nan")
    c = np.array([sum(v) for v in per_task.values()])
    return over_tasks, float(np.sqrt(np.sum(c * (s - c) / (s * s * (s - 1)))) / tasks)


def evaluate_policy(cfg: TrainConfig, engine, tasks, step: int) -> dict:
    """The held-out evaluation of the policy the training engine samples (its flat `evaluate`)."""
    from ..rollout.evaluate import evaluate

    engine.actor.backend.clear_cache()
    samples: list[dict] = []
    res = evaluate(
        engine,
        tasks,
        samples=cfg.eval_samples,
        ks=(1, cfg.eval_samples),
        seed=derive_seed(cfg.seed, "eval"),
        label=f"eval step {step}",
        progress=cfg.progress,
        results=samples,
    )
    se_tasks, se_sampling = accuracy_se(samples, len(tasks))
    return {
        "accuracy": res["pass@1"],
        "accuracy_se": se_tasks,
        "accuracy_se_sampling": se_sampling,
        f"pass@{cfg.eval_samples}": res[f"pass@{cfg.eval_samples}"],
    }


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kilobytes on Linux


def _finished_summary(cfg: TrainConfig, out: Path, state: RunState) -> dict:
    """The summary of a run that already reached its steps: the one it wrote, else what its checkpoint holds."""
    try:
        summary = read_json(out / "train_summary.json", strict=False)
        if isinstance(summary, dict):
            return summary
    except (OSError, ValueError):
        pass  # no summary, or one that is not readable: what the checkpoint holds
    return {
        "method": cfg.method,
        "seed": cfg.seed,
        "steps": state.step,
        "accuracy_after": None,
        "out": str(out),
        "accuracy_before": state.accuracy_before,
        "rollouts": state.rollouts,
        "peak_rss_gib": _peak_rss_gib(),
    }


def resume_checkpoint(cfg: TrainConfig, out: Path, identity: dict):
    """The checkpoint a resumed run continues from (`checkpoint.resume_point`: the newest intact one of this run),
    None for a run from the start; an `out` that holds checkpoints without resume=true is refused."""
    found = entries(out)  # a file or a dangling link named global_step_N counts: a later save would hit it
    if found and not cfg.resume:
        raise UserError(f"out: {out} already holds checkpoints; pass resume=true to continue, or another out")
    return resume_point(out, _stderr, identity) if cfg.resume and found else None


@dataclass
class TrainRun:
    """A run once built: its parts, the step it starts at (a resumed run's checkpoint step, else 0) and what it
    has reached (`state`). Its methods are what the run loop calls: the pool of a step, the evaluation, the run
    totals of a record, the checkpoint after a step."""

    cfg: TrainConfig
    out: Path
    identity: dict  # checkpoint.run_record of the run
    config_yaml: str
    start: int
    start_model: dict  # the warm start (ensure_policy)
    tokenizer: object
    policy: object  # stack.build.PolicyStack
    engine: object  # rollout.engine.TreeRolloutEngine, with the run's predictor
    learner: LMLearner  # with the model and its optimizer
    method: object  # the method's spec (methods.Method)
    spec: object  # the environment (envs.registry.EnvSpec)
    held_out: list[dict]
    state: RunState

    def pool(self, step: int) -> list[dict]:
        """The step's candidate pool, drawn from the seed and the step (a resumed run draws the same ones); its
        digest is chained onto the run's."""
        tasks = self.spec.train(self.cfg.budget.pool, derive_seed(self.cfg.seed, "pool", step))
        self.state.pools_digest = task_digest(tasks, self.state.pools_digest)
        return tasks

    def evaluate(self, step: int) -> dict:
        return evaluate_policy(self.cfg, self.engine, self.held_out, step)

    def finish(self, record: StepRecord, result) -> None:
        """The run totals in a step's record: rollouts so far, peak memory."""
        self.state.rollouts += result.rollouts
        record.train["rollouts_total"] = self.state.rollouts
        record.train["peak_rss_gib"] = _peak_rss_gib()

    def saved(self, step: int) -> None:
        """After step `step`'s record is written: the state reached, and a checkpoint every `save_every` steps and
        at the last."""
        cfg, state = self.cfg, self.state
        state.step = step + 1
        for name in LAYERS:  # a calibrated layer resumes from the checkpoint's state
            if (layer := getattr(self.engine, name)) is not None:
                setattr(state, name, layer.state_dict())
        if (step + 1) % cfg.save_every == 0 or step == cfg.steps - 1:
            model, optimizer, predictor = self.learner.model, self.learner.optimizer, self.engine.predictor
            doc, yaml = state.to_json(), self.config_yaml
            save_checkpoint(
                self.out, step + 1, model, self.tokenizer, optimizer, predictor, doc, yaml, cfg.keep_last, self.identity
            )


def build_run(cfg: TrainConfig, ckpt, identity: dict, config_yaml: str) -> TrainRun:
    """The env, the warm start, the LM stack (`build_stack`: the model, prepared here with its optimizer and the
    predictor, a resumed run's restored from `ckpt` with the random streams, before the reference model and the
    backend load), the run directory, the engine and the learner."""
    out = Path(cfg.out)
    spec = build_env(cfg.env)  # a corpus or sandbox problem stops the run before the warm start
    warmup = [] if ckpt else cfg.predictor.warmup_trees()  # a resumed run's predictor is in its checkpoint
    start_model = ensure_policy(cfg)
    if start_model.get("key"):
        print(
            f"warm start {cfg.policy.model}: weights {start_model['weights_digest']}, "
            f"SFT report success {start_model['sft_success']:.3f} ({start_model['path']})",
            file=sys.stderr,
        )
    trace = cfg.trace_config()
    optimizer = predictor = None
    state, start = RunState(), 0

    def prepare(model) -> None:  # on the loaded model, before the reference model and the backend
        nonlocal optimizer, predictor, state, start
        model.train()
        optimizer = make_optimizer(model, cfg.update)
        predictor = build_predictor(cfg.predictor, trace.method_spec, cfg.seed, warmup)
        if ckpt:
            restore(ckpt, model, optimizer)
            predictor, state, start = ckpt.predictor, RunState.from_json(ckpt.state), ckpt.step
            print(f"resumed from {ckpt.path} (step {start})", file=sys.stderr)

    # the backend samples in the update's dtype, so each step's first PPO ratio is 1 (lm.precision)
    stack = build_stack(
        cfg.policy,
        spec,
        cfg.engine,
        seed=cfg.seed,
        train=True,
        reference=cfg.update.kl_coef > 0,
        dtype=cfg.update.dtype,
        prepare=prepare,
        executor=cfg.executor,
        ray=cfg.ray,
        memory={"micro_batch_tokens": cfg.update.micro_batch_tokens, "step_copy": cfg.update.max_update_kl > 0},
    )
    model, tok, policy, ref_model = stack.model, stack.tokenizer, stack.policy, stack.ref_model
    out.mkdir(parents=True, exist_ok=True)
    if config_yaml:
        (out / "config.yaml").write_text(config_yaml + start_comment(start_model))
    engine = stack.engine(predictor, trace)
    for name in LAYERS:  # a resumed run's layers, as they were saved
        if (layer := getattr(engine, name)) is not None and getattr(state, name):
            layer.load_state_dict(getattr(state, name))
    held_out = spec.held_out(cfg.eval_tasks, derive_seed(cfg.seed, "held-out"))
    state.held_out_digest = task_digest(held_out)
    learner = LMLearner(
        model,
        optimizer,
        policy,
        cfg.update,
        cfg.steps,
        trace,
        ref_model=ref_model,
        temperature=cfg.policy.temperature,  # log-probs of the distribution the rollouts sampled
    )
    return TrainRun(
        cfg=cfg,
        out=out,
        identity=identity,
        config_yaml=config_yaml,
        start=start,
        start_model=start_model,
        tokenizer=tok,
        policy=policy,
        engine=engine,
        learner=learner,
        method=trace.method_spec,
        spec=spec,
        held_out=held_out,
        state=state,
    )


def start_evaluation(run: TrainRun, before: dict | None, on_before: Callable[[dict], None] | None) -> dict:
    """The held-out evaluation of the start policy (`before` when the caller has it), kept in the run's state;
    returns it as the eval/ keys of step 0's record (accuracy_before, before_accuracy_se, ...)."""
    run.learner.model.eval()
    if not before:
        before = evaluate_policy(run.cfg, run.engine, run.held_out, 0)
        if on_before:
            on_before(before)
    before = dict(before)
    run.state.accuracy_before = before["accuracy"]
    run.state.before = before
    print(
        f"held-out accuracy before training: {before['accuracy']:.3f} (standard error over tasks "
        f"{before['accuracy_se']:.3f}, of the sampling on these tasks {before['accuracy_se_sampling']:.3f})",
        file=sys.stderr,
    )
    return {f"{k}_before" if k == "accuracy" else f"before_{k}": v for k, v in before.items()}


def write_summary(run: TrainRun, record: dict) -> dict:
    """train_summary.json (strict JSON: a NaN standard error is null) from the state and the last step's record."""
    cfg, state = run.cfg, run.state
    summary = {
        "method": cfg.method,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "accuracy_before": state.accuracy_before,
        "before": state.before,
        "accuracy_after": record.get("eval/accuracy"),
        "accuracy_se": record.get("eval/accuracy_se"),
        "accuracy_se_sampling": record.get("eval/accuracy_se_sampling"),
        "rollouts": state.rollouts,
        "warm_start": run.start_model,
        "held_out_digest": state.held_out_digest,
        "pools_digest": state.pools_digest,
        "peak_rss_gib": _peak_rss_gib(),
        "out": str(run.out),
    }
    (run.out / "train_summary.json").write_text(dumps(summary, indent=2))
    return summary


def train(
    cfg: TrainConfig,
    config_yaml: str = "",
    before: dict | None = None,
    on_before: Callable[[dict], None] | None = None,
) -> dict:
    """Run (or resume) training; returns a summary (accuracy before and after, effective ratio, paths).

    `before`: the evaluation of the start policy on this run's held-out tasks, when the caller already has it
    (`compare`: every method of a seed starts from the same policy and evaluates the same tasks with per-sample
    seeds, so the evaluation is the same number; it is computed once per seed, not once per run).
    `on_before`: called with the evaluation of the start as soon as this run has computed it.
    """
    out = Path(cfg.out)
    identity = run_identity(cfg)
    ckpt = resume_checkpoint(cfg, out, identity)
    if ckpt and ckpt.step >= cfg.steps:  # nothing left to train: say so, and hand back what the run reached
        print(f"{out} already reached step {ckpt.step} (steps={cfg.steps}); raise steps to train on", file=sys.stderr)
        return _finished_summary(cfg, out, RunState.from_json(ckpt.state))
    run = build_run(cfg, ckpt, identity, config_yaml)
    records: list[dict] = []
    try:
        # records of steps from the start on are (re)done: the writers drop those a resumed run's files hold
        with closing(
            StepLogger(cfg.logger, out, start=run.start, run_name=f"{cfg.method}-seed{cfg.seed}", steps=cfg.steps)
        ) as logger:
            before_keys = start_evaluation(run, before, on_before) if run.start == 0 else None
            loop = RunLoop(
                run.engine,
                run.method,
                run.pool,
                cfg.seed,
                learner=run.learner,
                evaluate=run.evaluate,
                eval_every=cfg.eval_every,
                log=logger.log,
                predictions=MetricsWriter(out / "predictions.jsonl", run.start, _stderr),
                finish=run.finish,
                saved=run.saved,
            )
            records = loop.run(cfg.steps, run.start, before=before_keys)
    finally:
        run.policy.close()
    return write_summary(run, records[-1] if records else {})
