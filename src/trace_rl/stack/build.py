"""The one builder of the LM stack: env spec, policy (model, tokenizer, the backend that samples it; the reference
model), predictor, actor and TRACE engine, from the shared settings groups (`stack.config`). `build_stack` is
what the LM commands (`train`, and `compare` through it; `eval`; `rollout`) call: it loads the model a command
trains and its frozen reference, starts the backend and the executor, and makes engines (`LMStack.engine`), which
both grow a step's trees and evaluate (`TreeRolloutEngine.evaluate`). `sft`'s report builds from the parts
below (`build_policy`, `build_actor`), so a backend, an env option or a predictor setting means the same in
every command.

Backends (`policy.backend`):
- `hf`: transformers in this process. With a model the command trains, the backend samples from that very
  object, so a weight sync after an update only drops caches and bumps the version.
- `vllm`: a vLLM engine launched on the model's files. With a trained model, every sync (and the build itself,
  so a resumed run starts from its checkpoint) pushes the torch model's state dict into the engine.
- `server`: an OpenAI-compatible server that serves `policy.model` (token ids in and out); the tokenizer is
  loaded here. The server's weights cannot be changed from here, so `train` refuses it (its config check)
  and `rollout`/`eval` use it as a frozen policy.
`PolicyStack.sync_weights()` is the one weight-sync call; the trainer makes it after every update.
`probe_policy` holds the policy's probes (server, model), which the command line runs once per command; the
predictor comes from the one predictor builder, `predictors.build.build_predictor` (re-exported here).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..backends.base import PolicyBackend, SamplingParams
from ..envs.registry import EnvSpec
from ..errors import ConfigError
from ..methods import BudgetPlan
from ..predictors.build import build_predictor  # noqa: F401 - the one predictor builder; the commands import it here
from ..rollout.engine import TreeRolloutEngine, make_executor
from ..rollout.lm_actor import LMActor
from ..trace_config import TraceConfig
from .config import EngineConfig, LMPolicyConfig, RayConfig, served_models
from .env_config import LMEnvConfig


def build_env(cfg: LMEnvConfig) -> EnvSpec:
    """The spec of the chosen env under its settings (`env.<name>.*`). A built-in names its key in one line for a
    setting that cannot work here (a corpus that does not parse, a retriever that does not answer, a strict
    sandbox that cannot run), raised before any model is loaded."""
    return cfg.plugin().spec(cfg.settings())


@dataclass
class PolicyStack:
    """The policy as the commands use it: the backend that samples, and (when a command trains or reports on a
    model it holds) the torch model and its tokenizer."""

    backend: PolicyBackend
    tokenizer: Any
    model: Any = None  # the torch model this process updates (train, sft), or None
    shares_model: bool = True  # the backend samples from `model` itself (hf), so a sync moves no weights

    def sync_weights(self) -> int:
        """After the model changed: the backend samples from the new weights and serves no cache of the old."""
        if self.model is None or self.shares_model:
            return self.backend.update_weights()
        return self.backend.update_weights(self.model.state_dict())

    def close(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


def probe_policy(cfg: LMPolicyConfig) -> None:
    """The policy's probes, run once when a command starts (the settings themselves are plain data): with
    backend=server, a short request to /v1/models (the server answers and serves `model`); the model can load
    here (`lm.models.check_model`: local, cached, or a hub that answers). One line naming the key otherwise."""
    from ..lm.models import check_model

    if cfg.backend == "server":
        try:
            served = served_models(cfg.server_url)
        except ValueError as err:
            raise ConfigError(f"policy.{err}") from None
        if served and cfg.model not in served:
            raise ConfigError(f"policy.model: the server at {cfg.server_url} serves {served}, not {cfg.model!r}")
    try:
        check_model(cfg.model, weights=cfg.backend != "server")
    except ValueError as err:
        raise ConfigError(f"policy.{err}") from None


def engine_memory_share(device: str, model: Any, ref_model: Any, engine_dtype: str, memory: dict | None) -> float:
    """vLLM's `gpu_memory_utilization` beside the torch model this process trains (`backends.vllm_memory`): what the
    GPU holds after the trainer's estimated footprint; CAP without a trained model; one line when the engine cannot
    fit. `memory`: `trainer_footprint`'s settings (micro_batch_tokens, step_copy)."""
    from ..backends import vllm_memory as vm

    if model is None:
        return vm.CAP
    import torch

    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    trainer = vm.trainer_footprint(model, ref_model, **(memory or {}))
    try:
        return vm.engine_share(total, trainer, vm.engine_min_bytes(vm.model_sizes(model)[0], engine_dtype))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def build_policy(
    cfg: LMPolicyConfig,
    model: Any = None,
    tokenizer: Any = None,
    seed: int = 0,
    dtype: str | None = None,
    ref_model: Any = None,
    memory: dict | None = None,
) -> PolicyStack:
    """The backend of `cfg.backend` for `cfg.model`; with `model` and `tokenizer` (a torch model this process
    trains), the backend samples that model's weights (hf: the object itself; vllm: pushed into the engine).
    `dtype`: the update's compute dtype (train's update.dtype), which the backend then samples in, so the first
    PPO ratio of a step is 1 (hf: its forwards under the same autocast; vllm: the engine's dtype). With vllm on a
    GPU and `policy.vllm.gpu_memory_utilization=0`, the engine's share is computed (`engine_memory_share`) from
    `model`, `ref_model` and `memory`."""
    from ..lm.models import RANDOM_TINY, resolve_model_path

    if cfg.backend == "hf":
        from ..backends.hf import HFBackend

        compute = dtype or "float32"
        if model is not None:
            backend = HFBackend(model, tokenizer, compute_dtype=compute)
        else:
            backend = HFBackend.load(cfg.model, device=cfg.device, compute_dtype=compute)
        return PolicyStack(backend, backend.tokenizer, model, shares_model=True)
    if cfg.backend == "vllm":
        from ..backends.vllm import VLLMBackend

        if cfg.model == RANDOM_TINY:
            raise ConfigError("policy.model: random-tiny has no files for vLLM to load; use backend=hf or a model path")
        from vllm.platforms import current_platform

        path = resolve_model_path(cfg.model)
        kwargs = cfg.vllm.engine_kwargs(current_platform.is_cpu(), dtype)  # one line naming a refused setting
        if not current_platform.is_cpu() and "gpu_memory_utilization" not in kwargs:
            engine_dtype = kwargs.get("dtype", "bfloat16")
            kwargs["gpu_memory_utilization"] = engine_memory_share(cfg.device, model, ref_model, engine_dtype, memory)
            print(f"trace-rl: vLLM takes {kwargs['gpu_memory_utilization']:.2f} of the GPU", file=sys.stderr)
        backend = VLLMBackend.launch(path, tokenizer=tokenizer, seed=seed, **kwargs)
        stack = PolicyStack(backend, backend.tokenizer, model, shares_model=False)
        if model is not None:
            stack.sync_weights()  # a resumed run's model differs from the files the engine loaded
        return stack
    if cfg.backend == "server":
        from ..backends.openai_server import OpenAIServerBackend
        from ..lm.models import load_tokenizer

        if model is not None:
            raise ConfigError("policy.backend: a server's weights cannot be updated from here; train with hf or vllm")
        tok = tokenizer or load_tokenizer(cfg.model)
        backend = OpenAIServerBackend(cfg.server_url, cfg.model, tok, timeout=cfg.server_timeout)
        try:  # one request: a server without token ids in and out is refused here, in one line
            backend.probe()
        except ValueError as err:
            backend.close()
            raise ConfigError(f"policy.server_url: {err}") from None
        return PolicyStack(backend, tok, None, shares_model=False)
    raise ConfigError(f"policy.backend: unknown {cfg.backend!r}")


