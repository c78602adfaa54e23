"""The training checks of bench/gpu_check.py: `trace-rl train` for one step with a checkpoint, then resumed for a
second, in one dtype, and what the run must show.

The run is `trace-rl train policy.model=MODEL policy.backend=BACKEND update.dtype=DTYPE` with every other setting a
first run leaves at its default (`policy.device=auto`, `update.minibatches=1`, `policy.vllm.*`), a small budget and
evaluation, `save_every=1`; then the same command with `steps=2 resume=true`. Checks, each with its tolerance:
1. both commands exit 0;
2. config.yaml records the device auto resolved to: cuda where torch sees a GPU, else cpu;
3. every step trained policy tokens, and its sampler agreed with its update: at update.minibatches=1 the step's one
   forward comes before any optimizer step, so `train/approx_kl` (the k3 KL of the sampling policy to the update's
   forward) measures only the sampler/update gap: at least -KL_FLOOR (the k3 estimator is >= 0 in exact arithmetic;
   float32 rounding gave -2.2e-10 on a correct run, so anything from -1e-6 up reads as zero) and below KL_TOL[dtype],
   with `train/clip_frac` (tokens whose ratio left [0.8, 1.2]) below CLIP_TOL[dtype]; `train/kl` and `update_kl`
   finite;
4. the checkpoint: global_step_1 was written whole (its manifest), the second command resumed from it (step 1's
   metrics record is unchanged, step 2's is new) and wrote global_step_2, with a finite held-out accuracy at the end.
Figures: generation tokens/s (generated tokens over the generate phase of both steps), update tokens/s (tokens run
through the model over the update phase, its KL forward included), and peak GPU memory (torch's allocator).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

# the sampler-to-update k3 KL of a step: float32 on both sides differs by summation order only (log-prob gaps under
# 1e-2, so k3 ~ gap^2 / 2 < 5e-5); bfloat16 by its rounding (gaps of a few 1e-2, so k3 of a few 1e-4)
KL_TOL = {"float32": 1e-4, "bfloat16": 2e-3}
KL_FLOOR = 1e-6  # a KL from -KL_FLOOR up is zero: k3 >= 0 exactly, rounding can give a hair below
CLIP_TOL = {"float32": 1e-3, "bfloat16": 0.01}  # share of tokens with |log ratio| > ~0.2 before any step
# the run's size: on a GPU one step is 64 rollouts (8 prompts) and a 64-task evaluation; the CPU dry mode shrinks
# both to seconds
SIZES = {
    "cuda": ["budget.prompts=8", "eval_tasks=64"],
    "cpu": [
        "budget.prompts=2",
        "budget.rollouts_per_prompt=2",
        "budget.pool_factor=2",
        "budget.max_per_prompt=2",
        "policy.max_new_tokens=12",
        "eval_tasks=2",
    ],
}


def train_args(model: str, backend: str, dtype: str, out: str, size: str, steps: int = 1) -> list[str]:
    """The `trace-rl train` arguments of the check's run (`steps=2 resume=true` added for its second half)."""
    return [
        "train",
        f"policy.model={model}",
        f"policy.backend={backend}",
        f"update.dtype={dtype}",
        f"steps={steps}",
        *SIZES[size],
        "eval_every=1",
        "eval_samples=1",
        "save_every=1",
        "progress=false",
        "logger=[console,jsonl]",
        f"out={out}",
    ]


def records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def kl_agrees(kl, dtype: str) -> bool:
    """The sampler-to-update KL within its tolerance: -KL_FLOOR <= kl < KL_TOL[dtype] (rounding below zero is zero)."""
    return _finite(kl) and -KL_FLOOR <= kl < KL_TOL[dtype]


def step_checks(rec: dict, dtype: str) -> list[tuple[bool, str, object, str]]:
    """(passed, check, measured, tolerance) for one step's record: policy tokens, sampler/update agreement, finite
    KLs."""
    step = rec.get("step")
    kl, clip, tokens = rec.get("train/approx_kl"), rec.get("train/clip_frac"), rec.get("train/policy_tokens")
    ref_kl, update_kl = rec.get("train/kl"), rec.get("train/update_kl")
    return [
        (bool(tokens), f"step {step}: policy tokens trained", tokens, "> 0"),
        (
            kl_agrees(kl, dtype),
            f"step {step}: sampler-to-update k3 KL ({dtype})",
            kl,
            f"{-KL_FLOOR:g} <= KL < {KL_TOL[dtype]:g}",
        ),
        (_finite(clip) and clip < CLIP_TOL[dtype], f"step {step}: clip_frac ({dtype})", clip, f"< {CLIP_TOL[dtype]:g}"),
        (
            _finite(ref_kl) and _finite(update_kl),
            f"step {step}: KL to reference and update KL finite",
            update_kl,
            "finite",
        ),  # fmt: skip
    ]


