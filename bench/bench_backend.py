"""Backend and engine figures: the HF backend's tokens/s, its prefix-KV reuse for branching, and the engine's own
overhead in one TRACE rollout step. Prints measured figures, asserts nothing.

    python bench/bench_backend.py                       # the tiny CPU policy (shipped), else random-tiny
    python bench/bench_backend.py --model smollm2-135m
    python bench/bench_backend.py --quick --model random-tiny   # every figure at a small size, in seconds

Goals (issue 3): zero prefix tokens recomputed from a warm prefix cache; KV reuse >= 1.5x faster than
re-encoding at a 400-token prefix and >= 3x at 1,600 on SmolLM2 on CPU; engine overhead <= 1% of a rollout step.
The step is built as `trace-rl rollout` builds it (`stack.build`: calculator env, LM actor, light predictor,
engine). `--quick` shrinks every size, so its ratios say little; it is what tests/bench runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trace_rl.backends.base import SamplingParams
from trace_rl.errors import UserError
from trace_rl.methods import BudgetPlan, get_method
from trace_rl.stack.build import build_actor, build_engine, build_env, build_predictor
from trace_rl.stack.config import EngineConfig, LMEnvConfig, LMPredictorConfig
from trace_rl.trace_config import TraceConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_policy import load_policy


@dataclass(frozen=True)
class Sizes:
    new_tokens: int  # tokens per row in the generate and KV-reuse figures (eos ignored, so exactly this many)
    batches: tuple[int, ...]  # batch sizes of the throughput figure
    prefixes: tuple[int, ...]  # prefix lengths of the KV-reuse figure
    continuations: int  # continuations of one prefix
    plan: BudgetPlan  # the TRACE step
    step_tokens: int  # tokens per turn in the step (0: the env's default)


FULL = Sizes(48, (1, 32), (400, 1600), 8, BudgetPlan(8, 8, 1, 4, 8), 0)
QUICK = Sizes(8, (1, 4), (64,), 4, BudgetPlan(2, 4, 1, 2, 4), 8)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def prefix_of(tok, length: int) -> list[int]:
    """`length` token ids of plain English text."""
    text = "The quick brown fox jumps over the lazy dog. "
    ids: list[int] = []
    while len(ids) < length:
        ids += tok(text, add_special_tokens=False).input_ids
    return ids[:length]


def throughput(be, tok, batch: int, new_tokens: int) -> dict:
    """One generate call of `batch` distinct 64-token prompts."""
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    prompts = [tok(f"{i} ", add_special_tokens=False).input_ids + prefix_of(tok, 63) for i in range(batch)]
    be.clear_cache()
    seconds, gens = timed(lambda: be.generate(prompts, params, seed=0))
    return {"batch": batch, "tokens": sum(len(g.token_ids) for g in gens), "seconds": seconds}


def kv_reuse(be, tok, length: int, k: int, new_tokens: int) -> dict:
    """k continuations of one `length`-token prefix: in one call (the prefix encoded once), again from the warm
    prefix cache, and one call per continuation with the cache cleared in between (the prefix encoded k times)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    prefix = prefix_of(tok, length)
    # one untimed call at this length first: the first forward at a new size pays one-time allocation costs
    # (seen as 19.7 s instead of 12.2 s for SmolLM2 at 1,600 tokens) that neither side should be charged; its
    # first token differs, so it leaves no prefix of `prefix` in the cache
    other = tok.eos_token_id if prefix[0] != tok.eos_token_id else tok.pad_token_id
    be.generate([[other] + prefix[1:]] * k, SamplingParams(max_new_tokens=2), seed=0)
    be.clear_cache()
    reuse_s, gens = timed(lambda: be.generate([prefix] * k, params, seed=1))
    computed = gens[0].prefix_tokens_computed
    again_s, gens = timed(lambda: be.generate([prefix] * k, params, seed=1))
    again = gens[0].prefix_tokens_computed

    def reencode():
        out = 0
        for j in range(k):
            be.clear_cache()
            out += be.generate([prefix], params, seed=j)[0].prefix_tokens_computed
        return out

    be.clear_cache()
    naive_s, naive = timed(reencode)
    return {
        "length": length,
        "reuse_s": reuse_s,
        "computed": computed,
        "again_s": again_s,
        "recomputed": again,
        "naive_s": naive_s,
        "naive_computed": naive,
    }


