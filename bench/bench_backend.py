"""Backend and engine figures: tokens/s, prefix-KV reuse for branching, engine overhead. Prints, asserts nothing.

    python bench/bench_backend.py                 # the tiny CPU default (after `trace-rl sft`) or a random tiny model
    python bench/bench_backend.py --model smollm2-135m
Goals (issue 3): zero prefix tokens recomputed; KV reuse >= 1.5x faster at a 400-token prefix and >= 3x at
1,600 on SmolLM2 on CPU; engine overhead <= 1% of a rollout step.
"""

from __future__ import annotations

import argparse
import time

import torch

from trace_rl.backends.base import SamplingParams
from trace_rl.backends.hf import HFBackend
from trace_rl.envs.calculator import CalculatorEnv, make_tasks
from trace_rl.lm.models import create_tiny_model, load_model
from trace_rl.methods import BudgetPlan, get_method
from trace_rl.predictors.text import light_text_predictor
from trace_rl.rollout.engine import TreeRolloutEngine


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--new-tokens", type=int, default=48)
    args = ap.parse_args()
    torch.manual_seed(0)
    try:
        model, tok = load_model(args.model)
        label = args.model
    except FileNotFoundError as err:
        if args.model != "tiny":
            raise
        print(f"({err}; using a random tiny model: speed is the same, outputs are noise)")
        model, tok = create_tiny_model()
        label = "tiny (random)"
    be = HFBackend(model, tok)
    print(
        f"model {label}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"{torch.get_num_threads()} threads"
    )
    # ignore eos so every row generates exactly new_tokens
    be.eos_ids = set()
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    text = "The quick brown fox jumps over the lazy dog. " * 200
    for batch in (1, 32):
        prompts = [tok(f"{i} " + text[:200], add_special_tokens=False).input_ids[:64] for i in range(batch)]
        be.clear_cache()
        dt, gens = timed(lambda prompts=prompts: be.generate(prompts, params, seed=0))
        n = sum(len(g.token_ids) for g in gens)
        print(f"generate batch {batch:>2}: {n / dt:8.1f} tokens/s ({n} tokens in {dt:.2f}s)")
    for length in (400, 1600):
        prefix = tok(text, add_special_tokens=False).input_ids[:length]
        # one untimed call at this length first: the first forward at a new size pays one-time allocation costs
        # (seen as 19.7 s instead of 12.2 s for SmolLM2 at 1,600 tokens) that neither side should be charged
        be.generate([[tok.eos_token_id] + prefix[1:]] * 8, SamplingParams(max_new_tokens=2), seed=0)
        be.clear_cache()
        t_reuse, gens = timed(lambda prefix=prefix: be.generate([prefix] * 8, params, seed=1))
        computed = gens[0].prefix_tokens_computed
        t_again, gens = timed(lambda prefix=prefix: be.generate([prefix] * 8, params, seed=1))
        again = gens[0].prefix_tokens_computed

        def reencode(prefix=prefix):
            for k in range(8):
                be.clear_cache()
                be.generate([prefix], params, seed=k)

        be.clear_cache()
        t_naive, _ = timed(reencode)
        print(
            f"k=8 x {args.new_tokens} tokens from a {length}-token prefix: KV reuse {t_reuse:.2f}s "
            f"({computed} prefix tokens encoded once), re-encoding per continuation {t_naive:.2f}s "
            f"({8 * length} encoded) -> {t_naive / t_reuse:.2f}x; from a warm prefix cache {t_again:.2f}s, "
            f"{again} prefix tokens recomputed"
        )
    be.eos_ids = {tok.eos_token_id}
    plan = BudgetPlan(prompts=8, rollouts_per_prompt=8, branch_factor=1, pool_factor=4, max_per_prompt=8)
    eng = TreeRolloutEngine(be, CalculatorEnv, light_text_predictor(), plan, SamplingParams(max_new_tokens=48))
    res = eng.grow(make_tasks(plan.pool, seed=5), get_method("trace"))
    t = res.time
    print(
        f"TRACE rollout step ({res.rollouts} rollouts, {res.generated_tokens:,} tokens, {t['total']:.1f}s): "
        f"generate {100 * t['generate'] / t['total']:.1f}%, predictor {100 * t['predictor'] / t['total']:.2f}%, "
        f"allocate {100 * t['allocate'] / t['total']:.3f}%, env steps + observation tokens "
        f"{100 * t['env'] / t['total']:.2f}%, engine overhead (allocation + bookkeeping) "
        f"{100 * res.overhead / t['total']:.2f}%"
    )


if __name__ == "__main__":
    main()