def build_actor(policy: PolicyStack, spec: EnvSpec, params: SamplingParams, engine: EngineConfig) -> LMActor:
    """The LM agent as the TRACE step's actor (also held-out evaluation's, through the engine's `evaluate`)."""
    return LMActor(policy.backend, spec.make, params, engine.batching, engine.env_workers)


def build_engine(
    actor: LMActor,
    predictor,
    config: TraceConfig | None,
    *,
    seed: int,
    plan: BudgetPlan | None = None,
    executor=None,
) -> TreeRolloutEngine:
    """The one TRACE step around `actor` and `predictor` as TRACE's configuration `config` says
    (`TreeRolloutEngine.from_config`: its budget, or `plan`; its prefix share and calibration layers); trees grow
    on `executor` (one from `rollout.engine.make_executor`, shared by every engine of a run; None: asyncio in this
    process). With no configuration, an engine that only evaluates (no predictor, no budget)."""
    if config is None:
        return TreeRolloutEngine(actor, predictor, plan, seed=seed, executor=executor)
    return TreeRolloutEngine.from_config(actor, predictor, config, seed=seed, plan=plan, executor=executor)


@dataclass
class LMStack:
    """What an LM command runs on: the env spec, the policy (its backend; the model and tokenizer when this
    process trains them), the frozen reference model (train with update.kl_coef > 0), the sampling parameters,
    the executor trees grow on, and the engine settings."""

    spec: EnvSpec
    policy: PolicyStack
    params: SamplingParams
    engine_config: EngineConfig
    seed: int
    executor: Any = None
    ref_model: Any = None

    @property
    def model(self) -> Any:
        return self.policy.model

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    @property
    def backend(self) -> PolicyBackend:
        return self.policy.backend

    def engine(
        self, predictor=None, config: TraceConfig | None = None, *, plan: BudgetPlan | None = None
    ) -> TreeRolloutEngine:
        """A TRACE engine on a fresh actor of this policy (one per method of `rollout`): it grows trees with
        `predictor` as TRACE's configuration `config` says (`build_engine`) on the stack's executor, and evaluates
        (`evaluate`); without a configuration it only evaluates (`eval`)."""
        actor = build_actor(self.policy, self.spec, self.params, self.engine_config)
        return build_engine(actor, predictor, config, seed=self.seed, plan=plan, executor=self.executor)

    def close(self) -> None:
        self.policy.close()


