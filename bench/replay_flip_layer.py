"""Replay stage 2's calibrated flip layer over a run's predictions.jsonl, step by step, as it would have run.

    python bench/replay_flip_layer.py runs/x/predictions.jsonl [more.jsonl] [--burn 5] [--kappa 1 --half-life 16]
    python bench/replay_flip_layer.py --check runs/cal/predictions.jsonl   # a run with predictor.flip_model=calibrated

Each step, the layer (`predictors.flip.FlipCalibrator`, the settings given) predicts the flip of every chosen
anchor from what it saw before that step, then observes the step's chosen anchors, as the engine does. Printed per
depth bin: continuations, the layer's predicted flip, q of V~ and the realised flip share, over the run and past
the first `--burn` steps, and the layer's log loss per continuation beside q of V~'s.

What it says depends on the run. On a run that allocated on q of V~ (predictor.flip_model=raw) the anchors were
chosen on q of V~, not on the layer, so the replay says how calibrated the layer would have been on those anchors,
not on the ones it would have chosen. On a run with the calibrated layer (at these settings) the replay recomputes
what the run allocated on: with --check it prints the largest difference from the records' flip_pred, a check
that the records hold everything the layer read. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

from trace_rl.predictors.calibration import depth_names
from trace_rl.predictors.flip import FlipCalibrator

PER_STEP = ("bare_reward", "predicted", "depth", "continuations", "flips")


def chosen_by_step(path: str) -> dict[tuple[str, int], list[dict]]:
    """The chosen anchors' records of each (method, step), in file order."""
    out: dict[tuple[str, int], list[dict]] = defaultdict(list)
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["depth"] >= 1 and rec.get("continuations"):
                out[(rec["method"], rec["step"])].append(rec)
    return out


def replay(path: str, args) -> None:
    by_step = chosen_by_step(path)
    for method in sorted({m for m, _ in by_step}):
        layer = FlipCalibrator(args.kappa, args.sigma_cell, args.sigma_slope, args.half_life, args.max_depth)
        rows, worst, checked = [], 0.0, False
        for step in sorted(s for m, s in by_step if m == method):
            recs = by_step[(method, step)]
            r, v, d, k, f = (np.array([rec[key] for rec in recs]) for key in PER_STEP)
            pred = layer.predict(r, v, d)
            if args.check and all("flip_pred" in rec for rec in recs):
                checked = True
                worst = max(worst, float(np.max(np.abs(pred - [rec["flip_pred"] for rec in recs]))))
            q_raw = np.where(r > 0.5, 1 - v, v)
            rows.append(np.stack([np.full(r.size, step), np.minimum(d, args.max_depth), k, f, pred, q_raw], axis=1))
            layer.observe(r, v, d, k, f)
        if not rows:
            continue
        data = np.concatenate(rows)
        print(f"{path} ({method}): {len(data)} chosen anchors over {len(rows)} steps")
        if checked:
            print(f"  largest |replayed - recorded flip_pred|: {worst:.2e}")
        header = f"  {'depth':8s} {'period':10s} {'conts':>6s} {'layer':>7s} {'q of V~':>8s} {'realised':>8s}"
        print(header + f" {'|layer - real|':>15s}")
        for label, keep in (("run", data[:, 0] >= 0), (f"steps {args.burn}+", data[:, 0] >= args.burn)):
            for b, name in [*enumerate(depth_names(args.max_depth), 1), (0, "all")]:
                sel = keep & ((data[:, 1] == b) if b else True)
                k, f, pred, q = data[sel, 2], data[sel, 3], data[sel, 4], data[sel, 5]
                if not k.sum():
                    continue
                lp, lq, real = (pred * k).sum() / k.sum(), (q * k).sum() / k.sum(), f.sum() / k.sum()
                print(f"  {name:8s} {label:10s} {k.sum():6.0f} {lp:7.3f} {lq:8.3f} {real:8.3f} {abs(lp - real):15.3f}")
        k, f, pred, q = data[:, 2], data[:, 3], data[:, 4], data[:, 5]
        for name, p in (("layer", pred), ("q of V~", q)):
            p = np.clip(p, 1e-6, 1 - 1e-6)
            loss = -(f * np.log(p) + (k - f) * np.log(1 - p)).sum() / k.sum()
            print(f"  log loss per continuation, {name}: {loss:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--burn", type=int, default=5, help="also report the steps from this one on")
    parser.add_argument("--kappa", type=float, default=1.0)
    parser.add_argument("--sigma-cell", type=float, default=4.0)
    parser.add_argument("--sigma-slope", type=float, default=0.5)
    parser.add_argument("--half-life", type=float, default=16.0)
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--check", action="store_true", help="compare with flip_pred (a calibrated run's records)")
    args = parser.parse_args()
    for path in args.paths:
        replay(path, args)


if __name__ == "__main__":
    main()
