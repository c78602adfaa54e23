"""Replay stage 2's calibrated flip layer over a run's predictions.jsonl, step by step, as it would have run.

    python lab/scripts/replay_flip_layer.py runs/x/predictions.jsonl [more.jsonl] [--burn 5] [--kappa 1 --half-life 16]
    python lab/scripts/replay_flip_layer.py --check runs/cal/predictions.jsonl  # with flip_model=calibrated
    python lab/scripts/replay_flip_layer.py --prior prior.json --runs-table docs/results/data/eval/trace--seed10?.tar.gz

A run is a predictions.jsonl, a run directory or a run archive of `lab/scripts/archive_runs.sh` (each method in a file
is a run of its own). Each step, the layer (`experimental.flip.FlipCalibrator`, the settings given, or with
`--prior` the layer of that prior file, `predictor.flip_prior`) predicts the flip of every chosen anchor from what
it saw before that step, then observes the step's chosen anchors, as the engine does. Printed per depth bin:
continuations, the layer's predicted flip, q of V~ and the realised flip share, over the run, over steps 0 to
`--burn` - 1 (the cold start) and past them, and the layer's log loss per continuation beside q of V~'s. With
several runs, the same table pooled over them; `--runs-table` prints instead one line per run: each bin's
|predicted - realised| over the run and the largest.

What it says depends on the run. On a run that allocated on q of V~ (predictor.flip_model=raw) the anchors were
chosen on q of V~, not on the layer, so the replay says how calibrated the layer would have been on those anchors,
not on the ones it would have chosen. On a run with the calibrated layer (at these settings) the replay recomputes
what the run allocated on: with --check it prints the largest difference from the records' flip_pred, a check
that the records hold everything the layer read. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse

import numpy as np
from fit_flip_prior import read_runs  # lab/scripts/, on the path when the script runs

from trace_rl.experimental.flip import FlipCalibrator, FlipPrior
from trace_rl.predictors.calibration import depth_names


def layer_of(args) -> FlipCalibrator:
    if args.prior:
        return FlipPrior.load(args.prior).layer(args.half_life)  # None: the prior's own half-life
    return FlipCalibrator(args.kappa, args.sigma_cell, args.sigma_slope, args.half_life or 16.0, args.max_depth)


def replay(steps: dict[int, tuple[np.ndarray, ...]], args) -> tuple[np.ndarray, float | None]:
    """Rows (step, depth bin, continuations, flips, layer's prediction, q of V~) of every chosen anchor, and with
    --check the largest |replayed - recorded flip_pred| (None when the records hold none)."""
    layer, rows, worst = layer_of(args), [], None
    for step in sorted(steps):
        r, v, d, k, f, recorded = steps[step]
        pred = layer.predict(r, v, d)
        if args.check and not np.any(np.isnan(recorded)):
            worst = max(worst or 0.0, float(np.max(np.abs(pred - recorded))))
        q_raw = np.where(r > 0.5, 1 - v, v)
        rows.append(np.stack([np.full(r.size, step), np.minimum(d, layer.max_depth), k, f, pred, q_raw], axis=1))
        layer.observe(r, v, d, k, f)
    return np.concatenate(rows), worst


def bins(data: np.ndarray, keep: np.ndarray, max_depth: int) -> list[tuple[str, float, float, float, float]]:
    """Per depth bin and over all: (name, continuations, predicted, q of V~, realised), continuation-weighted."""
    out = []
    for b, name in [*enumerate(depth_names(max_depth), 1), (0, "all")]:
        sel = keep & ((data[:, 1] == b) if b else True)
        k, f, pred, q = data[sel, 2], data[sel, 3], data[sel, 4], data[sel, 5]
        if k.sum():
            out.append((name, k.sum(), (pred * k).sum() / k.sum(), (q * k).sum() / k.sum(), f.sum() / k.sum()))
    return out


def periods(data: np.ndarray, burn: int) -> list[tuple[str, np.ndarray]]:
    return [
        ("run", data[:, 0] >= 0),
        (f"steps 0-{burn - 1}", data[:, 0] < burn),
        (f"steps {burn}+", data[:, 0] >= burn),
    ]


def print_table(title: str, data: np.ndarray, args) -> None:
    print(title)
    header = f"  {'depth':8s} {'period':10s} {'conts':>6s} {'layer':>7s} {'q of V~':>8s} {'realised':>8s}"
    print(header + f" {'|layer - real|':>15s}")
    for label, keep in periods(data, args.burn):
        for name, k, lp, lq, real in bins(data, keep, args.max_depth):
            print(f"  {name:8s} {label:10s} {k:6.0f} {lp:7.3f} {lq:8.3f} {real:8.3f} {abs(lp - real):15.3f}")
    k, f, pred, q = data[:, 2], data[:, 3], data[:, 4], data[:, 5]
    for name, p in (("layer", pred), ("q of V~", q)):
        p = np.clip(p, 1e-6, 1 - 1e-6)
        loss = -(f * np.log(p) + (k - f) * np.log(1 - p)).sum() / k.sum()
        print(f"  log loss per continuation, {name}: {loss:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--burn", type=int, default=5, help="the cold start: steps before this one")
    parser.add_argument("--prior", default="", help="a prior file (predictor.flip_prior); sets the layer's settings")
    parser.add_argument("--kappa", type=float, default=1.0)
    parser.add_argument("--sigma-cell", type=float, default=4.0)
    parser.add_argument("--sigma-slope", type=float, default=0.5)
    parser.add_argument("--half-life", type=float, default=None, help="default: the prior's, else 16 steps")
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--check", action="store_true", help="compare with flip_pred (a calibrated run's records)")
    parser.add_argument("--runs-table", action="store_true", help="one line per run: each bin's gap")
    args = parser.parse_args()
    if args.prior:
        args.max_depth = FlipPrior.load(args.prior).max_depth
    runs = read_runs(args.paths, extra=("flip_pred",))
    results = {name: replay(steps, args) for name, steps in runs.items()}
    if args.runs_table:
        names, width = depth_names(args.max_depth), max(len(n) for n in results)
        for label in ("run", f"steps 0-{args.burn - 1}"):
            print(f"|predicted - realised| per depth bin, {label} (continuations in brackets)")
            print(f"  {'run':{width}s} " + " ".join(f"{n:>12s}" for n in names) + f" {'largest':>8s}")
            for name, (data, _) in results.items():
                keep = dict(periods(data, args.burn))[label]
                cells = {n: (k, abs(lp - real)) for n, k, lp, _, real in bins(data, keep, args.max_depth)}
                text = [f"{cells[n][1]:.3f} ({cells[n][0]:3.0f})" if n in cells else "-" for n in names]
                largest = max((g for n, (_, g) in cells.items() if n != "all"), default=0.0)
                print(f"  {name:{width}s} " + " ".join(f"{t:>12s}" for t in text) + f" {largest:8.3f}")
        return
    for name, (data, worst) in results.items():
        print_table(f"{name}: {len(data)} chosen anchors over {len(np.unique(data[:, 0]))} steps", data, args)
        if worst is not None:
            print(f"  largest |replayed - recorded flip_pred|: {worst:.2e}")
    if len(results) > 1:
        print_table(f"pooled over {len(results)} runs", np.concatenate([d for d, _ in results.values()]), args)


if __name__ == "__main__":
    main()
