"""GPU smoke test of the vLLM backend (one GPU, a few minutes): TRACE trees on the math environment, log-probs
against Hugging Face on the same tokens, weight sync, tokens/s and the prefix-cache hit rate.

    bash bench/gpu_smoke.sh                                    # Qwen/Qwen2.5-0.5B-Instruct
    bash bench/gpu_smoke.sh --model Qwen/Qwen2.5-1.5B-Instruct --dtype float32

Checks (exit 1 on any failure):
1. one TRACE step grows trees through LMActor -> VLLMBackend (every row with its own seed);
2. the log-probs vLLM returned for the sampled tokens match a float32 HF forward over the same tokens
   (temperature-scaled log-softmax, top_p = 1): mean |diff| < 0.02 and 99th percentile < 0.1 with vLLM in
   bfloat16 (the HF reference is float32, so this measures vLLM's bf16 rounding); max < 0.01 with
   `--dtype float32`;
3. weight sync: reloading the HF weights leaves greedy output unchanged; loading a zeroed final norm makes
   every log-prob -log(vocab) (so load_weights reached the served model); restoring it restores the output;
   every sync bumps weight_version and resets the prefix cache.
Reports tokens/s (generated tokens over the generate phase of the step) and the prefix-cache hit rate
(prompt tokens vLLM served from cache, from RequestOutput.num_cached_tokens, over all prompt tokens).
"""

from __future__ import annotations

import argparse
import math
import sys
import time


