"""The `trace-rl` command line. Every subcommand prints one clear error line on bad input (exit 2)."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import numpy as np

from .methods import METHODS, BudgetPlan


def _simulate(args: argparse.Namespace) -> None:
    from .plots import plot_metric
    from .testbed import TestbedConfig
    from .testbed.simulate import (
        ABLATION_METHODS, DEFAULT_METHODS, SimulateArgs, average_runs, format_table, run_simulation, summarize,
    )

    methods = tuple(args.methods.split(",")) if args.methods else (ABLATION_METHODS if args.ablation else DEFAULT_METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    try:
        mix = tuple(float(x) for x in args.mix.split(",")) if args.mix else TestbedConfig.difficulty_mix
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    except ValueError:
        raise ValueError("--mix takes three numbers and --seeds integers, comma-separated") from None
    out = Path(args.out)
    runs = []
    for seed in seeds:
        if len(seeds) > 1:
            print(f"seed {seed}", file=sys.stderr)
        sim = SimulateArgs(
            methods=methods, steps=args.steps, seed=seed, out_dir=str(out / f"seed{seed}") if len(seeds) > 1 else str(out),
            plan=_plan(args),
            testbed=TestbedConfig(difficulty_mix=mix, seed=seed), prefix_share=args.prefix_share,
            save_trees_every=args.save_trees_every,
        )
        runs.append(run_simulation(sim))
    results = average_runs(runs)
    baseline = "grpo" if "grpo" in results else ("trace_uniform" if "trace_uniform" in results else methods[0])
    rows = summarize(results, baseline=baseline)
    if len(seeds) > 1:
        for row in rows:
            row["er_per_seed"] = " ".join(f"{np.mean([r['effective_ratio'] for r in run[row['method']]]):.3f}" for run in runs)
    table = format_table(rows)
    if len(seeds) > 1:
        table = f"mean over seeds {seeds}\n" + table
    print(table)
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    (out / "summary.txt").write_text(table + "\n")
    plot_metric(results, "effective_ratio", out / "effective_ratio.png", "Effective ratio (share of mixed trees)", smooth=5)
    plot_metric(results, "accuracy", out / "accuracy.png", "Exact held-out accuracy")
    where = ", ".join(f"{out}/seed{s}/metrics.jsonl" for s in seeds) if len(seeds) > 1 else f"{out}/metrics.jsonl"
    print(f"\nwrote {where}, {out}/summary.json, effective_ratio.png, accuracy.png")


def _propositions(args: argparse.Namespace) -> None:
    from .testbed.propositions import check_propositions

    r = check_propositions(tasks=args.tasks, episodes=args.episodes, seed=args.seed)
    print(f"Proposition 1 (best MSE does not grow with depth), {r['tasks']} tasks:")
    print(f"  largest rise of E[(R - V_t)^2] from one depth to the next (exact): {r['prop1_max_rise_exact']:.2e}")
    print(f"  mean curve over horizon-{r['horizon_of_curve']} tasks, t = 0..T (exact): {r['prop1_mean_curve_exact']}")
    print(f"  one task, exact:        {r['prop1_curve_exact_same_task']}")
    print(f"  same task, Monte Carlo: {r['prop1_curve_mc']}  ({r['episodes']} episodes)")
    print("Proposition 2 (expected quadratic variation of V along a suffix = V(1-V)):")
    print(f"  largest |E[QV] - V(1-V)| over all states (exact): {r['prop2_max_abs_gap_exact']:.2e}")
    print(f"  Monte Carlo from the root: E[QV] = {r['prop2_mc_qv']:.4f} +- {r['prop2_mc_stderr']:.4f}, "
          f"V(1-V) = {r['prop2_v0_1_minus_v0']:.4f}")


def _sampling(args: argparse.Namespace):
    from .backends.base import SamplingParams

    return SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens)


def _calc_mix(args: argparse.Namespace) -> dict:
    """--chain-steps / --digits as make_tasks keywords, checked against what the calculator task supports."""
    try:
        steps = tuple(int(x) for x in args.chain_steps.split(","))
        digits = tuple(int(x) for x in args.digits.split(","))
    except ValueError:
        raise ValueError("--chain-steps and --digits take comma-separated integers, e.g. 1,2,3") from None
    if not all(1 <= s <= 8 for s in steps) or not all(1 <= d <= 3 for d in digits):
        raise ValueError(f"--chain-steps must lie in 1..8 and --digits in 1..3, got {steps} and {digits}")
    return {"steps": steps, "digits": digits}


def _add_calc_mix(p: argparse.ArgumentParser, what: str) -> None:
    from .envs.calculator import RL_MIX

    p.add_argument("--chain-steps", default=",".join(map(str, RL_MIX["steps"])), help=f"chain lengths of {what}")
    p.add_argument("--digits", default=",".join(map(str, RL_MIX["digits"])), help=f"number sizes (digits) of {what}")


def _sft(args: argparse.Namespace) -> None:
    from .envs.calculator import DEMO_MIX, make_tasks
    from .rollout.evaluate import success_by_difficulty
    from .backends.hf import HFBackend
    from .lm.models import DEFAULT_MODEL, cache_dir, create_tiny_model, load_model
    from .train.sft import train_sft
    from .tree import save_trees

    params = _sampling(args)
    mix = _calc_mix(args)
    if args.model == DEFAULT_MODEL:
        model, tok = create_tiny_model(seed=args.seed)
        out = Path(args.out) if args.out else cache_dir() / "tiny-sft"
    else:
        model, tok = load_model(args.model)
        out = Path(args.out) if args.out else cache_dir() / (Path(args.model).name + "-sft")
    print(f"model: {args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters) -> {out}")
    stats = train_sft(model, tok, make_tasks(args.tasks, seed=args.seed + 1, **DEMO_MIX), max_steps=args.max_steps,
                      max_seconds=args.minutes * 60, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"trained {stats['steps']} steps, {stats['tokens']:,} tokens in {stats['seconds']:.0f}s "
          f"({stats['tokens'] / stats['seconds']:,.0f} tok/s), final loss {stats['loss']:.3f}")
    report, trees = success_by_difficulty(HFBackend(model, tok),
                                          make_tasks(args.eval_tasks, seed=10_000 + args.seed, **mix), params)
    print(f"success on {args.eval_tasks} held-out tasks at temperature {params.temperature}:")
    for key, val in report.items():
        print(f"  {key:<20} {val:.3f}")
    (out / "sft_report.json").write_text(json.dumps({"train": stats, "eval": report}, indent=2))
    save_trees(out / "sft_eval_trees.jsonl", trees)
    print(f"wrote {out}/sft_report.json and the report's episodes as trees, sft_eval_trees.jsonl "
          "(trace-rl rollout --predictor-warmup)")


def _rollout(args: argparse.Namespace) -> None:
    from .envs.calculator import CalculatorEnv, make_tasks
    from .backends.hf import HFBackend
    from .plots import plot_metric
    from .predictors import training_examples
    from .predictors.history import RewardHistoryPredictor
    from .predictors.text import light_text_predictor
    from .rollout.compare import compare_methods
    from .rollout.engine import TreeRolloutEngine
    from .testbed.simulate import format_table
    from .tree import load_trees

    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    oracle = [m for m in methods if METHODS[m].predictor == "oracle"]
    if oracle:
        raise ValueError(f"--methods: {oracle} need the exact V that only the testbed has (trace-rl simulate)")
    params = _sampling(args)
    mix = _calc_mix(args)  # bad input fails before the model loads
    if not 0.0 <= args.prefix_share < 1.0:
        raise ValueError(f"--prefix-share must be in [0, 1), got {args.prefix_share}")
    if args.predictor != "light":
        from .lm.models import SMOLLM2
        from .lm.models import MINILM

        name = args.predictor
        if name not in (MINILM, SMOLLM2) and not Path(name).exists() and name.count("/") != 1:
            raise ValueError(f"--predictor: {name!r} is not 'light', {MINILM}, {SMOLLM2}, an existing path "
                             "or a hub id (org/name)")
    if args.predictor_warmup and not Path(args.predictor_warmup).is_file():
        raise ValueError(f"--predictor-warmup: no file {args.predictor_warmup} (trace-rl sft writes sft_eval_trees.jsonl "
                         "beside the model; --save-trees writes trees_<method>.jsonl)")
    warmup = load_trees(args.predictor_warmup) if args.predictor_warmup else []
    if args.predictor_warmup and not warmup:
        raise ValueError(f"--predictor-warmup: {args.predictor_warmup} holds no trees")
    if warmup:
        print(f"predictor warm-up: {len(warmup)} trees, {sum(len(t.rewards()) for t in warmup)} rollouts from "
              f"{args.predictor_warmup} (spent before this run, not counted in its budget)")
    plan = _plan(args)
    backend = HFBackend.load(args.model, device=args.device)
    # The model, tokenizer and imports never die: keep them out of the collector's scans (full collections
    # took 3% of a tiny-model run's wall-clock, half of that after freezing, and made the overhead figure jumpy).
    gc.freeze()
    tasks = make_tasks(plan.pool * args.steps, seed=args.seed + 20_000, **mix)
    pools = [tasks[i * plan.pool: (i + 1) * plan.pool] for i in range(args.steps)]

    def make_predictor(method):
        if method.predictor == "history":
            pred = RewardHistoryPredictor()
        elif args.predictor == "light":
            pred = light_text_predictor(seed=args.seed)
        else:
            from .predictors.lm_critic import LMCritic

            pred = LMCritic(args.predictor, lr=3e-3, epochs=4, seed=args.seed)
        if warmup:  # every method's predictor sees the same trees before step 1
            pred.update(*training_examples(warmup, args.prefix_share, np.random.default_rng(args.seed)))
        return pred

    try:
        rows = compare_methods(
            lambda pred: TreeRolloutEngine(backend, CalculatorEnv, pred, plan, params, seed=args.seed),
            make_predictor, pools, methods, plan, prefix_share=args.prefix_share, seed=args.seed, out_dir=args.out,
            save_trees=args.save_trees,
        )
    finally:
        gc.unfreeze()  # a caller that runs main() again (the tests) gets its garbage collected as before
    table = format_table(rows)
    print(table)
    out = Path(args.out)
    (out / "rollout_summary.json").write_text(json.dumps(rows, indent=2))
    (out / "rollout_summary.txt").write_text(table + "\n")
    per_step: dict[str, list[dict]] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        per_step.setdefault(rec["method"], []).append(rec)
    plot_metric(per_step, "effective_ratio", out / "effective_ratio.png", "Effective ratio (share of mixed trees)")
    print(f"\nwrote {out}/rollout_summary.json, metrics.jsonl, predictions.jsonl, effective_ratio.png")


def _diagnose(args: argparse.Namespace) -> None:
    from .predictors.report import diagnose
    from .testbed.simulate import format_table

    tables = diagnose(args.run_dir, max_depth=args.max_depth)
    for method, rows in tables.items():
        print(f"\n{method}")
        print(format_table(rows))
    print(f"\nwrote {args.run_dir}/calibration_by_depth.png, spearman_over_steps.png")


def _eval(args: argparse.Namespace) -> None:
    from .envs.registry import get_env
    from .backends.hf import HFBackend
    from .rollout.evaluate import evaluate
    from .testbed.simulate import format_table

    params = _sampling(args)
    spec = get_env(args.env, corpus=args.corpus, retriever_url=args.retriever_url)
    benches = args.bench.split(",") if args.bench else list(spec.benchmarks)
    unknown = [b for b in benches if b not in spec.benchmarks]
    if unknown:
        raise ValueError(f"--bench: unknown {unknown} for env {args.env}; choose from {', '.join(spec.benchmarks)}")
    ks = tuple(int(k) for k in args.k.split(","))
    samples = max(max(ks), args.samples)
    backend = HFBackend.load(args.model, device=args.device)
    rows = []
    for bench in benches:
        tasks = spec.benchmarks[bench](args.limit)
        res = evaluate(backend, spec.make, tasks, params, samples=samples, ks=ks, seed=args.seed, label=bench)
        rows.append({"benchmark": bench, **res})
    print(format_table(rows))


def _serve_retriever(args: argparse.Namespace) -> None:
    import time

    from .envs.retrieval import BM25Retriever, DenseRetriever, load_corpus, serve

    passages = load_corpus(args.corpus)
    retriever = DenseRetriever(passages, args.encoder) if args.dense else BM25Retriever(passages)
    server = serve(retriever, args.host, args.port)
    print(f"serving {len(passages)} passages on http://{args.host}:{server.server_address[1]}/retrieve (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()


def _add_budget(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=32, help="P: prompts a flat method samples per step")
    p.add_argument("--rollouts-per-prompt", type=int, default=8, help="n: GRPO group size")
    p.add_argument("--branch-factor", type=int, default=1, help="N: continuations per bare rollout (tree methods)")
    p.add_argument("--pool-factor", type=int, default=4, help="candidate pool = pool_factor * P")
    p.add_argument("--max-per-prompt", type=int, default=8, help="m_max of the root allocator")


def _plan(args: argparse.Namespace) -> BudgetPlan:
    return BudgetPlan(args.prompts, args.rollouts_per_prompt, args.branch_factor, args.pool_factor, args.max_per_prompt)


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass kept, in (0, 1]")
    p.add_argument("--max-new-tokens", type=int, default=48, help="cap on tokens per turn")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trace-rl", description="TRACE: tree rollout allocation for contrastive exploration")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="compare methods on the synthetic testbed at equal rollout budget")
    sim.add_argument("--methods", help=f"comma-separated, from: {', '.join(METHODS)}")
    sim.add_argument("--ablation", action="store_true", help="run TRACE's root x prefix ablation instead of the baselines")
    sim.add_argument("--steps", type=int, default=40, help="training steps per method")
    sim.add_argument("--seed", type=int, default=0, help="one seed reproduces the run")
    sim.add_argument("--seeds", help="comma-separated seeds: run each and report the step-wise mean")
    sim.add_argument("--out", default="runs/simulate", help="run directory")
    _add_budget(sim)
    sim.add_argument("--prefix-share", type=float, default=0.5, help="share of prefix examples in a predictor batch")
    sim.add_argument("--mix", help="easy,medium,hard task shares, e.g. 0.45,0.1,0.45")
    sim.add_argument("--save-trees-every", type=int, default=0, help="write the step's trees every k steps")
    sim.set_defaults(func=_simulate)

    sft = sub.add_parser("sft", help="warm-start a policy on the built-in task's demonstrations and cache it")
    sft.add_argument("--model", default="tiny", help="'tiny' (the word-tokenizer CPU default), 'smollm2-135m', or a path / hub id")
    sft.add_argument("--minutes", type=float, default=6.0, help="wall-clock cap for training")
    sft.add_argument("--max-steps", type=int, default=1500, help="the default run stops here (about 4 minutes on 2 cores)")
    sft.add_argument("--batch-size", type=int, default=8)
    sft.add_argument("--lr", type=float, default=1e-3)
    sft.add_argument("--tasks", type=int, default=20_000, help="demonstrations to draw from")
    sft.add_argument("--eval-tasks", type=int, default=512, help="held-out tasks of the RL mix to report success on")
    _add_calc_mix(sft, "the held-out report (demonstrations: chains of 1-4 steps, 1-2 digits)")
    sft.add_argument("--seed", type=int, default=0)
    sft.add_argument("--out", help="where to save (default: the user cache, where --model tiny finds it)")
    _add_sampling(sft)
    sft.set_defaults(func=_sft)

    ro = sub.add_parser("rollout", help="grow trees from a frozen policy with several methods at equal budget")
    ro.add_argument("--model", default="tiny", help="'tiny' (after trace-rl sft), 'smollm2-135m', or a path / hub id")
    ro.add_argument("--methods", default="grpo,pcl,treepo,trace_root_only,trace",
                    help=f"comma-separated, from: {', '.join(m for m in METHODS if 'oracle' not in m)}")
    ro.add_argument("--steps", type=int, default=10, help="candidate pools to grow trees on (the predictor learns online)")
    _add_budget(ro)
    ro.add_argument("--device", default="cpu", help="torch device of the policy, e.g. cuda")
    ro.add_argument("--seed", type=int, default=0, help="one seed reproduces the run (pools, samples, predictor)")
    ro.add_argument("--out", default="runs/rollout", help="run directory")
    ro.add_argument("--predictor", default="light",
                    help="'light' (hashed n-grams + logistic, the CPU default) or an LM critic backbone, trained head on "
                         "a frozen backbone: all-minilm-l6-v2, smollm2-135m, a local path or hub id")
    ro.add_argument("--prefix-share", type=float, default=0.5, help="share of prefix examples in a predictor batch")
    ro.add_argument("--predictor-warmup", metavar="TREES",
                    help="fit every predictor on these trees before step 1, e.g. sft_eval_trees.jsonl that trace-rl "
                         "sft writes beside the model, or an earlier run's --save-trees (default: start cold)")
    ro.add_argument("--save-trees", action="store_true",
                    help="write every method's trees (token ids, masks, log-probs, rewards) to trees_<method>.jsonl")
    _add_calc_mix(ro, "the candidate pools")
    _add_sampling(ro)
    ro.set_defaults(func=_rollout)

    dg = sub.add_parser("diagnose", help="predictor quality by depth (Spearman, calibration, Brier) for a run")
    dg.add_argument("run_dir")
    dg.add_argument("--max-depth", type=int, default=4, help="depths beyond this are pooled")
    dg.set_defaults(func=_diagnose)

    ev = sub.add_parser("eval", help="accuracy of a model on an environment's benchmarks (pass@1, pass@k)")
    ev.add_argument("--env", required=True, help="calculator | math | qa | bfcl")
    ev.add_argument("--model", required=True, help="'tiny', 'smollm2-135m', a local path or a hub id")
    ev.add_argument("--bench", help="comma-separated benchmarks (default: all of the env's)")
    ev.add_argument("--limit", type=int, help="first N tasks of each benchmark")
    ev.add_argument("--k", default="1", help="comma-separated k for pass@k, e.g. 1,4")
    ev.add_argument("--samples", type=int, default=1, help="samples per task (at least max k)")
    ev.add_argument("--corpus", help="qa: a passage corpus file for the R1-Searcher eval sets")
    ev.add_argument("--retriever-url", help="qa: a running /retrieve server (Search-R1 compatible)")
    ev.add_argument("--device", default="cpu")
    ev.add_argument("--seed", type=int, default=0)
    _add_sampling(ev)
    ev.set_defaults(func=_eval)

    sr = sub.add_parser("serve-retriever", help="a Search-R1-compatible /retrieve server over a passage corpus")
    sr.add_argument("--corpus", required=True, help="HotpotQA {title: sentences} or a list of {title, text}")
    sr.add_argument("--host", default="127.0.0.1", help="listen address (loopback unless you ask otherwise)")
    sr.add_argument("--port", type=int, default=8000)
    sr.add_argument("--dense", action="store_true", help="faiss + encoder instead of BM25")
    sr.add_argument("--encoder", default="all-minilm-l6-v2")
    sr.set_defaults(func=_serve_retriever)

    prop = sub.add_parser("propositions", help="check the paper's Propositions 1 and 2 on the testbed")
    prop.add_argument("--tasks", type=int, default=64)
    prop.add_argument("--episodes", type=int, default=4000)
    prop.add_argument("--seed", type=int, default=0)
    prop.set_defaults(func=_propositions)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"trace-rl {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"trace-rl {args.command}: interrupted; metrics written so far are kept", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
