"""How much contrast a task mix offers at the start: from `trace-rl eval eval_samples=G out=DIR`, the share of tasks
whose G samples are mixed (some succeed, some fail: what GRPO's effective ratio is at the start with groups of G),
always solved and never solved, overall and by the environment's difficulty groups.

    trace-rl eval limit=240 eval_samples=8 out=runs/contrast-ws0 policy.model=tiny          # the `rl` preset by default
    python lab/scripts/start_contrast.py runs/contrast-ws0 [runs/contrast-ws2 ...]

The tasks are rebuilt from the run's config.yaml (its env, settings and benchmark), so a group label is the one
the environment's reports use (for the calculator: `steps=N digits=D`). With several runs (warm starts), each
gets its columns. A share over a group of ~15 tasks moves by about ±0.12 (one binomial standard error at 0.5):
read the per-group rows as a guide to which mixes to try, and the overall row as the measurement.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from trace_rl.commands.eval import read_run


def outcomes(run: Path) -> tuple[dict[str, list[tuple[int, int]]], int]:
    """{group label: [(successes, samples) per task]} of one eval run, and the samples per task."""
    cfg, spec = read_run(run)
    scores: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        scores[(r["benchmark"], int(r["index"]))].append(float(r["score"]))
    if not scores:
        raise SystemExit(f"start_contrast: {run}/samples.jsonl holds no samples")
    tasks = {}
    for bench in sorted({b for b, _ in scores}):
        limit = max(i for b, i in scores if b == bench) + 1
        for i, task in enumerate(spec.benchmarks[bench](limit)):
            tasks[(bench, i)] = task
    groups: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for key, s in sorted(scores.items()):
        label = spec.group(tasks[key]) if spec.group else key[0]
        groups[label].append((sum(x > 0.5 for x in s), len(s)))
    return groups, cfg.eval_samples


def shares(rows: list[tuple[int, int]]) -> dict[str, float]:
    n = len(rows)
    return {
        "tasks": n,
        "accuracy": sum(k / m for k, m in rows) / n,
        "mixed": sum(0 < k < m for k, m in rows) / n,
        "always": sum(k == m for k, m in rows) / n,
        "never": sum(k == 0 for k, m in rows) / n,
    }


def table(runs: list[Path]) -> str:
    per_run = [outcomes(r) for r in runs]
    labels = sorted({g for groups, _ in per_run for g in groups})
    head = "| group | " + " | ".join(f"{r.name}: tasks, accuracy, mixed, always, never" for r in runs) + " |"
    lines = [head, "|---" * (len(runs) + 1) + "|"]

    def cells(rows_of):
        out = []
        for groups, _ in per_run:
            rows = rows_of(groups)
            if not rows:
                out.append("-")
                continue
            s = shares(rows)
            out.append(f"{s['tasks']}, {s['accuracy']:.2f}, {s['mixed']:.2f}, {s['always']:.2f}, {s['never']:.2f}")
        return out

    for label in labels:
        lines.append(f"| {label} | " + " | ".join(cells(lambda g, label=label: g.get(label, []))) + " |")
    lines.append("| **all** | " + " | ".join(cells(lambda g: [x for rows in g.values() for x in rows])) + " |")
    sizes = sorted({m for _, m in per_run})
    lines.append(f"\nmixed = share of tasks whose {'/'.join(map(str, sizes))} samples both succeed and fail")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="`trace-rl eval ... out=DIR` folders")
    args = ap.parse_args(argv)
    for run in args.runs:
        if not (run / "samples.jsonl").is_file() or not (run / "config.yaml").is_file():
            sys.exit(f"start_contrast: {run} is not a `trace-rl eval out=...` folder (samples.jsonl, config.yaml)")
    print(table(args.runs))


if __name__ == "__main__":
    main()
