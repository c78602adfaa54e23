"""The vLLM part of bench/gpu_check.py (with --backend vllm): the engine end to end on one device, a CUDA GPU or a
CPU with vLLM's CPU build: TRACE trees through LMActor -> VLLMBackend, the same step on the HF backend, log-probs
against HF on the same tokens, weight sync. (Formerly bench/gpu_smoke.py.)

Checks (each a row with its tolerance):
1. one TRACE step grows trees through the vLLM backend (every row with its own seed), and some prompt tokens
   come from vLLM's prefix cache;
2. the log-probs vLLM returned for the sampled tokens match an HF forward over the same tokens in float32
   (temperature-scaled log-softmax, top_p = 1): max < 0.01 with float32; with bfloat16, mean < 0.02
   and 99th percentile < 0.1 (that measures vLLM's bf16 rounding against an fp32 reference);
3. weight sync: reloading the HF weights leaves greedy output unchanged and re-prefills the prompt (the prefix
   cache was reset); a zeroed final norm makes every log-prob -log(vocab) (the weights reached the served
   model); restoring it restores the output;
4. the same step on the HF backend agrees with vLLM's: the log-probs the HF backend sampled with its KV caches
   match its own uncached float32 forward (max < 0.01), its generated tokens per rollout are within 1.5x of
   vLLM's either way, and its mean reward is within 0.25 of vLLM's. The two samplers draw different tokens, so
   the last two are statistical bounds, wide enough for two samples of one policy and narrow enough for a backend
   whose continuations lost their context (it rambles to the length limit and scores 0: 5.8x vLLM's tokens was
   seen).
Figures: tokens/s of the vLLM step and of the same step (same tasks, plan and seeds) on the HF backend over each
step's generate phase, the prefix-cache hit rate (RequestOutput.num_cached_tokens over all prompt tokens), the
log-prob gap, the weight-sync time. The engine's memory share is computed (backends/vllm_memory.py) beside the
float32 HF reference this part loads.
"""

from __future__ import annotations

import functools
import math
import os
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


def _row(check: str, passed: bool, value, tolerance: str, seconds: float = 0.0) -> dict:
    return {"check": f"vllm: {check}", "passed": bool(passed), "value": value, "tolerance": tolerance,
            "seconds": seconds}  # fmt: skip


def _launch(path: str, tok, ref, dtype: str, device: str):
    """The engine: on a GPU its share computed beside the float32 HF reference (vllm_memory), on CPU eager mode and
    32-token blocks (start-up ~5x faster; short prompts share cached blocks)."""
    from trace_rl.backends import vllm_memory as vm
    from trace_rl.backends.vllm import VLLMBackend

    kwargs: dict = {"max_model_len": 8192 if device == "cuda" else 2048}
    if device == "cuda":
        import torch

        params = vm.model_sizes(ref)[0]
        total = torch.cuda.get_device_properties(0).total_memory
        kwargs["gpu_memory_utilization"] = vm.engine_share(total, 4 * params, vm.engine_min_bytes(params, dtype))
    else:
        kwargs.update(enforce_eager=True, block_size=32)
    return VLLMBackend.launch(path, tokenizer=tok, dtype=dtype, **kwargs)


def _hf_step(ref, tok, make_env, params, tasks, prompts: int, device: str, vllm_res, rows: list, figures: dict):
    """Check 4: the same step on the HF backend, its cached log-probs, tokens per rollout and reward."""
    from trace_rl.backends.hf import HFBackend

    hf_backend, hf_recorded = HFBackend(ref, tok), []
    hf_generate = hf_backend.generate

    def hf_recording(prompts, params, seed=None, seeds=None):
        gens = hf_generate(prompts, params, seed, seeds)
        hf_recorded.extend((list(p), g) for p, g in zip(prompts, gens))
        return gens

    hf_backend.generate = hf_recording
    hf = trace_step(hf_backend, make_env, params, tasks, prompts, "round")
    figures["hf_tokens_per_s"] = hf.generated_tokens / max(hf.time["generate"], 1e-9)
    gap = logprob_gaps(ref, sample_rows(hf_recorded, 48), params.temperature, device)
    worst = float(gap.max()) if gap.size else math.nan
    ok = gap.size > 0 and worst < HF_LOGPROB_GAP
    rows.append(_row("HF backend cached log-probs vs its uncached fp32 forward", ok, worst, f"max < {HF_LOGPROB_GAP}"))
    v_fig, h_fig = step_figures(vllm_res), step_figures(hf)
    figures.update(vllm_mean_reward=v_fig["mean_reward"], hf_mean_reward=h_fig["mean_reward"])
    for ok, what in compare_steps(v_fig, h_fig):
        rows.append(_row(what, ok, None, "statistical bound (in the check's name)"))


