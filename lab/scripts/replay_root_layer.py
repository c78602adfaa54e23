"""Replay the root calibration layer over runs' predictions.jsonl, step by step, for a grid of its settings.

    python lab/scripts/replay_root_layer.py RUN [RUN ...] [--sigma-a 0.5,1,2 --sigma-b 0.25,0.5 --half-lives 4,8,16]

A RUN is a predictions.jsonl, a run directory or a run archive of `lab/scripts/archive_runs.sh` (each method in a file
is a run of its own). Each step the layer (`experimental.root_calibration.RootCalibrator`) predicts every root's
bare success rate from what it saw before that step, then observes the step's roots, as the engine does. Printed
per setting, pooled over runs: the log loss per bare rollout (V~ itself beside it), predicted against realised
success over all roots and over the roots whose V~ lies in 0.3-0.7 (where the root allocator's objective is
steepest), steps 0-4 apart (the cold start). Which roots: those the run allocated to, chosen on its own root
values; given V~ that choice says nothing about the outcome, so the layer's fit is what it would be live, but the
roots themselves are the run's. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
from fit_flip_prior import named_prediction_lines  # lab/scripts/, on the path when the script runs

from trace_rl.experimental.root_calibration import RootCalibrator


def read_roots(paths: list[str]) -> dict[str, dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Run name -> step -> (V~, bare rollouts, successes) of the step's roots with bare rollouts."""
    runs: dict[str, dict[int, list]] = {}
    for name, lines in named_prediction_lines(paths):
        for line in lines:
            if line.strip() and (rec := json.loads(line))["depth"] == 0 and rec.get("bare_rollouts"):
                steps = runs.setdefault(f"{name} ({rec['method']})", defaultdict(list))
                steps[rec["step"]].append((rec["predicted"], rec["bare_rollouts"], rec["bare_successes"]))
    return {n: {s: tuple(np.array(c) for c in zip(*rows)) for s, rows in st.items()} for n, st in runs.items()}


def replay(steps: dict, layer: RootCalibrator) -> np.ndarray:
    """Rows (step, V~, rollouts, successes, layer's prediction)."""
    out = []
    for step in sorted(steps):
        v, n, s = steps[step]
        out.append(np.stack([np.full(v.size, step), v, n, s, layer.predict(v)], axis=1))
        layer.observe(v, n, s)
    return np.concatenate(out)


def loss(q: np.ndarray, n: np.ndarray, s: np.ndarray) -> float:
    """Log loss per bare rollout of success probabilities q on n rollouts with s successes."""
    q = np.clip(q, 1e-6, 1 - 1e-6)
    return float(-(s * np.log(q) + (n - s) * np.log(1 - q)).sum() / n.sum())


def share(q: np.ndarray, n: np.ndarray, sel: np.ndarray) -> str:
    """q's mean per bare rollout over the roots `sel`."""
    return f"{(q[sel] * n[sel]).sum() / n[sel].sum():.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--sigma-a", default="0.5,1,2")
    parser.add_argument("--sigma-b", default="0.25,0.5")
    parser.add_argument("--half-lives", default="4,8,16")
    args = parser.parse_args()
    runs = read_roots(args.paths)
    if not runs:
        raise SystemExit("replay_root_layer: no root records with bare rollouts in these runs")
    grid = [
        (float(a), float(b), float(h))
        for a in args.sigma_a.split(",")
        for b in args.sigma_b.split(",")
        for h in args.half_lives.split(",")
    ]
    print(f"{len(runs)} runs; loss per bare rollout; predicted / realised success (V~ 0.3-0.7 | steps 0-4)")
    for i, (a, b, h) in enumerate(grid):
        data = np.concatenate([replay(steps, RootCalibrator(a, b, h)) for steps in runs.values()])
        step, v, n, s, p = data.T
        mid, cold = (v >= 0.3) & (v <= 0.7), step < 5

        real = s / n
        if i == 0:
            print(
                f"  V~ itself:                         loss {loss(v, n, s):.4f}  all {share(v, n, v >= 0)} / "
                f"{share(real, n, v >= 0)}  mid {share(v, n, mid)} / {share(real, n, mid)}  cold {share(v, n, cold)} / "
                f"{share(real, n, cold)}"
            )
        print(
            f"  sigma_a {a:3.1f} sigma_b {b:4.2f} half-life {h:4.0f}: loss {loss(p, n, s):.4f}"
            f"  all {share(p, n, v >= 0)}"
            f"  mid {share(p, n, mid)} / {share(real, n, mid)}  cold {share(p, n, cold)}"
        )


if __name__ == "__main__":
    main()
