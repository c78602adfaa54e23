"""The vLLM backend end to end on one device (a CUDA GPU, or a CPU with vLLM's CPU build): TRACE trees through
LMActor -> VLLMBackend, the same step on the HF backend, log-probs against HF on the same tokens, weight sync.

    bash bench/gpu_smoke.sh --model /models/Qwen2.5-0.5B-Instruct --sandbox strict    # one GPU, < 8 minutes
    .venv-vllm/bin/python bench/gpu_smoke.py --device cpu --model random-tiny --env calculator --sandbox weak

`--model` is a local model directory (nothing is fetched from a hub) or `random-tiny` (the project's tiny random
Llama, saved to a temporary folder). `--sandbox` has no default: the math environment's python tool runs model
code, and the containment is a choice to write down (`strict` is refused in one line where bubblewrap cannot
run; `weak` is an in-process audit hook). The calculator environment runs no code.

Checks (exit 1 on any failure):
1. one TRACE step grows trees through the vLLM backend (every row with its own seed), and some prompt tokens
   come from vLLM's prefix cache;
2. the log-probs vLLM returned for the sampled tokens match an HF forward over the same tokens in float32
   (temperature-scaled log-softmax, top_p = 1): max < 0.01 with `--dtype float32`; with bfloat16, mean < 0.02
   and 99th percentile < 0.1 (that measures vLLM's bf16 rounding against an fp32 reference);
3. weight sync: reloading the HF weights leaves greedy output unchanged and re-prefills the prompt (the prefix
   cache was reset); a zeroed final norm makes every log-prob -log(vocab) (the weights reached the served
   model); restoring it restores the output;
4. the same step on the HF backend (unless --no-hf-step) agrees with vLLM's: the log-probs the HF backend
   sampled with its KV caches match its own uncached float32 forward (max < 0.01), its generated tokens per
   rollout are within 1.5x of vLLM's either way, and its mean reward is within 0.25 of vLLM's. The two samplers
   draw different tokens, so the last two are statistical bounds, wide enough for two samples of one policy and
   narrow enough for a backend whose continuations lost their context (it rambles to the length limit and
   scores 0: 5.8x vLLM's tokens was seen).
Reports, for the dated notes in docs/engines.md: tokens/s of the vLLM step and of the same step (same tasks,
plan and seeds) on the HF backend, over each step's generate phase (the two samplers draw different tokens, so
the counts differ a little); the prefix-cache hit rate (prompt tokens vLLM served from cache, from
RequestOutput.num_cached_tokens, over all prompt tokens); the log-prob gap; the wall time of each part.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import os
import sys
import tempfile
import time
from pathlib import Path


def tasks_for(env: str, count: int, seed: int) -> list[dict]:
    """Training prompts of the environment, or a few inline math problems when the math data is not installed."""
    from trace_rl.envs.data import row_to_task
    from trace_rl.envs.registry import get_env

    try:
        return get_env(env).train(count, seed)
    except (FileNotFoundError, ValueError) as err:
        print(f"({env} training prompts not found: {err}; using inline problems)")
    rows = [(f"What is {a} * {b} + {c}?", str(a * b + c)) for a, b, c in [(17, 23, 5), (48, 12, 9), (31, 7, 100)]]
    return [row_to_task({"question": q, "answer": a}, "inline", i) for i, (q, a) in enumerate(rows * count)][:count]


def env_factory(env: str, sandbox: str):
    """A fresh environment per rollout; the math env's sandbox checked here (one line where it cannot run)."""
    if env == "calculator":
        from trace_rl.envs.calculator import CalculatorEnv

        return CalculatorEnv
    from trace_rl.envs.math_env import MathEnv
    from trace_rl.envs.sandbox import require

    require(sandbox)
    return functools.partial(MathEnv, sandbox=sandbox)


def model_dir(name: str) -> str:
    """A local model directory, or the tiny random model saved to a temporary one."""
    if name == "random-tiny":
        from trace_rl.lm.models import create_tiny_model

        model, tok = create_tiny_model(seed=0)
        out = tempfile.mkdtemp(prefix="trace-rl-random-tiny-")
        model.save_pretrained(out)
        tok.save_pretrained(out)
        return out
    if not (Path(name).expanduser() / "config.json").is_file():
        raise FileNotFoundError(f"--model must be a local model directory with a config.json (no hub access): {name}")
    return str(Path(name).expanduser())


# the HF step against the vLLM step (check 4); see the docstring for why these widths
HF_LOGPROB_GAP = 0.01
TOKEN_RATIO = 1.5
REWARD_GAP = 0.25


def step_figures(res) -> dict:
    """What check 4 compares of one step: rollouts, generated tokens, and the rewards of its finished rollouts."""
    rewards = [r for tree in res.trees for r in tree.rewards()]
    return {
        "rollouts": res.rollouts,
        "tokens": res.generated_tokens,
        "mean_reward": sum(rewards) / len(rewards) if rewards else float("nan"),
    }