def build_stack(
    policy: LMPolicyConfig,
    spec: EnvSpec,
    engine: EngineConfig | None = None,
    *,
    seed: int = 0,
    train: bool = False,
    reference: bool = False,
    dtype: str | None = None,
    prepare: Callable[[Any], None] | None = None,
    executor: str = "local",
    ray: RayConfig | None = None,
    memory: dict | None = None,
) -> LMStack:
    """The LM stack of a command. `train`: the model is loaded here, after `torch.manual_seed(seed)`, for this
    process to update; `prepare(model)` then runs on it before anything else loads (a trainer's LoRA adapters
    and optimizer, a resumed checkpoint's weights, which a vLLM engine must start from); `reference` adds a
    frozen copy of the start model (the KL term's). The backend (`build_policy`) samples that model in `dtype`;
    without `train`, it loads the policy itself (or reaches a server). `executor`: where trees grow
    (`rollout.engine.make_executor`), one for every engine of the stack. `memory`: the trainer's settings that
    size its GPU footprint (`backends.vllm_memory.trainer_footprint`), for a vLLM engine's computed share."""
    model = tok = ref_model = None
    if train:
        import torch

        from ..lm.models import load_model

        torch.manual_seed(seed)
        model, tok = load_model(policy.model, device=policy.device)
        if prepare is not None:
            prepare(model)
    if reference:
        from ..lm.models import load_model

        ref_model, _ = load_model(policy.model, device=policy.device)
        ref_model.eval().requires_grad_(False)
    stack = build_policy(policy, model=model, tokenizer=tok, seed=seed, dtype=dtype, ref_model=ref_model, memory=memory)
    params = policy.sampling(spec.max_new_tokens)
    return LMStack(
        spec,
        stack,
        params,
        engine or EngineConfig(),
        seed,
        executor=make_executor(executor, ray),
        ref_model=ref_model,
    )
