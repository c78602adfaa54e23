"""The compute dtype of the policy's forwards, shared by whatever samples (the HF backend) and the update.

`float32` runs the model as stored. `bfloat16` keeps the weights (and AdamW's state) in float32, the master copy
the optimizer steps, and runs each forward under `torch.autocast` in bfloat16: the matmuls see the weights
rounded to bfloat16, as a vLLM engine with dtype=bfloat16 holds them. The PPO ratio divides the update's
probability of a token by the sampler's, so both must come from one dtype: a float32 update of bfloat16 samples
starts every step at a ratio off 1 by the rounding (train refuses that mismatch, `TrainConfig`).
"""

from __future__ import annotations

import contextlib

DTYPES = ("float32", "bfloat16")


def check_dtype(key: str, value: str) -> None:
    """One line naming `key` unless `value` is a compute dtype."""
    if value not in DTYPES:
        raise ValueError(f"{key} must be one of {', '.join(DTYPES)}, got {value!r}")


def compute_context(dtype: str, device) -> contextlib.AbstractContextManager:
    """The context a forward runs under for `dtype` on `device` (a torch.device or its name)."""
    if dtype == "float32":
        return contextlib.nullcontext()
    import torch

    kind = device.type if hasattr(device, "type") else str(device).split(":")[0]
    return torch.autocast(device_type=kind, dtype=getattr(torch, dtype))
