"""vLLM's share of the GPU (`gpu_memory_utilization`) computed from what the torch side of the same process must hold
there, instead of a fixed split: pure arithmetic on sizes (no torch, no vLLM), so it is tested on any machine.

What `train`'s torch side holds on the GPU, P parameters of which T are trainable (all of them without LoRA):
- the weights, float32 (update.dtype=bfloat16 runs under autocast over float32 master weights): 4 B x P;
- their gradients, float32: 4 B x T; AdamW's two moments, float32: 8 B x T;
- the step-KL bound's copy of the trainable parameters (update.max_update_kl > 0, the default): 4 B x T;
- the frozen reference model (update.kl_coef > 0): 4 B x P;
- one micro-batch's activations (update.micro_batch_tokens tokens), estimated, not measured: per token and layer
  64 x hidden bytes (the float32 inputs a Llama block keeps for its backward: attention's q, k, v and output, two
  norms, the MLP's gate, up and activation at ~2.7x hidden, with room), plus 12 x vocab bytes per token for the
  LM head's float32 logits, their log-softmax and its gradient.
So an fp32 trainer with AdamW costs 20 B a parameter before activations (16 without the bound's copy), and half of an
80 GB GPU, the old fixed split, held it up to about 2 billion parameters.

The engine needs at least its weights in its dtype, a KV cache (ENGINE_KV_MIN) and its own working memory
(ENGINE_OVERHEAD: CUDA graphs, sampler, activations of a batch); RESERVE is left for the two processes' CUDA
contexts and the allocators' fragmentation. The share is what remains of the GPU after the trainer and the reserve,
capped at vLLM's own default (0.9), and refused in one line when the engine's minimum does not fit. These figures
are estimates written before any GPU run (docs/engines.md); `policy.vllm.gpu_memory_utilization` set by hand wins.
"""

from __future__ import annotations

from typing import Any

GIB = 2**30
ENGINE_KV_MIN = 1 * GIB  # a KV cache a first run can sample in (the tiny model's 128 sequences at full context)
ENGINE_OVERHEAD = 1 * GIB
RESERVE = 2 * GIB
CAP = 0.9  # vLLM's own default share
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def activation_bytes(tokens: int, hidden: int, layers: int, vocab: int) -> int:
    """The estimate above of one micro-batch's activations (float32 bounds bfloat16's)."""
    return tokens * (64 * hidden * layers + 12 * vocab)


def trainer_bytes(
    params: int, trainable: int, *, reference_params: int = 0, step_copy: bool = True, activations: int = 0
) -> int:
    """Bytes the torch side of `train` holds on the GPU (the list above)."""
    if min(params, trainable, reference_params, activations) < 0 or trainable > params:
        raise ValueError(f"sizes must be >= 0 with trainable <= params, got {params}, {trainable}")
    per_trainable = 4 + 8 + (4 if step_copy else 0)  # gradients, AdamW moments, the bound's copy
    return 4 * params + per_trainable * trainable + 4 * reference_params + activations


def engine_min_bytes(params: int, dtype: str) -> int:
    """The least the engine can run in: its weights in `dtype`, ENGINE_KV_MIN and ENGINE_OVERHEAD."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    return DTYPE_BYTES[dtype] * params + ENGINE_KV_MIN + ENGINE_OVERHEAD


def engine_share(total: int, trainer: int, engine_min: int, reserve: int = RESERVE, cap: float = CAP) -> float:
    """The engine's `gpu_memory_utilization` on a GPU of `total` bytes beside a trainer of `trainer` bytes: what is
    left after the trainer and `reserve`, as a share of `total` rounded down to 0.01 and at most `cap`; ValueError
    (one line naming the setting) when that is less than `engine_min`."""
    if total <= 0:
        raise ValueError(f"total GPU memory must be > 0, got {total}")
    left = total - trainer - reserve
    if left < engine_min:
        raise ValueError(
            f"policy.vllm.gpu_memory_utilization: the trainer needs {trainer / GIB:.1f} GiB (weights, gradients, "
            f"AdamW, activations) and the engine at least {engine_min / GIB:.1f} GiB of this GPU's "
            f"{total / GIB:.1f} GiB ({reserve / GIB:.0f} GiB reserved); train LoRA adapters (update.lora_rank), lower "
            "update.micro_batch_tokens, use a larger GPU, or set policy.vllm.gpu_memory_utilization by hand"
        )
    return min(cap, int(left / total * 100) / 100)


def model_sizes(model: Any) -> tuple[int, int]:
    """(parameters, trainable parameters) of a torch module."""
    params = trainable = 0
    for p in model.parameters():
        params += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return params, trainable


def trainer_footprint(model: Any, ref_model: Any = None, micro_batch_tokens: int = 4096, step_copy: bool = True) -> int:
    """`trainer_bytes` of a loaded model (its optimizer's trainable parameters already marked), the reference model
    when there is one, and the activation estimate from the model's config."""
    params, trainable = model_sizes(model)
    ref = model_sizes(ref_model)[0] if ref_model is not None else 0
    cfg = model.config
    acts = activation_bytes(micro_batch_tokens, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size)
    return trainer_bytes(params, trainable, reference_params=ref, step_copy=step_copy, activations=acts)