def engine_step(policy, sizes: Sizes, seed: int = 0):
    """One TRACE step on the calculator env, every part built as `rollout` builds it."""
    spec = build_env(LMEnvConfig())
    params = SamplingParams(max_new_tokens=sizes.step_tokens or spec.max_new_tokens)
    actor = build_actor(policy, spec, params, EngineConfig())
    method = get_method("trace")
    pred_cfg = LMPredictorConfig()
    predictor = build_predictor(pred_cfg, method, seed)
    engine = build_engine(actor, predictor, TraceConfig(predictor=pred_cfg.settings()), seed=seed, plan=sizes.plan)
    return engine.grow(spec.train(sizes.plan.pool, seed + 5), method)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        default="tiny",
        help="tiny (shipped), tiny@N (trace-rl sft seed=N), random-tiny, smollm2-135m, a path",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=0, help="tokens per row (0: 48, --quick 8)")
    ap.add_argument("--quick", action="store_true", help="every figure at a small size (seconds on a CPU)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    new_tokens = args.new_tokens or sizes.new_tokens
    torch.manual_seed(0)
    try:
        policy, label = load_policy(args.model, args.device)
    except (UserError, ValueError) as err:  # a model that cannot load here: one line, as the commands say it
        print(f"bench_backend: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    be, tok = policy.backend, policy.tokenizer
    print(
        f"model {label}: {sum(p.numel() for p in be.model.parameters()) / 1e6:.1f}M parameters on {args.device}, "
        f"{torch.get_num_threads()} threads"
    )
    out: dict = {"model": label, "throughput": [], "kv": []}
    eos = be.eos_ids
    be.eos_ids = set()  # every row generates exactly new_tokens
    try:
        for batch in sizes.batches:
            r = throughput(be, tok, batch, new_tokens)
            out["throughput"].append(r)
            print(
                f"generate batch {batch:>2}: {r['tokens'] / r['seconds']:8.1f} tokens/s "
                f"({r['tokens']} tokens in {r['seconds']:.2f}s)"
            )
        k = sizes.continuations
        for length in sizes.prefixes:
            r = kv_reuse(be, tok, length, k, new_tokens)
            out["kv"].append(r)
            print(
                f"k={k} x {new_tokens} tokens from a {length}-token prefix: KV reuse {r['reuse_s']:.2f}s "
                f"({r['computed']} prefix tokens encoded once), re-encoding per continuation {r['naive_s']:.2f}s "
                f"({r['naive_computed']} encoded) -> {r['naive_s'] / r['reuse_s']:.2f}x; from a warm prefix cache "
                f"{r['again_s']:.2f}s, {r['recomputed']} prefix tokens recomputed"
            )
    finally:
        be.eos_ids = eos
    be.clear_cache()
    res = engine_step(policy, sizes)
    out["step"] = res
    t = res.time
    print(
        f"TRACE rollout step ({res.rollouts} rollouts, {res.generated_tokens:,} tokens, {t['total']:.1f}s): "
        f"generate {100 * t['generate'] / t['total']:.1f}%, predictor {100 * t['predictor'] / t['total']:.2f}%, "
        f"allocate {100 * t['allocate'] / t['total']:.3f}%, env steps + observation tokens "
        f"{100 * t['env'] / t['total']:.2f}%, engine overhead (allocation + bookkeeping) "
        f"{100 * res.overhead / t['total']:.2f}%"
    )
    return out


if __name__ == "__main__":
    main()
