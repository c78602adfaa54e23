"""The predictor's share of a TRACE rollout step's wall-clock, for the light CPU predictor and LM critics.

    python bench/bench_predictor.py                       # light predictor + a small random causal critic
    python bench/bench_predictor.py --critic all-minilm-l6-v2 --critic smollm2-135m   # offline real critics
Prints figures, asserts nothing. Paper: 3.2% with an 8B policy and a 0.6B critic; goal here <= 2% with the
light predictor on the default CPU policy. Also prints the prefix-sharing saving of causal critics
(tokens encoded vs encoding every prefix alone).
"""

from __future__ import annotations

import argparse

import torch

from trace_rl.backends.base import SamplingParams
from trace_rl.backends.hf import HFBackend
from trace_rl.envs.calculator import CalculatorEnv, make_tasks
from trace_rl.lm.models import create_tiny_model, load_model
from trace_rl.methods import BudgetPlan, get_method
from trace_rl.predictors.lm_critic import LMCritic
from trace_rl.predictors.text import light_text_predictor
from trace_rl.rollout.engine import TreeRolloutEngine


def small_causal_critic():
    from transformers import LlamaConfig, LlamaModel

    from trace_rl.lm.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        pad_token_id=tok.pad_token_id,
    )
    return LMCritic(LlamaModel(cfg), tok)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", help="policy: 'tiny' (after trace-rl sft) or any HF model")
    ap.add_argument("--critic", action="append", default=[], help="LM critic backbone(s) to measure")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    try:
        model, tok = load_model(args.model)
    except FileNotFoundError as err:
        print(f"({err}; using a random tiny policy)")
        model, tok = create_tiny_model()
    backend = HFBackend(model, tok)
    plan = BudgetPlan(prompts=8, rollouts_per_prompt=8, branch_factor=1, pool_factor=4, max_per_prompt=8)
    critics = [("light (hashed n-grams + logistic)", light_text_predictor)]
    critics.append(("random causal critic 4x256 (prefix-shared)", small_causal_critic))
    for name in args.critic:
        critics.append((f"LM critic {name}", lambda name=name: LMCritic(name)))
    print(
        f"policy {args.model}, {torch.get_num_threads()} threads; "
        f"{args.steps} TRACE steps of {plan.total} rollouts each"
    )
    for label, make in critics:
        pred = make()
        eng = TreeRolloutEngine(backend, CalculatorEnv, pred, plan, SamplingParams(max_new_tokens=32), seed=0)
        total = gen = p = 0.0
        for step in range(args.steps):
            res = eng.grow(make_tasks(plan.pool, seed=100 + step), get_method("trace"), step)
            total += res.time["total"]
            gen += res.time["generate"]
            p += res.time["predictor"]
        saving = ""
        if hasattr(pred, "stats") and pred.stats.get("tokens_naive"):
            saving = (
                f"; tokens encoded {pred.stats['tokens_encoded']:,} vs {pred.stats['tokens_naive']:,} "
                "one prefix at a time"
            )
        print(
            f"{label:<44} predictor {100 * p / total:5.2f}% of the step ({p:.2f}s of {total:.1f}s; "
            f"generate {100 * gen / total:.1f}%){saving}"
        )


if __name__ == "__main__":
    main()