def check_run(run: Path, dtype: str, device: str, steps: int = 2) -> list[tuple[bool, str, object, str]]:
    """(passed, check, measured, tolerance) for checks 2-3 and the end of 4 on a finished run directory."""
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    recorded = cfg["policy"]["device"]
    out = [(recorded == device, "policy.device=auto resolved to this device", recorded, f"== {device}")]
    recs = records(run)
    if not recs:
        return [*out, (False, "metrics.jsonl holds a step", 0, ">= 1 record")]
    for rec in recs:
        out += step_checks(rec, dtype)
    acc = recs[-1].get("eval/accuracy")
    out.append((len(recs) == steps, "steps logged", len(recs), f"== {steps}"))
    out.append((_finite(acc), "held-out accuracy at the end", acc, "finite"))
    return out


def figures(recs: list[dict]) -> dict:
    """Generation and update tokens/s over the run's steps (None where a phase took no time)."""
    total = lambda key: sum(float(r.get(key) or 0.0) for r in recs)
    gen_s, upd_s = total("timing_s/generate"), total("timing_s/update")
    return {
        "generated_tokens": total("rollout/generated_tokens"),
        "generate_tokens_per_s": total("rollout/generated_tokens") / gen_s if gen_s > 0 else None,
        "update_tokens": total("train/encoded_tokens"),
        "update_tokens_per_s": total("train/encoded_tokens") / upd_s if upd_s > 0 else None,
    }


def _peak_gib(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.max_memory_allocated() / 2**30


def run_dtype(model: str, backend: str, dtype: str, out: Path, device: str) -> tuple[list[dict], dict]:
    """Step 1 with a checkpoint, then resumed to step 2, in `dtype`: (rows, figures). Runs `trace-rl train` in this
    process (its exit code is the command's)."""
    from trace_rl.cli import main as trace_rl

    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()
    rows: list[dict] = []

    def add(passed: bool, check: str, value, tolerance: str, seconds: float = 0.0) -> None:
        rows.append({"check": f"train {dtype}: {check}", "passed": bool(passed), "value": value,
                     "tolerance": tolerance, "seconds": seconds})  # fmt: skip

    size = "cuda" if device.startswith("cuda") else "cpu"
    t0 = time.perf_counter()
    rc = trace_rl(train_args(model, backend, dtype, str(out), size, steps=1))
    add(rc == 0, "trace-rl train steps=1 exit code", rc, "== 0", time.perf_counter() - t0)
    first = records(out)[:1]
    ckpt = out / "global_step_1" / "manifest.json"
    add(ckpt.is_file(), "checkpoint global_step_1 written whole", ckpt.is_file(), "manifest.json present")
    if rc != 0 or not first:
        return rows, {"peak_gpu_gib": _peak_gib(device)}
    t0 = time.perf_counter()
    rc = trace_rl([*train_args(model, backend, dtype, str(out), size, steps=2), "resume=true"])
    add(rc == 0, "trace-rl train steps=2 resume=true exit code", rc, "== 0", time.perf_counter() - t0)
    recs = records(out)
    # records count steps from 0: the first command's record must come back untouched, the resumed one's follow it
    resumed = len(recs) == 2 and recs[0] == first[0] and recs[1].get("step") == recs[0].get("step", -9) + 1
    add(resumed, "resumed from global_step_1 (first record kept, one new)", [r.get("step") for r in recs], "[0, 1]")
    second = (out / "global_step_2" / "manifest.json").is_file()
    add(second, "checkpoint global_step_2 written whole", second, "manifest.json present")
    if rc == 0:
        for passed, check, value, tol in check_run(out, dtype, "cuda" if size == "cuda" else "cpu"):
            add(passed, check, value, tol)
    return rows, {**figures(recs), "peak_gpu_gib": _peak_gib(device)}
