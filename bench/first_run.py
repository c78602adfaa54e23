"""The first training run on a GPU: `trace-rl train` on the vLLM backend for two steps, then checks of the run.

    bash bench/first_run.sh --model /models/Qwen2.5-0.5B-Instruct                   # one GPU, bfloat16
    python bench/first_run.py --model random-tiny --backend hf --dtype float32      # the same checks on CPU

It runs `trace-rl train policy.backend=vllm policy.model=MODEL update.dtype=DTYPE steps=2` with every setting a
first run would leave at its default (policy.device=auto, policy.vllm.*: the engine's dtype follows
update.dtype, half the GPU), a small budget and a 64-task evaluation, into a fresh folder (`--out`), and checks:
1. the command exits 0;
2. config.yaml records the device auto resolved to: cuda where torch sees a GPU, else cpu;
3. the first step trained policy tokens, and the sampler agreed with the update: at update.minibatches=1 the
   step's one forward comes before any optimizer step, so `train/approx_kl` (the k3 KL of the sampling policy to
   the update's forward) measures only the sampler/update gap: below KL_TOL[dtype], with `train/clip_frac`
   (tokens whose ratio left [0.8, 1.2]) below CLIP_TOL[dtype];
4. both steps were logged, with a finite held-out accuracy at the end.
Exit 1 on any failed check.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

# the first step's k3 KL of sampler to update: float32 on both sides differs by summation order only (max
# log-prob gap < 0.01 in gpu_smoke's check 2, so k3 ~ gap^2 / 2 < 5e-5); bfloat16 by its rounding (gpu_smoke's
# bound: mean gap < 0.02, 99th percentile < 0.1, so k3 of a few 1e-4)
KL_TOL = {"float32": 1e-4, "bfloat16": 2e-3}
CLIP_TOL = {"float32": 1e-3, "bfloat16": 0.01}  # share of tokens with |log ratio| > ~0.2 before any step


def train_args(model: str, backend: str, dtype: str, out: str, steps: int = 2) -> list[str]:
    return [
        "train",
        f"policy.model={model}",
        f"policy.backend={backend}",
        f"update.dtype={dtype}",
        f"steps={steps}",
        "budget.prompts=8",
        "eval_every=1",
        "eval_tasks=64",
        "eval_samples=1",
        "progress=false",
        "logger=[console,jsonl]",
        f"out={out}",
    ]


def check_run(run: Path, dtype: str, steps: int = 2) -> list[tuple[bool, str]]:
    """(passed, what) for checks 2-4 on a finished run directory."""
    import yaml

    try:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        device = "cpu"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    out = [(cfg["policy"]["device"] == device, f"policy.device=auto recorded as {cfg['policy']['device']!r}")]
    if not recs:
        return [*out, (False, "metrics.jsonl holds no step")]
    first = recs[0]
    kl, clip, tokens = first.get("train/approx_kl"), first.get("train/clip_frac"), first.get("train/policy_tokens")
    out.append((bool(tokens), f"the first step trained {tokens} policy tokens"))
    out.append(
        (
            kl is not None and 0 <= kl < KL_TOL[dtype],
            f"first step: sampler-to-update k3 KL {kl} < {KL_TOL[dtype]} ({dtype} on both sides)",
        )
    )
    out.append((clip is not None and clip < CLIP_TOL[dtype], f"first step: clip_frac {clip} < {CLIP_TOL[dtype]}"))
    acc = recs[-1].get("eval/accuracy")
    out.append((len(recs) == steps, f"{len(recs)} of {steps} steps logged"))
    out.append((acc is not None and math.isfinite(acc), f"held-out accuracy at the end: {acc}"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local model directory, or random-tiny")
    ap.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(KL_TOL), help="update.dtype (and the engine's)")
    ap.add_argument("--out", default="", help="run folder (default: a new temporary one)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="trace-rl-first-run-"))

    from trace_rl.cli import main as trace_rl

    rc = trace_rl(train_args(args.model, args.backend, args.dtype, str(out)))
    checks = [(rc == 0, f"trace-rl train exited {rc} ({out})")]
    if rc == 0:
        checks += check_run(out, args.dtype)
    for ok, what in checks:
        print(f"[{'ok' if ok else 'FAIL'}] {what}")
    failed = [what for ok, what in checks if not ok]
    print("PASS" if not failed else f"FAIL: {len(failed)} check(s)")
    return 1 if failed else 0


if __name__ == "__main__":  # vLLM spawns its engine core: nothing may run at import
    sys.exit(main())