def tasks_for(count: int, seed: int) -> list[dict]:
    """Training prompts of the math environment, or a few inline problems when the data is not installed."""
    from trace_rl.envs.data import row_to_task
    from trace_rl.envs.registry import get_env

    try:
        return get_env("math").train(count, seed)
    except (FileNotFoundError, ValueError) as err:
        print(f"(math-train not found: {err}; using inline problems)")
    rows = [
        (f"What is {a} * {b} + {c}?", str(a * b + c))
        for a, b, c in [
            (17, 23, 5),
            (48, 12, 9),
            (31, 7, 100),
            (64, 64, 1),
            (19, 21, 3),
            (125, 8, 7),
            (99, 11, 0),
            (13, 13, 13),
        ]
    ]
    return [row_to_task({"question": q, "answer": a}, "inline", i) for i, (q, a) in enumerate(rows * count)][:count]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--prompts", type=int, default=8, help="P: prompts per step (the pool is 2P)")
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="leaves room for the HF reference")
    ap.add_argument("--compare-rows", type=int, default=48, help="generations scored by HF")
    ap.add_argument("--device", default="cuda", help="where the HF reference runs")
    args = ap.parse_args()

    import numpy as np
    import torch

    from trace_rl.agent.react import ChatFormat
    from trace_rl.backends.base import SamplingParams
    from trace_rl.backends.vllm import VLLMBackend
    from trace_rl.envs.registry import get_env
    from trace_rl.lm.models import load_model, resolve_model_path
    from trace_rl.methods import BudgetPlan, get_method
    from trace_rl.predictors.text import light_text_predictor
    from trace_rl.rollout.engine import TreeRolloutEngine
    from trace_rl.rollout.lm_actor import LMActor

    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(f"[{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            failures.append(what)

    path = resolve_model_path(args.model)
    ref, tok = load_model(path, device=args.device, dtype="float32")
    t0 = time.perf_counter()
    backend = VLLMBackend.launch(
        path, tokenizer=tok, dtype=args.dtype, max_model_len=8192, gpu_memory_utilization=args.gpu_memory_utilization
    )
    print(f"vLLM engine up in {time.perf_counter() - t0:.0f}s ({args.model}, {args.dtype})")

    recorded: list[tuple[list[int], object]] = []
    agenerate = backend.agenerate

    async def recording(prompts, params, seeds=None, keys=None):
        gens = await agenerate(prompts, params, seeds=seeds, keys=keys)
        recorded.extend((list(p), g) for p, g in zip(prompts, gens))
        return gens

    backend.agenerate = recording
    try:
        # 1. one TRACE step on the math environment
        params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
        plan = BudgetPlan(prompts=args.prompts, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=8)
        actor = LMActor(backend, get_env("math").make, params, batching="eager")
        engine = TreeRolloutEngine(actor, light_text_predictor(seed=0), plan, seed=0)
        res = engine.grow(tasks_for(plan.pool, seed=0), get_method("trace"))
        gen_s = res.time["generate"]
        check(
            res.rollouts > 0 and res.generated_tokens > 0,
            f"TRACE step: {res.rollouts} rollouts ({res.bare_rollouts} bare, {res.continuations} continuations) "
            f"over {len(res.active)} trees, {res.generated_tokens:,} tokens in {res.time['total']:.1f}s",
        )
        print(
            f"tokens/s: {res.generated_tokens / max(gen_s, 1e-9):,.0f} over the generate phase ({gen_s:.1f}s); "
            f"prefix-cache hit rate {backend.prefix_cache_hit_rate:.1%} "
            f"({backend.stats['cached_prompt_tokens']:,} of {backend.stats['prompt_tokens']:,} prompt tokens)"
        )
        check(backend.stats["cached_prompt_tokens"] > 0, "vLLM served some prompt tokens from its prefix cache")

        # 2. log-probs against a float32 HF forward on the same tokens
        rng = np.random.default_rng(0)
        rows = [recorded[i] for i in rng.permutation(len(recorded))[: args.compare_rows] if recorded[i][1].token_ids]
        diffs = []
        with torch.no_grad():
            for prompt, g in rows:
                ids = torch.tensor([prompt + g.token_ids], device=args.device)
                logits = ref(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / params.temperature
                lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
                diffs.extend((lp.cpu().numpy() - np.asarray(g.logprobs)).tolist())
        d = np.abs(np.asarray(diffs))
        mean, p99, worst = float(d.mean()), float(np.percentile(d, 99)), float(d.max())
        print(
            f"log-prob |vLLM - HF fp32| over {len(d):,} tokens of {len(rows)} generations: "
            f"mean {mean:.4f}, p99 {p99:.4f}, max {worst:.4f}"
        )
        if args.dtype == "float32":
            check(worst < 0.01, "log-probs match HF within 0.01 (float32)")
        else:
            check(mean < 0.02 and p99 < 0.1, f"log-probs match HF: mean < 0.02 and p99 < 0.1 ({args.dtype})")

        # 3. weight sync
        probe = [ChatFormat(tok).prompt_ids("You are a helpful assistant.", "Name three prime numbers.")]
        greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
        before = backend.generate(probe, greedy, seed=0)[0]
        v = backend.weight_version
        state = dict(ref.state_dict())
        check(backend.update_weights(state) == v + 1, "update_weights bumps the version")
        same = backend.generate(probe, greedy, seed=0)[0]
        check(same.token_ids == before.token_ids, "reloading the same weights leaves greedy output unchanged")
        check(same.prefix_tokens_computed == len(probe[0]), "the sync reset the prefix cache (prompt prefilled again)")
        norm = next(k for k in state if k.endswith("norm.weight") and "layers" not in k)
        backend.update_weights({norm: torch.zeros_like(state[norm])})
        flat = backend.generate(probe, greedy, seed=0)[0]
        uniform = -math.log(ref.config.vocab_size)
        check(
            max(abs(x - uniform) for x in flat.logprobs) < 0.05,
            f"a zeroed {norm} gives uniform log-probs ({uniform:.2f}): the weights reached the served model",
        )
        backend.update_weights({norm: state[norm]})
        check(
            backend.generate(probe, greedy, seed=0)[0].token_ids == before.token_ids,
            "restoring the weights restores greedy output",
        )
    finally:
        backend.close()
    print("PASS" if not failures else f"FAIL: {len(failures)} check(s): " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
