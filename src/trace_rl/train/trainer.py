"""`trace-rl train`: train an LM agent with TRACE (or a baseline) end to end.

Each step, read top to bottom: candidate pool -> the one TRACE step (`rollout.engine`: predictor, stage-1
allocation, tree rollouts, targets, predictor update) -> tree advantages -> policy update on the trees
(`train.update`, tree-packed) -> weight sync to the backend (its KV caches are dropped) -> metrics; held-out
evaluation every `eval_every` steps and at the end; a checkpoint every `save_every` steps and at the end.

Resuming (`resume=true`) loads the newest complete checkpoint and continues with the same pools and the same
random streams: every random draw of a step comes from the run's seed and the step (`seeding`), and the
backend's caches are emptied at the start of each step, so the steps after a resume produce the metrics of an
uninterrupted run (all but timing).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..advantages import ADVANTAGES, batch_advantages
from ..methods import METHODS, BudgetPlan, get_method
from ..rollout.engine import EXECUTORS, make_executor
from ..rollout.ray_executor import RayConfig
from ..rollout.records import step_record
from ..seeding import derive_seed
from ..stack.build import build_actor, build_engine, build_env, build_policy, build_predictor
from ..stack.config import EngineConfig, LMEnvConfig, LMPolicyConfig, LMPredictorConfig, check_seed
from .checkpoint import checkpoints, load_checkpoint, save_checkpoint
from .loggers import SINKS, StepLogger
from .update import UpdateConfig, make_optimizer, update_policy


@dataclass
class TrainConfig:
    """`trace-rl train`: train an LM agent with TRACE (or a baseline) at a fixed rollout budget per step."""

    out: str = "runs/train"  # run directory: config.yaml, metrics.jsonl, checkpoints global_step_N/, plots
    seed: int = 0  # one seed reproduces the run
    steps: int = 40  # training steps
    method: str = "trace"  # how rollouts are allocated (methods.METHODS)
    advantage: str = ""  # advantage estimator (default: the method's own): trace | grpo | tree_grpo | treepo
    resume: bool = False  # continue from the newest complete checkpoint in out
    eval_every: int = 20  # steps between held-out evaluations (and one at the start and the end)
    eval_tasks: int = 256  # held-out tasks per evaluation
    eval_samples: int = 4  # samples per held-out task (accuracy is their mean; pass@k for k = samples)
    save_every: int = 20  # steps between checkpoints (and one at the end)
    keep_last: int = 2  # checkpoints kept on disk
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # console, jsonl, tensorboard, wandb
    progress: bool = True  # progress bars for rollouts, update and evaluation
    executor: str = "local"  # where prompt trees grow: local (asyncio in this process) or ray (Ray workers)
    ray: RayConfig = field(default_factory=RayConfig)  # the Ray cluster, with executor=ray
    budget: BudgetPlan = field(default_factory=BudgetPlan)  # rollouts per step and how tree methods split them
    policy: LMPolicyConfig = field(default_factory=LMPolicyConfig)
    predictor: LMPredictorConfig = field(default_factory=LMPredictorConfig)
    env: LMEnvConfig = field(default_factory=LMEnvConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)

    def __post_init__(self):
        if self.method not in METHODS or METHODS[self.method].predictor == "oracle":
            raise ValueError(
                f"method: unknown {self.method!r}; choose from "
                f"{', '.join(m for m in METHODS if METHODS[m].predictor != 'oracle')}"
            )
        if self.advantage and self.advantage not in ADVANTAGES:
            raise ValueError(f"advantage: unknown {self.advantage!r}; choose from {', '.join(ADVANTAGES)}")
        for name in ("steps", "eval_every", "eval_tasks", "eval_samples", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {self.keep_last}")
        unknown = [s for s in self.logger if s not in SINKS]
        if unknown:
            raise ValueError(f"logger: unknown {unknown}; choose from {', '.join(SINKS)}")
        if "jsonl" not in self.logger:  # the run's record, which resume, compare and the plots read
            raise ValueError(f"logger: must include jsonl (got {','.join(self.logger) or 'none'}); add console, ...")
        check_seed(self.seed)
        if not self.out:
            raise ValueError("out must be a directory path, got an empty string")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        if not self.policy.temperature > 0:
            raise ValueError("policy.temperature must be > 0 to train: the update needs the sampling log-probs")
        if self.policy.backend == "server":
            raise ValueError(
                "policy.backend: a server's weights cannot be updated from here; train with hf or vllm "
                "(rollout and eval take backend=server)"
            )


def ensure_policy(cfg: TrainConfig) -> None:
    """The default policy 'tiny' is the warm-started tiny model: train it with `trace-rl sft` once (cached)."""
    from ..lm.models import DEFAULT_MODEL, cache_dir

    if cfg.policy.model != DEFAULT_MODEL or (cache_dir() / "tiny-sft" / "config.json").exists():
        return
    from .sft import SFTConfig, run_sft

    print(
        "the default policy is not warm-started yet: running trace-rl sft first (cached for later runs)",
        file=sys.stderr,
    )
    run_sft(SFTConfig())


def evaluate_policy(cfg: TrainConfig, actor, tasks, step: int) -> dict:
    from ..rollout.evaluate import evaluate

    actor.backend.clear_cache()
    res = evaluate(
        actor,
        tasks,
        samples=cfg.eval_samples,
        ks=(1, cfg.eval_samples),
        seed=derive_seed(cfg.seed, "eval"),
        label=f"eval step {step}",
        progress=cfg.progress,
    )
    return {"accuracy": res["pass@1"], f"pass@{cfg.eval_samples}": res[f"pass@{cfg.eval_samples}"]}


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kilobytes on Linux


def train(cfg: TrainConfig, config_yaml: str = "") -> dict:
    """Run (or resume) training; returns a summary (accuracy before and after, effective ratio, paths)."""
    import torch

    from ..lm.models import load_model

    out = Path(cfg.out)
    start = 0
    found = checkpoints(out)
    if found and not cfg.resume:
        raise ValueError(f"out: {out} already holds checkpoints; pass resume=true to continue, or another out")
    spec = build_env(cfg.env)  # a corpus or sandbox problem stops the run before the warm start
    resuming = bool(cfg.resume and found)
    warmup = [] if resuming else cfg.predictor.warmup_trees()  # a resumed run's predictor is in its checkpoint
    ensure_policy(cfg)
    torch.manual_seed(cfg.seed)
    model, tok = load_model(cfg.policy.model, device=cfg.policy.device)
    model.train()
    optimizer = make_optimizer(model, cfg.update)
    method = get_method(cfg.method)
    predictor = build_predictor(cfg.predictor, method, cfg.seed, warmup)
    summary_path = out / "train_summary.json"
    state = {"step": 0, "accuracy_before": None, "rollouts": 0}
    if resuming:
        step_done, path = found[-1]
        predictor, state = load_checkpoint(path, model, optimizer)
        start = step_done
        print(f"resumed from {path} (step {step_done})", file=sys.stderr)
    ref_model = None
    if cfg.update.kl_coef > 0:
        ref_model, _ = load_model(cfg.policy.model, device=cfg.policy.device)
        ref_model.eval().requires_grad_(False)
    out.mkdir(parents=True, exist_ok=True)
    if config_yaml:
        (out / "config.yaml").write_text(config_yaml)
    if start and (out / "metrics.jsonl").exists():  # records of steps after the checkpoint are redone
        keep = [
            line
            for line in (out / "metrics.jsonl").read_text().splitlines()
            if line.strip() and json.loads(line)["step"] < start
        ]
        (out / "metrics.jsonl").write_text("".join(line + "\n" for line in keep))
    logger = StepLogger(cfg.logger, out, resume=bool(start), run_name=f"{cfg.method}-seed{cfg.seed}")

    params = cfg.policy.sampling(spec.max_new_tokens)
    policy = build_policy(cfg.policy, model=model, tokenizer=tok, seed=cfg.seed)
    backend = policy.backend
    actor = build_actor(policy, spec, params, cfg.engine)
    engine = build_engine(
        actor,
        predictor,
        cfg.budget,
        seed=cfg.seed,
        prefix_share=cfg.predictor.prefix_share,
        executor=make_executor(cfg.executor, cfg.ray),
    )
    held_out = spec.held_out(cfg.eval_tasks, derive_seed(cfg.seed, "held-out"))
    pool = cfg.budget.pool
    advantage = cfg.advantage or method.advantage

    if start == 0:
        model.eval()
        state["accuracy_before"] = evaluate_policy(cfg, actor, held_out, 0)["accuracy"]
        print(f"held-out accuracy before training: {state['accuracy_before']:.3f}", file=sys.stderr)
    record = {}
    try:
        for step in range(start, cfg.steps):
            tasks = spec.train(pool, derive_seed(cfg.seed, "pool", step))
            backend.clear_cache()  # a step never depends on what earlier steps or evaluations left cached
            model.eval()
            result = engine.grow(tasks, method, step)
            rec = step_record(result, seed=cfg.seed)
            t0 = time.perf_counter()
            model.train()
            active = result.active
            stats = update_policy(
                model,
                optimizer,
                active,
                batch_advantages(advantage, active),
                cfg.update,
                ref_model=ref_model,
                temperature=cfg.policy.temperature,  # log-probs of the distribution the rollouts sampled
            )
            model.eval()
            policy.sync_weights()  # the backend samples the new weights; no cached KV of the old ones
            rec.timing_s["update"] = time.perf_counter() - t0
            rec.train.update({k.split("/", 1)[1]: v for k, v in stats.items()})
            state["rollouts"] += result.rollouts
            rec.train["rollouts_total"] = state["rollouts"]
            last = step == cfg.steps - 1
            if (step + 1) % cfg.eval_every == 0 or last:
                t0 = time.perf_counter()
                rec.eval.update(evaluate_policy(cfg, actor, held_out, step + 1))
                rec.timing_s["eval"] = time.perf_counter() - t0
            rec.train["peak_rss_gib"] = _peak_rss_gib()
            record = rec.flat()
            logger.log(record)
            state["step"] = step + 1
            if (step + 1) % cfg.save_every == 0 or last:
                save_checkpoint(out, step + 1, model, tok, optimizer, predictor, state, config_yaml, cfg.keep_last)
    finally:
        logger.close()
        policy.close()
    summary = {
        "method": cfg.method,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "accuracy_before": state.get("accuracy_before"),
        "accuracy_after": record.get("eval/accuracy"),
        "rollouts": state["rollouts"],
        "peak_rss_gib": _peak_rss_gib(),
        "out": str(out),
    }
    summary_path.write_text(json.dumps(summary, indent=2))
    return summary
