"""Tree-packed vs flat (one row per root-to-leaf path) policy update on TRACE trees. Prints, asserts nothing.

    python bench/bench_packing.py                                  # grow trees with the engine (random tiny model)
    python bench/bench_packing.py --trees runs/rollout/trees_trace.jsonl
    python bench/bench_packing.py --trees runs/rollout/trees_trace.jsonl --shape 512,4,8   # a wider random model
    python bench/bench_packing.py --model smollm2-135m --device cuda

Reports the tokens each layout runs through the model, the update time (median of --repeats runs, each from
the same weights) and the largest parameter difference between the two updated models, which should be at
float noise: both train every turn node once with the same loss.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from trace_rl.advantages import batch_advantages
from trace_rl.backends.base import SamplingParams
from trace_rl.backends.hf import HFBackend
from trace_rl.envs.calculator import CalculatorEnv, make_tasks
from trace_rl.lm.models import create_tiny_model, load_model
from trace_rl.methods import BudgetPlan, get_method
from trace_rl.predictors.text import light_text_predictor
from trace_rl.rollout.engine import TreeRolloutEngine
from trace_rl.rollout.lm_actor import LMActor
from trace_rl.train.packing import pack_paths, pack_trees, token_logprobs
from trace_rl.train.update import UpdateConfig, make_optimizer, update_policy
from trace_rl.tree import load_trees


def grow_trees(model, tok):
    actor = LMActor(HFBackend(model, tok), CalculatorEnv, SamplingParams(max_new_tokens=48))
    engine = TreeRolloutEngine(actor, light_text_predictor(), BudgetPlan(prompts=8, rollouts_per_prompt=8), seed=0)
    return engine.grow(make_tasks(32, seed=0), get_method("trace")).trees


def usable(trees):
    """Trees with turns whose leaves all have rewards (an advantage needs finished rollouts)."""
    return [t for t in trees if t.root.children and all(leaf.reward is not None for leaf in t.leaves())]


def timed_update(base, trees, adv, cfg, repeats):
    times, model = [], None
    for _ in range(repeats):
        model = copy.deepcopy(base)
        opt = make_optimizer(model, cfg)
        t0 = time.perf_counter()
        metrics = update_policy(model, opt, trees, adv, cfg)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), metrics, model


def timed_forward(model, batches, repeats):
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            t0 = time.perf_counter()
            for b in batches:
                token_logprobs(model, b)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", default="", help="JSON-lines trees (default: grow them with the engine)")
    ap.add_argument("--model", default="random-tiny", help="model to update (and to grow trees with)")
    ap.add_argument(
        "--shape", default="", help="hidden,layers,heads of the random tiny model to update (default: 128,4,4)"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--advantage", default="trace")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model, tok = create_tiny_model() if args.model == "random-tiny" else load_model(args.model)
    if args.trees:
        trees = load_trees(args.trees)
        source = args.trees
    else:
        t0 = time.perf_counter()
        trees = grow_trees(model, tok)
        source = f"grown with the engine in {time.perf_counter() - t0:.0f}s"
    if args.shape:  # a wider random model (same tokenizer) to see where per-token work dominates attention
        hidden, layers, heads = (int(x) for x in args.shape.split(","))
        model, _ = create_tiny_model(hidden=hidden, layers=layers, heads=heads)
    model = model.to(args.device).float()
    trees = usable(trees)
    adv = batch_advantages(args.advantage, trees)
    if not any(v for a in adv for v in a.values()):
        # no reward contrast (a random model fails every task): the timing does not depend on the values, the
        # parity check does, so give every node a seeded random advantage instead
        gen = torch.Generator().manual_seed(0)
        adv = [{k: float(torch.randn((), generator=gen)) for k in a} for a in adv]
        print(f"all {args.advantage} advantages are 0 (no reward contrast): using seeded random advantages")
    nodes = sum(len(t.nodes) for t in trees)
    leaves = sum(len(t.leaves()) for t in trees)
    tree_tokens = sum(len(n.token_ids) for t in trees for n in t.nodes.values())
    path_tokens = sum(len(n.token_ids) for t in trees for leaf in t.leaves() for n in t.path(leaf.node_id))
    print(
        f"trees: {len(trees)} ({source}), {nodes} nodes, {leaves} leaves, {tree_tokens:,} distinct tokens, "
        f"{path_tokens:,} tokens over root-to-leaf paths"
    )
    print(
        f"model {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters on {args.device}, "
        f"{torch.get_num_threads()} threads, micro_batch_tokens={args.micro_batch_tokens}"
    )
    rows = {}
    for packing, packer in (("tree", pack_trees), ("flat", pack_paths)):
        cfg = UpdateConfig(packing=packing, micro_batch_tokens=args.micro_batch_tokens)
        batches = packer(trees, adv, max_tokens=args.micro_batch_tokens)
        padded = sum(b.input_ids.numel() for b in batches)
        fwd = timed_forward(model, batches, args.repeats)
        upd, metrics, updated = timed_update(model, trees, adv, cfg, args.repeats)
        rows[packing] = (metrics["train/encoded_tokens"], padded, fwd, upd, updated)
        print(
            f"{packing:>5}: {len(batches):3d} micro-batches, encoded {metrics['train/encoded_tokens']:>9,.0f} tokens "
            f"(padded {padded:,}), {metrics['train/policy_tokens']:,.0f} policy tokens, "
            f"forward {fwd:.3f}s, update {upd:.3f}s, loss {metrics['train/loss']:+.4f}"
        )
    (te, tp, tf, tu, tm), (fe, fp, ff, fu, fm) = rows["tree"], rows["flat"]
    diff = max((a - b).abs().max().item() for a, b in zip(tm.parameters(), fm.parameters()))
    print(
        f"flat / tree: encoded tokens {fe / te:.2f}x (padded {fp / tp:.2f}x), forward time {ff / tf:.2f}x, "
        f"update time {fu / tu:.2f}x; max parameter difference after one step {diff:.1e}"
    )


if __name__ == "__main__":
    main()
