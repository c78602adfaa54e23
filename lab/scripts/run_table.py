"""One line per training run found under directories of runs: what each run's held-out accuracy did and how large
its updates were, read from the run's own metrics.jsonl.

    python lab/scripts/run_table.py runs/tune-base runs/tune-kl01

The compare table pairs methods over seeds; this is the per-run view a recipe is chosen from (did any run fall
below its start, how large was its largest step, how often did the step bound act). Columns: the held-out accuracy
at each evaluation, the gain (last minus first evaluation, in points), the largest `train/update_kl` of a step
(after any bound) and the largest before the bound, the share of steps the bound scaled back (`update_scale` < 1),
the mean kept share on those steps, and the largest gradient norm. A run without `update_kl_unbounded` (before the
bound existed) reports its update KL in both columns.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from trace_rl.rollout.records import read_metrics


def run_row(metrics: Path) -> dict:
    """The figures of one run's metrics.jsonl (its first method's records)."""
    records = next(iter(read_metrics(metrics).values()), [])
    # the start's evaluation is recorded as eval/accuracy_before, every later one as eval/accuracy
    evals = [r["eval/accuracy_before"] for r in records[:1] if "eval/accuracy_before" in r]
    evals += [r["eval/accuracy"] for r in records if not math.isnan(r.get("eval/accuracy", math.nan))]
    kl = [r["train/update_kl"] for r in records if "train/update_kl" in r]
    raw = [r.get("train/update_kl_unbounded", r["train/update_kl"]) for r in records if "train/update_kl" in r]
    scales = [r.get("train/update_scale", 1.0) for r in records if "train/update_kl" in r]
    bound = [s for s in scales if s < 1.0]
    norms = [r["train/grad_norm"] for r in records if "train/grad_norm" in r]
    return {
        "evals": evals,
        "gain": 100 * (evals[-1] - evals[0]) if len(evals) > 1 else math.nan,
        "lowest_below_start": 100 * (min(evals) - evals[0]) if evals else math.nan,
        "max_update_kl": max(kl, default=math.nan),
        "max_unbounded_kl": max(raw, default=math.nan),
        "bound_share": len(bound) / len(scales) if scales else 0.0,
        "mean_kept": sum(bound) / len(bound) if bound else 1.0,
        "max_grad_norm": max(norms, default=math.nan),
    }


def table(dirs: list[Path]) -> str:
    cols = ["run", "held-out accuracy by evaluation", "gain", "lowest - start", "max update KL", "before bound"]
    cols += ["steps bound", "kept", "max grad norm"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for d in dirs:
        for metrics in sorted(d.glob("*/*seed*/metrics.jsonl")):
            r = run_row(metrics)
            accs = " → ".join(f"{a:.3f}" for a in r["evals"])
            lines.append(
                f"| {metrics.parent.relative_to(d.parent)} | {accs} | {r['gain']:+.1f} "
                f"| {r['lowest_below_start']:+.1f} "
                f"| {r['max_update_kl']:.4f} | {r['max_unbounded_kl']:.4f} | {r['bound_share']:.0%} "
                f"| {r['mean_kept']:.2f} | {r['max_grad_norm']:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__.strip().splitlines()[0], "\nusage: python lab/scripts/run_table.py DIR [DIR ...]")
        return 2
    missing = [a for a in argv if not Path(a).is_dir()]
    if missing:
        print(f"run_table: not a directory: {missing[0]}")
        return 2
    print(table([Path(a) for a in argv]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