def _weight_sync(backend, ref, tok, rows: list, figures: dict) -> None:
    """Check 3: a reload keeps greedy output and resets the prefix cache; a zeroed final norm reaches the engine."""
    import torch

    from trace_rl.agent.react import ChatFormat
    from trace_rl.backends.base import SamplingParams

    probe = [ChatFormat(tok).prompt_ids("You are a helpful assistant.", "Name three prime numbers.")]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    before = backend.generate(probe, greedy, seed=0)[0]
    v = backend.weight_version
    state = dict(ref.state_dict())
    t0 = time.perf_counter()
    bumped = backend.update_weights(state) == v + 1
    figures["weight_sync_s"] = time.perf_counter() - t0
    rows.append(_row("update_weights bumps the version", bumped, backend.weight_version, f"== {v + 1}",
                     figures["weight_sync_s"]))  # fmt: skip
    same = backend.generate(probe, greedy, seed=0)[0]
    rows.append(_row("reloaded weights keep greedy output", same.token_ids == before.token_ids, None, "same tokens"))
    rows.append(_row("the sync reset the prefix cache", same.prefix_tokens_computed == len(probe[0]),
                     same.prefix_tokens_computed, f"== {len(probe[0])} (prompt prefilled again)"))  # fmt: skip
    norm = next(k for k in state if k.endswith("norm.weight") and "layers" not in k)
    backend.update_weights({norm: torch.zeros_like(state[norm])})
    flat = backend.generate(probe, greedy, seed=0)[0]
    uniform = -math.log(ref.config.vocab_size)
    off = max(abs(x - uniform) for x in flat.logprobs)
    rows.append(_row(f"a zeroed {norm} gives uniform log-probs", off < 0.05, off, "max |lp + log V| < 0.05"))
    backend.update_weights({norm: state[norm]})
    back = backend.generate(probe, greedy, seed=0)[0].token_ids == before.token_ids
    rows.append(_row("restoring the weights restores greedy output", back, None, "same tokens"))


def engine_checks(model: str, device: str, env: str, sandbox: str, figures: dict, prompts: int = 8) -> list[dict]:
    """Checks 1-4 on `model` (a local directory, or random-tiny); rows, and figures["vllm"] filled in."""
    import numpy as np

    from trace_rl.backends.base import SamplingParams
    from trace_rl.lm.models import load_model

    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    if env == "math" and not sandbox:  # the math tool runs model code: its containment is a choice to write down
        raise ValueError("--env math needs --sandbox strict|weak")
    make_env = env_factory(env, sandbox)
    path = model_dir(model)
    dtype = "bfloat16" if device == "cuda" else "float32"
    figs: dict = {}
    figures["vllm"] = figs
    rows: list[dict] = []
    ref, tok = load_model(path, device=device, dtype="float32")
    t0 = time.perf_counter()
    backend = _launch(path, tok, ref, dtype, device)
    figs["engine_start_s"] = time.perf_counter() - t0
    recorded: list = []
    agenerate = backend.agenerate

    async def recording(prompts, params, seeds=None, keys=None):
        gens = await agenerate(prompts, params, seeds=seeds, keys=keys)
        recorded.extend((list(p), g) for p, g in zip(prompts, gens))
        return gens

    backend.agenerate = recording
    try:  # 1. one TRACE step (a warm-up call first: vLLM's first generate call compiles its kernels)
        params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=384 if device == "cuda" else 48)
        tasks = tasks_for(env, prompts * 2, seed=0)
        backend.generate([[tok.eos_token_id or 0] * 4], SamplingParams(max_new_tokens=2), seed=0)
        backend.clear_cache()
        backend.stats = dict.fromkeys(backend.stats, 0)
        res = trace_step(backend, make_env, params, tasks, prompts, "eager")
        figs.update(vllm_tokens_per_s=res.generated_tokens / max(res.time["generate"], 1e-9),
                    prefix_cache_hit_rate=backend.prefix_cache_hit_rate)  # fmt: skip
        rows.append(_row("TRACE step on vLLM: rollouts and tokens", res.rollouts > 0 and res.generated_tokens > 0,
                         res.generated_tokens, "> 0", res.time["total"]))  # fmt: skip
        cached = backend.stats["cached_prompt_tokens"]
        rows.append(_row("prompt tokens served from the prefix cache", cached > 0, cached, "> 0"))
        _hf_step(ref, tok, make_env, params, tasks, prompts, device, res, rows, figs)
        d = logprob_gaps(ref, sample_rows(recorded, 48), params.temperature, device)  # 2.
        mean, p99, worst = float(d.mean()), float(np.percentile(d, 99)), float(d.max())
        figs.update(logprob_gap_mean=mean, logprob_gap_max=worst)
        if dtype == "float32":
            rows.append(_row("log-probs vs HF fp32 forward (float32)", worst < 0.01, worst, "max < 0.01"))
        else:
            rows.append(_row(f"log-probs vs HF fp32 forward ({dtype})", mean < 0.02 and p99 < 0.1, p99,
                             "mean < 0.02 and p99 < 0.1"))  # fmt: skip
        _weight_sync(backend, ref, tok, rows, figs)  # 3.
    finally:
        backend.close()
    return rows
