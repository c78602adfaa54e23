"""The predictor's share of a TRACE rollout step's wall-clock, for the light CPU predictor and LM critics.

    python bench/bench_predictor.py                        # light predictor + a small random causal critic
    python bench/bench_predictor.py --critic all-minilm-l6-v2 --critic smollm2-135m   # offline real critics
    python bench/bench_predictor.py --quick --model random-tiny   # one small step per predictor, in seconds

Prints measured figures, asserts nothing. Paper: 3.2% with an 8B policy and a 0.6B critic; goal here <= 2% with
the light predictor on the default CPU policy. Also prints the prefix-sharing saving of causal critics (tokens
encoded vs encoding every prefix alone). The step is built as `trace-rl rollout` builds it (`stack.build`), one
engine per predictor over the same policy and tasks; named critics are built as `predictor.kind=NAME` builds
them. With a random policy (the fallback where `tiny` is not built) the step's generation and tree shapes are
not the warm-started policy's, so neither is the share.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from trace_rl.backends.base import SamplingParams
from trace_rl.errors import UserError
from trace_rl.methods import BudgetPlan, get_method
from trace_rl.predictors.lm_critic import LMCritic
from trace_rl.stack.build import build_actor, build_engine, build_env, build_predictor
from trace_rl.stack.config import EngineConfig, LMEnvConfig, LMPredictorConfig
from trace_rl.trace_config import TraceConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_policy import load_policy

PLAN = BudgetPlan(prompts=8, rollouts_per_prompt=8, branch_factor=1, pool_factor=4, max_per_prompt=8)
QUICK_PLAN = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)


def random_causal_critic(hidden: int = 256, layers: int = 4, seed: int = 0) -> LMCritic:
    """A randomly initialised Llama backbone on the byte tokenizer: the cost of a small causal critic, offline."""
    from transformers import LlamaConfig, LlamaModel

    from trace_rl.lm.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 16 * 16 + 16,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    return LMCritic(LlamaModel(cfg), tok, seed=seed)


def measure(policy, predictor, plan: BudgetPlan, steps: int, max_new_tokens: int = 0, seed: int = 0) -> dict:
    """`steps` TRACE steps with `predictor`: seconds in total, generating and in the predictor, its losses and (LM
    critics) the tokens it encoded against encoding each prefix alone."""
    # every predictor's steps start from a cold backend: the same tasks and seeds would otherwise find the
    # earlier predictors' histories in its prefix and row caches and skip their prefill
    policy.backend.clear_cache()
    spec = build_env(LMEnvConfig())
    params = SamplingParams(max_new_tokens=max_new_tokens or spec.max_new_tokens)
    actor = build_actor(policy, spec, params, EngineConfig())
    method = get_method("trace")
    engine = build_engine(actor, predictor, TraceConfig(predictor=LMPredictorConfig().settings()), seed=seed, plan=plan)
    out = {"total": 0.0, "generate": 0.0, "predictor": 0.0, "losses": [], "rollouts": 0}
    for step in range(steps):
        res = engine.grow(spec.train(plan.pool, 100 + step), method, step)
        for key in ("total", "generate", "predictor"):
            out[key] += res.time[key]
        out["losses"].append(res.predictor_loss)
        out["rollouts"] += res.rollouts
    stats = getattr(predictor, "stats", None) or {}
    out["tokens_encoded"], out["tokens_naive"] = stats.get("tokens_encoded", 0), stats.get("tokens_naive", 0)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="policy: tiny (shipped), random-tiny, or any HF model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--critic", action="append", default=[], help="LM critic backbone(s) to measure (repeatable)")
    ap.add_argument("--steps", type=int, default=0, help="TRACE steps per predictor (0: 2, --quick 1)")
    ap.add_argument("--quick", action="store_true", help="one small step, a 2x64 random critic (seconds on a CPU)")
    args = ap.parse_args(argv)
    plan = QUICK_PLAN if args.quick else PLAN
    steps = args.steps or (1 if args.quick else 2)
    max_new_tokens = 8 if args.quick else 32
    hidden, layers = (64, 2) if args.quick else (256, 4)
    method = get_method("trace")
    try:  # every predictor and the policy before any step: a critic or model that cannot load here is one line
        predictors = {"light (hashed n-grams + logistic)": build_predictor(LMPredictorConfig(), method, 0)}
        predictors[f"random causal critic {layers}x{hidden} (prefix-shared)"] = random_causal_critic(hidden, layers)
        for name in args.critic:  # validated and built as predictor.kind=NAME is
            predictors[f"LM critic {name}"] = build_predictor(LMPredictorConfig(kind=name), method, 0)
        policy, label = load_policy(args.model, args.device)
    except (UserError, ValueError, FileNotFoundError) as err:
        print(f"bench_predictor: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"policy {label}, {torch.get_num_threads()} threads; {steps} TRACE steps of {plan.total} rollouts each")
    # one untimed call first: the first forwards pay one-time costs that would be charged to the first predictor
    policy.backend.generate([policy.tokenizer("warm up", add_special_tokens=False).input_ids], SamplingParams())
    out = {}
    for label_, predictor in predictors.items():
        r = measure(policy, predictor, plan, steps, max_new_tokens)
        out[label_] = r
        saving = ""
        if r["tokens_naive"]:
            saving = f"; tokens encoded {r['tokens_encoded']:,} vs {r['tokens_naive']:,} one prefix at a time"
        print(
            f"{label_:<44} predictor {100 * r['predictor'] / r['total']:5.2f}% of the step ({r['predictor']:.2f}s of "
            f"{r['total']:.1f}s; generate {100 * r['generate'] / r['total']:.1f}%){saving}"
        )
    return out


if __name__ == "__main__":
    main()
