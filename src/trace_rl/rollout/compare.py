"""`trace-rl rollout`: grow trees with several methods from one frozen policy at equal budget and compare.

No policy update: every method samples from the same model, sees the same candidate pools, and runs the one
TRACE step (`engine`) with the LM actor, so its predictor learns online from its own trees (a fresh predictor
per method), as in training.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..backends.base import SamplingParams
from ..envs.calculator import RL_MIX
from ..envs.registry import ENVS
from ..methods import METHODS, BudgetPlan, get_method
from ..predictors import training_examples
from ..predictors.diagnostics import node_records
from ..seeding import derive_rng, derive_seed
from ..tree import load_trees, save_trees
from .engine import EXECUTORS, TreeRolloutEngine, make_executor
from .lm_actor import BATCHING, LMActor
from .ray_executor import RayConfig
from .records import MetricsWriter, step_record


def check_device(device: str) -> None:
    """A torch device that exists here, or one line saying what is available."""
    if device == "cpu":
        return
    try:
        import torch
    except ImportError:
        raise ValueError(f"device: {device!r} needs torch (pip install 'trace-rl[lm]')") from None
    kind = device.split(":")[0]
    ok = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}.get(kind)
    if ok is None:
        raise ValueError(f"device must be cpu, cuda, cuda:N or mps, got {device!r}")
    if not ok:
        raise ValueError(f"device: {device!r} is not available on this machine (use device=cpu)")


@dataclass
class LMPolicyConfig:
    """The policy model and how it samples."""

    model: str = "tiny"  # 'tiny' (after trace-rl sft), 'random-tiny', 'smollm2-135m', a local path or a hub id
    device: str = "cpu"  # torch device of the policy, e.g. cuda
    temperature: float = 1.0  # sampling temperature (0 = greedy)
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    max_new_tokens: int = 0  # cap on tokens per turn (0: the environment's default)

    def __post_init__(self):
        SamplingParams(self.temperature, self.top_p, max(self.max_new_tokens, 1))  # one place checks these
        check_device(self.device)
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0 (0: the environment's default), got {self.max_new_tokens}")

    def sampling(self, env_default: int) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens or env_default)


@dataclass
class LMPredictorConfig:
    """The success predictor V~ that every method's allocator reads."""

    kind: str = "light"  # 'light' (hashed n-grams + logistic, CPU) or an LM critic backbone (name, path, hub id)
    prefix_share: float = 0.5  # share of prefix examples in a predictor batch
    warmup: str = ""  # trees file to fit every predictor on before step 1 (e.g. the sft report's trees)
    critic_lr: float = 3e-3  # learning rate of the LM critic's head
    critic_epochs: int = 4  # passes of the LM critic over each step's examples

    def __post_init__(self):
        if not 0.0 <= self.prefix_share < 1.0:
            raise ValueError(f"prefix_share must be in [0, 1), got {self.prefix_share}")
        if self.warmup and not Path(self.warmup).is_file():
            raise ValueError(
                f"warmup: no file {self.warmup} (trace-rl sft writes sft_eval_trees.jsonl beside the "
                "model; save_trees=true writes trees_<method>.jsonl)"
            )
        if self.kind != "light":
            from ..lm.models import MINILM, SMOLLM2

            if self.kind not in (MINILM, SMOLLM2) and not Path(self.kind).exists() and self.kind.count("/") != 1:
                raise ValueError(
                    f"kind: {self.kind!r} is not 'light', {MINILM}, {SMOLLM2}, an existing path or a hub id (org/name)"
                )
        if not self.critic_lr > 0 or self.critic_epochs < 1:
            raise ValueError("critic_lr must be > 0 and critic_epochs >= 1")


@dataclass
class LMEnvConfig:
    """Which environment the agent acts in, and its task mix."""

    name: str = "calculator"  # calculator | math | qa | bfcl
    chain_steps: list[int] = field(default_factory=lambda: list(RL_MIX["steps"]))  # calculator: chain lengths
    digits: list[int] = field(default_factory=lambda: list(RL_MIX["digits"]))  # calculator: number sizes
    corpus: str = ""  # qa: a passage corpus file (default: the offline corpora with their own questions)
    retriever_url: str = ""  # qa: a running /retrieve server (Search-R1 compatible)

    def __post_init__(self):
        if self.name not in ENVS:
            raise ValueError(f"name: unknown env {self.name!r}; choose from {', '.join(ENVS)}")
        if not self.chain_steps or not all(1 <= s <= 8 for s in self.chain_steps):
            raise ValueError(f"chain_steps must be integers in 1..8, got {self.chain_steps}")
        if not self.digits or not all(1 <= d <= 3 for d in self.digits):
            raise ValueError(f"digits must be integers in 1..3, got {self.digits}")

    def spec(self):
        from ..envs.registry import get_env

        mix = {"steps": tuple(self.chain_steps), "digits": tuple(self.digits)}
        return get_env(
            self.name, corpus=self.corpus or None, retriever_url=self.retriever_url or None, calculator_mix=mix
        )


@dataclass
class EngineConfig:
    """How the step's prompts share the model and the environment threads."""

    batching: str = "round"  # round: reproducible batches | eager: no prompt waits for another's tool call
    env_workers: int = 8  # threads that run environment steps off the event loop

    def __post_init__(self):
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {', '.join(BATCHING)}, got {self.batching!r}")
        if self.env_workers < 1:
            raise ValueError(f"env_workers must be >= 1, got {self.env_workers}")