def compare_steps(
    vllm: dict, hf: dict, token_ratio: float = TOKEN_RATIO, reward_gap: float = REWARD_GAP
) -> list[tuple[bool, str]]:
    """Check 4's statistical part: (passed, what) for tokens per rollout and mean reward of the two steps."""
    if not (vllm["rollouts"] and hf["rollouts"]):
        return [(False, f"both steps produced rollouts (vLLM {vllm['rollouts']}, HF {hf['rollouts']})")]
    per_v, per_h = vllm["tokens"] / vllm["rollouts"], hf["tokens"] / hf["rollouts"]
    ratio = per_h / per_v if per_v else math.inf
    gap = abs(hf["mean_reward"] - vllm["mean_reward"])  # nan (no finished rollout on a side) fails below
    return [
        (
            1 / token_ratio <= ratio <= token_ratio,
            f"HF tokens per rollout within {token_ratio}x of vLLM's: {per_h:.1f} vs {per_v:.1f} ({ratio:.2f}x)",
        ),
        (
            gap <= reward_gap,
            f"HF mean reward within {reward_gap} of vLLM's: {hf['mean_reward']:.3f} vs {vllm['mean_reward']:.3f}",
        ),
    ]


def logprob_gaps(ref, rows, temperature: float, device: str):
    """|returned - float32 HF forward| of every sampled token of rows [(prompt ids, Generation)], as an array."""
    import numpy as np
    import torch

    diffs = []
    with torch.no_grad():
        for prompt, g in rows:
            ids = torch.tensor([prompt + g.token_ids], device=device)
            logits = ref(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
            diffs.extend((lp.cpu().numpy() - np.asarray(g.logprobs)).tolist())
    return np.abs(np.asarray(diffs))


def sample_rows(recorded: list, count: int, seed: int = 0) -> list:
    """Up to count of the recorded (prompt, Generation) pairs that generated something, in a seeded order."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(recorded))[:count]
    return [recorded[i] for i in order if recorded[i][1].token_ids]


def trace_step(backend, make_env, params, tasks, prompts: int, batching: str):
    from trace_rl.methods import BudgetPlan, get_method
    from trace_rl.predictors.text import light_text_predictor
    from trace_rl.rollout.engine import TreeRolloutEngine
    from trace_rl.rollout.lm_actor import LMActor

    plan = BudgetPlan(prompts=prompts, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=8)
    actor = LMActor(backend, make_env, params, batching=batching)
    return TreeRolloutEngine(actor, light_text_predictor(seed=0), plan, seed=0).grow(tasks, get_method("trace"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local model directory, or random-tiny")
    ap.add_argument("--sandbox", required=True, choices=["strict", "weak"], help="the math tool's containment")
    ap.add_argument("--env", default="math", choices=["math", "calculator"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"], help="cuda: bf16, cpu: fp32")
    ap.add_argument("--prompts", type=int, default=8, help="P: prompts per step (the pool is 2P)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 384 on cuda, 48 on cpu")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="leaves room for the HF reference")
    ap.add_argument("--compare-rows", type=int, default=48, help="generations scored by HF")
    ap.add_argument("--no-hf-step", action="store_true", help="skip the HF backend's run of the same step")
    args = ap.parse_args()
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    max_new = args.max_new_tokens or (384 if args.device == "cuda" else 48)
    if args.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB

    from trace_rl.envs.sandbox import SandboxUnavailable

    if importlib.util.find_spec("vllm") is None:  # a line, not the traceback of its import deep in the first check
        print(
            "gpu_smoke: vllm is not installed in this interpreter (run it with .venv-vllm/bin/python, made by "
            "scripts/install_vllm_env.sh, or pip install -e '.[vllm]')",
            file=sys.stderr,
        )
        return 2
    try:  # every bad setting is one line before any model loads
        make_env = env_factory(args.env, args.sandbox)
        path = model_dir(args.model)
    except (SandboxUnavailable, FileNotFoundError, ValueError) as err:
        print(f"gpu_smoke: {err}", file=sys.stderr)
        return 2

    import numpy as np
    import torch

    from trace_rl.agent.react import ChatFormat
    from trace_rl.backends.base import SamplingParams
    from trace_rl.backends.hf import HFBackend
    from trace_rl.backends.vllm import VLLMBackend
    from trace_rl.lm.models import load_model

    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(f"[{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            failures.append(what)

    started = time.perf_counter()
    ref, tok = load_model(path, device=args.device, dtype="float32")
    engine_kwargs = {"max_model_len": 8192 if args.device == "cuda" else 2048}
    if args.device == "cuda":
        engine_kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
    else:  # eager start-up is ~5x faster on CPU; 32-token blocks let short prompts share cached blocks
        engine_kwargs.update(enforce_eager=True, block_size=32)
    t0 = time.perf_counter()
    backend = VLLMBackend.launch(path, tokenizer=tok, dtype=dtype, **engine_kwargs)
    print(f"vLLM engine up in {time.perf_counter() - t0:.0f}s ({args.model}, {dtype}, {args.device})")

    recorded: list[tuple[list[int], object]] = []
    agenerate = backend.agenerate

    async def recording(prompts, params, seeds=None, keys=None):
        gens = await agenerate(prompts, params, seeds=seeds, keys=keys)
        recorded.extend((list(p), g) for p, g in zip(prompts, gens))
        return gens

    backend.agenerate = recording
    figures: dict[str, float] = {}
    try:
        # 1. one TRACE step (warm-up call first: vLLM's first generate call compiles/warms its kernels)
        params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new)
        tasks = tasks_for(args.env, args.prompts * 2, seed=0)
        backend.generate([[tok.eos_token_id or 0] * 4], SamplingParams(max_new_tokens=2), seed=0)
        backend.clear_cache()
        backend.stats = dict.fromkeys(backend.stats, 0)
        res = trace_step(backend, make_env, params, tasks, args.prompts, "eager")
        gen_s = res.time["generate"]
        figures["vllm_tokens_per_s"] = res.generated_tokens / max(gen_s, 1e-9)
        figures["prefix_cache_hit_rate"] = backend.prefix_cache_hit_rate
        check(
            res.rollouts > 0 and res.generated_tokens > 0,
            f"TRACE step on vLLM: {res.rollouts} rollouts ({res.bare_rollouts} bare, {res.continuations} "
            f"continuations) over {len(res.active)} trees, {res.generated_tokens:,} tokens in {res.time['total']:.1f}s",
        )
        print(
            f"vLLM tokens/s: {figures['vllm_tokens_per_s']:,.0f} over the generate phase ({gen_s:.1f}s); "
            f"prefix-cache hit rate {backend.prefix_cache_hit_rate:.1%} "
            f"({backend.stats['cached_prompt_tokens']:,} of {backend.stats['prompt_tokens']:,} prompt tokens)"
        )
        check(backend.stats["cached_prompt_tokens"] > 0, "vLLM served some prompt tokens from its prefix cache")
        if not args.no_hf_step:
            hf_backend, hf_recorded = HFBackend(ref, tok), []
            hf_generate = hf_backend.generate

            def hf_recording(prompts, params, seed=None, seeds=None):
                gens = hf_generate(prompts, params, seed, seeds)
                hf_recorded.extend((list(p), g) for p, g in zip(prompts, gens))
                return gens

            hf_backend.generate = hf_recording
            hf = trace_step(hf_backend, make_env, params, tasks, args.prompts, "round")
            hf_s = hf.time["generate"]
            figures["hf_tokens_per_s"] = hf.generated_tokens / max(hf_s, 1e-9)
            print(
                f"HF tokens/s on the same step: {figures['hf_tokens_per_s']:,.0f} ({hf.generated_tokens:,} tokens, "
                f"{hf_s:.1f}s); vLLM/HF {figures['vllm_tokens_per_s'] / max(figures['hf_tokens_per_s'], 1e-9):.2f}x"
            )
            # 4. the HF step agrees with the vLLM step
            hf_gap = logprob_gaps(ref, sample_rows(hf_recorded, args.compare_rows), params.temperature, args.device)
            figures["hf_logprob_gap_max"] = float(hf_gap.max()) if hf_gap.size else math.nan
            check(
                hf_gap.size > 0 and float(hf_gap.max()) < HF_LOGPROB_GAP,
                f"HF backend's cached log-probs match its uncached float32 forward within {HF_LOGPROB_GAP} "
                f"(max {figures['hf_logprob_gap_max']:.2e} over {hf_gap.size:,} tokens)",
            )
            v_fig, h_fig = step_figures(res), step_figures(hf)
            figures.update(vllm_mean_reward=v_fig["mean_reward"], hf_mean_reward=h_fig["mean_reward"])
            for ok, what in compare_steps(v_fig, h_fig):
                check(ok, what)

        # 2. log-probs against a float32 HF forward on the same tokens
        rows = sample_rows(recorded, args.compare_rows)
        d = logprob_gaps(ref, rows, params.temperature, args.device)
        mean, p99, worst = float(d.mean()), float(np.percentile(d, 99)), float(d.max())
        figures.update(logprob_gap_mean=mean, logprob_gap_max=worst)
        print(
            f"log-prob |vLLM - HF fp32| over {len(d):,} tokens of {len(rows)} generations: "
            f"mean {mean:.2e}, p99 {p99:.2e}, max {worst:.2e}"
        )
        if dtype == "float32":
            check(worst < 0.01, "log-probs match HF within 0.01 (float32)")
        else:
            check(mean < 0.02 and p99 < 0.1, f"log-probs match HF: mean < 0.02 and p99 < 0.1 ({dtype})")

        # 3. weight sync
        probe = [ChatFormat(tok).prompt_ids("You are a helpful assistant.", "Name three prime numbers.")]
        greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
        before = backend.generate(probe, greedy, seed=0)[0]
        v = backend.weight_version
        state = dict(ref.state_dict())
        t0 = time.perf_counter()
        check(backend.update_weights(state) == v + 1, "update_weights bumps the version")
        figures["weight_sync_s"] = time.perf_counter() - t0
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
    figures["wall_s"] = time.perf_counter() - started
    print("figures: " + ", ".join(f"{k}={v:.4g}" for k, v in figures.items()))
    print("PASS" if not failures else f"FAIL: {len(failures)} check(s): " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":  # vLLM spawns its engine core: nothing may run at import
    sys.exit(main())
