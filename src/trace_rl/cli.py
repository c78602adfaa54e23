"""The `trace-rl` command line. Every subcommand prints one clear error line on bad input (exit 2)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .baselines import METHODS, BudgetPlan


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
            plan=BudgetPlan(args.prompts, args.rollouts_per_prompt, args.branch_factor, args.pool_factor, args.max_per_prompt),
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
    sim.add_argument("--prompts", type=int, default=32, help="P: prompts per step for flat methods")
    sim.add_argument("--rollouts-per-prompt", type=int, default=8, help="n: GRPO group size")
    sim.add_argument("--branch-factor", type=int, default=1, help="N: continuations per bare rollout (tree methods)")
    sim.add_argument("--pool-factor", type=int, default=4, help="candidate pool = pool_factor * P")
    sim.add_argument("--max-per-prompt", type=int, default=8, help="m_max of the root allocator")
    sim.add_argument("--prefix-share", type=float, default=0.5, help="share of prefix examples in a predictor batch")
    sim.add_argument("--mix", help="easy,medium,hard task shares, e.g. 0.45,0.1,0.45")
    sim.add_argument("--save-trees-every", type=int, default=0, help="write the step's trees every k steps")
    sim.set_defaults(func=_simulate)

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
