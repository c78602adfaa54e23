"""Tree-packed vs flat (one row per root-to-leaf path) policy update on TRACE trees. Prints, asserts nothing.

    python bench/bench_packing.py                                  # grow trees with the engine (random tiny model)
    python bench/bench_packing.py --model tiny --save-trees /tmp/trees.jsonl    # warm-started policy, keep trees
    python bench/bench_packing.py --model tiny --trees /tmp/trees.jsonl --shape 512,4,8   # a wider random model
    python bench/bench_packing.py --model tiny --trees /tmp/trees.jsonl --layouts flat,dense,blocks --profile
    python bench/bench_packing.py --model smollm2-135m --device cuda --layouts flat,flex

Layouts: flat (one padded row per root-to-leaf path, the model's causal attention), dense (one tree per row,
the dense tree mask through the model's attention: the packed layout before the block-sparse kernels),
blocks / flex (trees share rows; train.tree_attention's kernels). Reports the tokens each layout runs
through the model (and with padding), the forward and update time (median of --repeats runs, each update
from the same weights; the layouts take turns within each repeat), flat / layout ratios, and the largest
parameter difference between the layout's updated model and flat's, which should be at float noise: both
train every turn node once with the same loss. --profile adds where the time of one update goes: phases
(packing, forward, backward, optimizer step, the extra no-grad forward of update_kl) from timers, and the
forward + backward by operator family from torch.profiler (self CPU time).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections import defaultdict

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
from trace_rl.train import tree_attention
from trace_rl.train.losses import POLICY_LOSSES
from trace_rl.train.packing import pack_paths, pack_trees, token_logprobs
from trace_rl.train.update import UpdateConfig, make_optimizer, update_policy
from trace_rl.tree import load_trees, save_trees

LAYOUTS = {  # name -> (packing, tree_attention)
    "flat": ("flat", "auto"),
    "dense": ("tree", "dense"),
    "blocks": ("tree", "blocks"),
    "flex": ("tree", "flex"),
}
# operator families of the profile (first match wins; names are aten / autograd node names, lower-cased)
FAMILIES = (
    ("attention", ("scaled_dot_product", "flash_attention", "flashattention", "flex_attention", "sdpa")),
    ("gather / scatter", ("index", "gather", "scatter")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")),
    ("mask fill / where", ("masked_fill", "aten::where", "aten::tril", "logical")),
    ("copy / layout", ("aten::copy_", "aten::clone", "contiguous", "aten::cat", "constant_pad", "aten::pad")),
)


def grow_trees(model, tok):
    actor = LMActor(HFBackend(model, tok), CalculatorEnv, SamplingParams(max_new_tokens=48))
    engine = TreeRolloutEngine(actor, light_text_predictor(), BudgetPlan(prompts=8, rollouts_per_prompt=8), seed=0)
    return engine.grow(make_tasks(32, seed=0), get_method("trace")).trees


def usable(trees):
    """Trees with turns whose leaves all have rewards (an advantage needs finished rollouts)."""
    return [t for t in trees if t.root.children and all(leaf.reward is not None for leaf in t.leaves())]


def pack(trees, adv, cfg):
    """The micro-batches update_policy builds for `cfg`."""
    if cfg.packing == "flat":
        return pack_paths(trees, adv, max_tokens=cfg.micro_batch_tokens)
    return pack_trees(trees, adv, max_tokens=cfg.micro_batch_tokens, share_rows=cfg.tree_attention != "dense")


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_update(base, trees, adv, cfg):
    model = copy.deepcopy(base)
    opt = make_optimizer(model, cfg)
    t0 = time.perf_counter()
    metrics = update_policy(model, opt, trees, adv, cfg)
    sync()
    return time.perf_counter() - t0, metrics, model


def timed_forward(model, batches, attention):
    with torch.no_grad():
        t0 = time.perf_counter()
        for b in batches:
            token_logprobs(model, b, attention=attention)
        sync()
        return time.perf_counter() - t0


def phases(base, trees, adv, cfg):
    """One update's phases, timed the way update_policy runs them (packing, forward and backward per
    micro-batch, optimizer step, the no-grad forward of update_kl)."""
    model = copy.deepcopy(base).eval()
    opt = make_optimizer(model, cfg)
    out = defaultdict(float)
    t0 = time.perf_counter()
    batches = pack(trees, adv, cfg)
    out["pack"] = time.perf_counter() - t0
    n = sum(b.policy_tokens for b in batches)
    for b in batches:
        t0 = time.perf_counter()
        lp = token_logprobs(model, b, attention=cfg.tree_attention)
        loss_fn = POLICY_LOSSES[cfg.loss]
        loss = loss_fn(lp, b.old_logprobs, b.advantages, b.segment_ids, aggregation=cfg.aggregation, num_tokens=n)
        loss = loss.loss
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        out["forward"] += t1 - t0
        out["backward"] += time.perf_counter() - t1
    t0 = time.perf_counter()
    opt.step()
    sync()
    out["optimizer"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.no_grad():
        for b in batches:
            token_logprobs(model, b, attention=cfg.tree_attention)
    sync()
    out["update_kl forward"] = time.perf_counter() - t0
    return out, batches


def families(base, batches, attention):
    """Self CPU time of one forward + backward over the micro-batches, by operator family."""
    from torch.profiler import ProfilerActivity, profile

    model = copy.deepcopy(base).eval()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches:
            token_logprobs(model, b, attention=attention).sum().backward()
    out = defaultdict(float)
    for ev in prof.key_averages():
        name = ev.key.lower()
        fam = next((f for f, keys in FAMILIES if any(k in name for k in keys)), "other")
        out[fam] += ev.self_cpu_time_total / 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", default="", help="JSON-lines trees (default: grow them with the engine)")
    ap.add_argument("--save-trees", default="", help="write the trees used to this JSON-lines file")
    ap.add_argument("--model", default="random-tiny", help="model to update (and to grow trees with)")
    ap.add_argument(
        "--shape", default="", help="hidden,layers,heads of the random tiny model to update (default: 128,4,4)"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--advantage", default="trace")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layouts", default="flat,blocks", help=f"comma-separated, flat first: {', '.join(LAYOUTS)}")
    ap.add_argument("--profile", action="store_true", help="also print where one update's time goes")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--block", type=int, default=0, help="tokens per block of the blocks kernel (0: its default)")
    args = ap.parse_args()
    layouts = args.layouts.split(",")
    if args.block:
        tree_attention.BLOCK = args.block
    if args.threads:
        torch.set_num_threads(args.threads)
    if layouts[0] != "flat" or any(x not in LAYOUTS for x in layouts):
        raise SystemExit(f"--layouts: a comma-separated list starting with flat, from {', '.join(LAYOUTS)}")
    torch.manual_seed(0)
    model, tok = create_tiny_model() if args.model == "random-tiny" else load_model(args.model)
    if args.trees:
        trees = load_trees(args.trees)
        source = args.trees
    else:
        t0 = time.perf_counter()
        trees = grow_trees(model, tok)
        source = f"grown with the engine in {time.perf_counter() - t0:.0f}s"
    if args.save_trees:
        save_trees(args.save_trees, trees)
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
        f"{torch.get_num_threads()} threads, micro_batch_tokens={args.micro_batch_tokens}, "
        f"blocks of {tree_attention.BLOCK} tokens"
    )
    cfgs = {
        name: UpdateConfig(packing=LAYOUTS[name][0], tree_attention=LAYOUTS[name][1], micro_batch_tokens=mbt)
        for name, mbt in ((n, args.micro_batch_tokens) for n in layouts)
    }
    batches = {name: pack(trees, adv, cfg) for name, cfg in cfgs.items()}
    # the layouts take turns within each repeat, so a load that comes and goes on a shared machine falls on
    # all of them alike; each figure is the median over the repeats
    times = {name: {"forward": [], "update": []} for name in layouts}
    rows, profiles = {}, {}
    for r in range(args.repeats):
        print(f"repeat {r + 1}/{args.repeats}", flush=True)
        for name in layouts:
            times[name]["forward"].append(timed_forward(model, batches[name], cfgs[name].tree_attention))
            upd, metrics, updated = timed_update(model, trees, adv, cfgs[name])
            times[name]["update"].append(upd)
            rows[name] = (metrics, updated)
    for name in layouts:
        metrics, updated = rows[name]
        padded = sum(b.input_ids.numel() for b in batches[name])
        fwd, upd = (statistics.median(times[name][k]) for k in ("forward", "update"))
        rows[name] = (metrics["train/encoded_tokens"], padded, fwd, upd, updated)
        print(
            f"{name:>6}: {len(batches[name]):3d} micro-batches ({sum(len(b.input_ids) for b in batches[name])} rows), "
            f"encoded {metrics['train/encoded_tokens']:>9,.0f} tokens (padded {padded:,}), "
            f"{metrics['train/policy_tokens']:,.0f} policy tokens, forward {fwd:.3f}s, update {upd:.3f}s "
            f"(runs {', '.join(f'{t:.2f}' for t in times[name]['update'])}), loss {metrics['train/loss']:+.4f}"
        )
    fe, fp, ff, fu, fm = rows["flat"]
    for name in layouts[1:]:
        te, tp, tf, tu, tm = rows[name]
        diff = max((a - b).abs().max().item() for a, b in zip(tm.parameters(), fm.parameters()))
        print(
            f"flat / {name}: encoded tokens {fe / te:.2f}x (padded {fp / tp:.2f}x), forward time {ff / tf:.2f}x, "
            f"update time {fu / tu:.2f}x; max parameter difference after one step {diff:.1e}"
        )
    if args.profile:
        for name in layouts:
            ph, profiled = phases(model, trees, adv, cfgs[name])
            profiles[name] = (ph, families(model, profiled, cfgs[name].tree_attention))
        print_profiles(profiles)


def print_profiles(profiles) -> None:
    names = list(profiles)
    print("\none update, phases (s, timers):")
    print("| phase | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for key in ("pack", "forward", "backward", "optimizer", "update_kl forward"):
        print(f"| {key} | " + " | ".join(f"{profiles[n][0][key]:.3f}" for n in names) + " |")
    print("| total | " + " | ".join(f"{sum(profiles[n][0].values()):.3f}" for n in names) + " |")
    print("\none forward + backward, by operator family (s, self CPU time under torch.profiler):")
    print("| family | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for fam in [f for f, _ in FAMILIES] + ["other"]:
        print(f"| {fam} | " + " | ".join(f"{profiles[n][1][fam]:.3f}" for n in names) + " |")
    print("| total | " + " | ".join(f"{sum(profiles[n][1].values()):.3f}" for n in names) + " |")


if __name__ == "__main__":
    main()