@dataclass
class RolloutConfig:
    """`trace-rl rollout`: methods compared on LM agents' trees from one frozen policy."""

    out: str = "runs/rollout"  # run directory: config.yaml, metrics.jsonl, summary, plots, trees
    seed: int = 0  # one seed reproduces the run (pools, samples, predictor)
    steps: int = 10  # candidate pools to grow trees on (the predictor learns online)
    methods: list[str] = field(default_factory=lambda: ["grpo", "pcl", "treepo", "trace_root_only", "trace"])
    save_trees: bool = False  # write every method's trees (token ids, masks, log-probs, rewards) to trees_<m>.jsonl
    progress: bool = True  # a progress line on stderr
    executor: str = "local"  # where prompt trees grow: local (asyncio in this process) or ray (Ray workers)
    ray: RayConfig = field(default_factory=RayConfig)  # the Ray cluster, with executor=ray
    budget: BudgetPlan = field(default_factory=BudgetPlan)  # rollouts per step and how tree methods split them
    policy: LMPolicyConfig = field(default_factory=LMPolicyConfig)
    predictor: LMPredictorConfig = field(default_factory=LMPredictorConfig)
    env: LMEnvConfig = field(default_factory=LMEnvConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self):
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ValueError(
                f"methods: unknown {unknown or 'none given'}; choose from "
                f"{', '.join(m for m in METHODS if METHODS[m].predictor != 'oracle')}"
            )
        oracle = [m for m in self.methods if METHODS[m].predictor == "oracle"]
        if oracle:
            raise ValueError(f"methods: {oracle} need the exact V that only the testbed has (trace-rl simulate)")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not self.out:
            raise ValueError("out must be a directory path, got an empty string")


def make_predictor(cfg: RolloutConfig, method, warmup: list):
    """A fresh predictor for one method: reward history for Knapsack RL, else the configured V~."""
    from ..predictors.history import RewardHistoryPredictor
    from ..predictors.text import light_text_predictor

    if method.predictor == "history":
        pred = RewardHistoryPredictor()
    elif cfg.predictor.kind == "light":
        pred = light_text_predictor(seed=cfg.seed)
    else:
        from ..predictors.lm_critic import LMCritic

        pred = LMCritic(
            cfg.predictor.kind, lr=cfg.predictor.critic_lr, epochs=cfg.predictor.critic_epochs, seed=cfg.seed
        )
    if warmup:  # every method's predictor sees the same trees before step 1
        pred.update(*training_examples(warmup, cfg.predictor.prefix_share, derive_rng(cfg.seed, "warmup")))
    return pred


def run_rollout(cfg: RolloutConfig) -> dict[str, list[dict]]:
    """Every method over the same pools; returns the flat records by method and writes them under cfg.out."""
    from ..backends.hf import HFBackend

    out = Path(cfg.out)
    spec = cfg.env.spec()
    warmup = load_trees(cfg.predictor.warmup) if cfg.predictor.warmup else []
    if cfg.predictor.warmup and not warmup:
        raise ValueError(f"warmup: {cfg.predictor.warmup} holds no trees")
    if warmup:
        print(
            f"predictor warm-up: {len(warmup)} trees, {sum(len(t.rewards()) for t in warmup)} rollouts from "
            f"{cfg.predictor.warmup} (spent before this run, not counted in its budget)"
        )
    backend = HFBackend.load(cfg.policy.model, device=cfg.policy.device)
    params = cfg.policy.sampling(spec.max_new_tokens)
    tasks = spec.train(cfg.budget.pool * cfg.steps, derive_seed(cfg.seed, "pools"))
    pools = [tasks[i * cfg.budget.pool : (i + 1) * cfg.budget.pool] for i in range(cfg.steps)]
    writer, preds = MetricsWriter(out / "metrics.jsonl"), MetricsWriter(out / "predictions.jsonl")
    for name in cfg.methods:
        (out / f"trees_{name}.jsonl").unlink(missing_ok=True)
    # The model, tokenizer and imports never die: keep them out of the collector's scans (full collections
    # took a few % of a tiny-model run's wall-clock and made the overhead figure jumpy).
    gc.freeze()
    results: dict[str, list[dict]] = {}
    executor = make_executor(cfg.executor, cfg.ray)
    try:
        for name in cfg.methods:
            method = get_method(name)
            actor = LMActor(backend, spec.make, params, cfg.engine.batching, cfg.engine.env_workers)
            engine = TreeRolloutEngine(
                actor,
                make_predictor(cfg, method, warmup),
                cfg.budget,
                seed=cfg.seed,
                prefix_share=cfg.predictor.prefix_share,
                executor=executor,
            )
            records = results.setdefault(name, [])
            for step, pool in enumerate(pools):
                result = engine.grow(pool, method, step)
                record = step_record(result, seed=cfg.seed).flat()
                records.append(record)
                writer.write(record)
                for rec in node_records(result.active):
                    preds.write({"method": name, "step": step, **rec})
                if cfg.save_trees:
                    save_trees(
                        out / f"trees_{name}.jsonl", result.active, append=True, extra={"method": name, "step": step}
                    )
                if cfg.progress:
                    er = sum(r["rollout/effective_ratio"] for r in records) / len(records)
                    tokens = sum(r["rollout/generated_tokens"] for r in records)
                    print(
                        f"\r{name:<18} step {step + 1}/{cfg.steps}  effective ratio (running mean) {er:.3f}  "
                        f"tokens {tokens:,}",
                        end="",
                        file=sys.stderr,
                        flush=True,
                    )
            if cfg.progress:
                print(file=sys.stderr)
    finally:
        gc.unfreeze()  # a caller that runs main() again (the tests) gets its garbage collected as before
    return results
