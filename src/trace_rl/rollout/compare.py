"""`trace-rl rollout`: grow trees with several methods from one frozen policy at equal budget and compare.

No policy update: every method samples from the same model, sees the same candidate pools, and the light
predictor learns online from each method's own trees (a fresh predictor per method), as in training.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from ..methods import BudgetPlan, get_method
from ..metrics import continuation_flips, contrast_groups, effective_ratio, mean_reward
from ..predictors import training_examples
from ..predictors.diagnostics import node_records, step_diagnostics
from ..tree import save_trees as save_trees_to
from .engine import TreeRolloutEngine


def compare_methods(
    make_engine: Callable[[object], TreeRolloutEngine],
    make_predictor: Callable[[object], object],
    pools: list[list[dict]],
    methods: list[str],
    plan: BudgetPlan,
    prefix_share: float = 0.5,
    seed: int = 0,
    progress: bool = True,
    out_dir: str | None = None,
    save_trees: bool = False,
) -> list[dict]:
    """One summary row per method; with out_dir, per-step metrics.jsonl and predictions.jsonl for diagnose,
    and with save_trees every active tree (token ids, masks, log-probs, rewards) in trees_{method}.jsonl."""
    rows = []
    out = Path(out_dir) if out_dir else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        for name in ["metrics.jsonl", "predictions.jsonl"] + [f"trees_{m}.jsonl" for m in methods if save_trees]:
            (out / name).write_text("")
    for name in methods:
        method = get_method(name)
        predictor = make_predictor(method)
        engine = make_engine(predictor)
        acc = {"er": [], "groups": 0, "rollouts": 0, "tokens": 0, "reward": [],
               "generate": 0.0, "predictor": 0.0, "allocate": 0.0, "env": 0.0, "total": 0.0, "overhead": 0.0,
               "unspent": 0, "flips": 0, "continuations": 0}
        rng = np.random.default_rng(seed)
        for step, pool in enumerate(pools):
            res = engine.grow(pool, method, step)
            active = [t for t in res.trees if t.root.children]
            acc["er"].append(effective_ratio(res.trees))
            acc["groups"] += contrast_groups(active)
            flips, continuations = continuation_flips(active)
            acc["flips"] += flips
            acc["continuations"] += continuations
            acc["rollouts"] += res.rollouts
            acc["tokens"] += res.generated_tokens
            acc["reward"].append(mean_reward(active))
            acc["unspent"] += res.unspent_prefix_budget
            for k in ("generate", "predictor", "allocate", "env", "total"):
                acc[k] += res.time[k]
            acc["overhead"] += res.overhead
            if out:
                record = {"method": name, "step": step, "effective_ratio": acc["er"][-1], "rollouts": res.rollouts,
                          "tokens": res.generated_tokens, **{f"time_{k}": v for k, v in res.time.items()},
                          **step_diagnostics(active)}
                with open(out / "metrics.jsonl", "a") as fh:
                    fh.write(json.dumps(record) + "\n")
                with open(out / "predictions.jsonl", "a") as fh:
                    for rec in node_records(active):
                        fh.write(json.dumps({"method": name, "step": step, **rec}) + "\n")
                if save_trees:
                    save_trees_to(out / f"trees_{name}.jsonl", active, append=True)
            examples, targets = training_examples(active, prefix_share, rng)
            predictor.update(examples, targets)
            if progress:
                print(f"\r{name:<18} step {step + 1}/{len(pools)}  effective ratio {np.mean(acc['er']):.3f}  "
                      f"tokens {acc['tokens']:,}", end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr)
        total = acc["total"] or 1.0
        rows.append({
            "method": name,
            "effective_ratio": float(np.mean(acc["er"])),
            "er_second_half": float(np.mean(acc["er"][len(acc["er"]) // 2:])),  # once the predictor has data
            "groups_per_1k_rollouts": 1000.0 * acc["groups"] / max(acc["rollouts"], 1),
            # stage 2's yield: continuations that flipped their bare rollout's outcome (nan: no branching)
            "flip_rate": acc["flips"] / acc["continuations"] if acc["continuations"] else float("nan"),
            "success_rate": float(np.mean(acc["reward"])),
            "rollouts": acc["rollouts"],
            "unspent_prefix": acc["unspent"],
            "tokens": acc["tokens"],
            "generate_pct": 100 * acc["generate"] / total,
            "predictor_pct": 100 * acc["predictor"] / total,
            "allocate_pct": 100 * acc["allocate"] / total,
            "env_pct": 100 * acc["env"] / total,
            "overhead_pct": 100 * acc["overhead"] / total,  # the engine's own share: allocation + bookkeeping
            "wall_s": acc["total"],
        })
    base = next((r for r in rows if r["method"] == "grpo"), rows[0])
    for r in rows:
        for key, label in (("effective_ratio", ""), ("er_second_half", "_second_half")):
            r[f"er_vs_{base['method']}{label}"] = r[key] / base[key] if base[key] else float("nan")
    return rows
