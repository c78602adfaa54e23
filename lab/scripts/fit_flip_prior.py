"""Fit stage 2's flip layer on earlier runs' flips and write it as a prior (`predictor.flip_prior=PATH`).

    python lab/scripts/fit_flip_prior.py OUT.json RUN [RUN ...] [--sigma-cell S --sigma-slope S --half-life H]

A RUN is a run's predictions.jsonl, a run directory holding one, or a run archive of `lab/scripts/archive_runs.sh`
(method--pair.tar.gz); each method in a file is a run of its own. Every chosen anchor of every step (a record
with continuations) is pooled and fitted once by the layer's own MAP fit (`experimental.flip.fit_flip_prior`: no
ageing, so a run's first steps count as much as its last). Printed: per cell, the continuations and flips the fit
saw, the realised share, and the fitted prior's flip probability at the cell's anchors; and the spread of the
runs' own fits around the pooled one (what a between-run sigma would be).

Which runs: runs the prior is to help must not be among them (fit on tuning seeds, measure on others). The
shipped prior for the default LM task (tiny@0 warm start), from the recipe study's three 40-step `trace` runs on
tuning seeds 10-12 (docs/results/2026-12-02-flip-prior.md):

    python lab/scripts/fit_flip_prior.py docs/results/data/2026-12-02-flip-prior/prior-tiny0.json \\
        docs/results/data/2026-12-02-recipe/tune-base/trace--seed{10,11,12}.tar.gz

The spread the layer holds the prior with (--sigma-cell, --sigma-slope; SIGMA_CELL, SIGMA_SLOPE) was chosen on
those tuning seeds only, leaving each out in turn: fitted on two, replayed (`lab/scripts/replay_flip_layer.py --prior`)
on the third. The replay's log loss per continuation over the three held-out runs fell as the cells' sigma
shrank, 0.353 with q/2, then 0.351, 0.346, 0.341, 0.338, 0.336 at sigma 4, 2, 1, 0.5, 0.25 (steps 0-4: 0.414,
0.398, 0.371, 0.352, 0.346, 0.345): it levels off at 0.5, which is also how far the runs' own fits lie from the
pooled one (RMS 0.57 on the cells), so 0.5: tight enough to carry the first steps, loose enough that a run
unlike the earlier ones moves it within a few steps. The slopes' sigma changed the loss by under 0.001
between 0.5, 0.25 and 0.1 (the runs' slopes lie 0.10 apart): 0.25. Pseudo-counts were the other choice; a
sigma on the logit scale keeps the layer's own prior form (only its mean moves), and one number per group was
all three runs could choose.
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from trace_rl.experimental.flip import FlipCalibrator, fit_flip_prior
from trace_rl.predictors.calibration import depth_names

SIGMA_CELL = 0.5  # the spread around the fitted offsets (logit scale); see the module docstring
SIGMA_SLOPE = 0.25  # around the fitted slopes
PER_STEP = ("bare_reward", "predicted", "depth", "continuations", "flips")


def prediction_lines(path: Path) -> list[tuple[str, list[str]]]:
    """(name, lines) of each predictions.jsonl that `path` names (a file, a run directory or a run archive)."""
    if path.is_dir():
        path = path / "predictions.jsonl"
    if not path.is_file():
        raise SystemExit(f"fit_flip_prior: no predictions.jsonl at {path}")
    if path.name.endswith(".tar.gz"):
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.name.endswith("predictions.jsonl")]
            if not members:
                raise SystemExit(f"fit_flip_prior: {path} holds no predictions.jsonl")
            read = [io.TextIOWrapper(tar.extractfile(m), encoding="utf-8").readlines() for m in members]
            # the archive's path as given, not its file name: two studies' archives share names (trace--seed10)
            return [(f"{path}:{Path(m.name).parent}", lines) for m, lines in zip(members, read)]
    return [(str(path), path.read_text(encoding="utf-8").splitlines())]


def named_prediction_lines(paths: list[str]):
    """(name, lines) of every run the paths name, in order; a run named twice is refused, since its records would
    be read as one run's (steps overwritten or merged)."""
    seen: set[str] = set()
    for path in paths:
        for name, lines in prediction_lines(Path(path)):
            if name in seen:
                raise SystemExit(f"fit_flip_prior: {name} is given twice")
            seen.add(name)
            yield name, lines


def chosen_by_step(lines: list[str]) -> dict[tuple[str, int], list[dict]]:
    """The chosen anchors' records (depth >= 1, with continuations) of each (method, step), in file order."""
    out: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for line in lines:
        if line.strip():
            rec = json.loads(line)
            if rec["depth"] >= 1 and rec.get("continuations"):
                out[(rec["method"], rec["step"])].append(rec)
    return out


def read_runs(paths: list[str], extra: tuple[str, ...] = ()) -> dict[str, dict[int, tuple[np.ndarray, ...]]]:
    """Run name -> step -> that step's chosen anchors as (reward, V~, depth, continuations, flips) arrays, then
    one float array per `extra` key (nan where a record lacks it)."""
    runs: dict[str, dict[int, tuple[np.ndarray, ...]]] = {}
    for name, lines in named_prediction_lines(paths):
        for (method, step), recs in sorted(chosen_by_step(lines).items()):
            arrays = tuple(np.array([rec[key] for rec in recs]) for key in PER_STEP)
            arrays += tuple(np.array([rec.get(key, np.nan) for rec in recs], dtype=float) for key in extra)
            runs.setdefault(f"{name} ({method})", {})[step] = arrays
    return runs


def pooled(steps: dict[int, tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """One run's anchors of every step, as one set of arrays."""
    return tuple(np.concatenate([steps[s][i] for s in sorted(steps)]) for i in range(5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--sigma-cell", type=float, default=SIGMA_CELL)
    parser.add_argument("--sigma-slope", type=float, default=SIGMA_SLOPE)
    parser.add_argument("--half-life", type=float, default=16.0, help="the layer's ageing under the prior (steps)")
    args = parser.parse_args()
    runs = read_runs(args.runs)
    if not runs:
        raise SystemExit("fit_flip_prior: no chosen anchors in these runs")
    data = [pooled(steps) for steps in runs.values()]
    prior = fit_flip_prior(data, args.sigma_cell, args.sigma_slope, names=list(runs), half_life=args.half_life)
    prior.save(args.out)
    layer = prior.layer()
    r, v, d, k, f = (np.concatenate([x[i] for x in data]) for i in range(5))
    p = layer.predict(r, v, d)
    names = depth_names(prior.max_depth)
    print(f"{args.out}: fitted on {len(runs)} run(s), {int(k.sum())} continuations")
    print(f"  {'cell':16s} {'conts':>6s} {'flips':>6s} {'realised':>8s} {'prior':>7s} {'q of V~':>8s}  offset")
    for i in range(2 * prior.max_depth):
        success, dbin = divmod(i, prior.max_depth)
        sel = ((r > 0.5) == bool(success)) & (np.minimum(d, prior.max_depth) == dbin + 1)
        cell = f"{'success' if success else 'failure'}, d {names[dbin]}"
        kk, ff = k[sel].sum(), f[sel].sum()
        if not kk:
            print(f"  {cell:16s} {0:6d} {0:6d} {'-':>8s} {'-':>7s} {'-':>8s}  {prior.theta[i]:+.3f}")
            continue
        q = np.where(r[sel] > 0.5, 1 - v[sel], v[sel])
        real, pp, qq = ff / kk, (p[sel] * k[sel]).sum() / kk, (q * k[sel]).sum() / kk
        print(f"  {cell:16s} {kk:6.0f} {ff:6.0f} {real:8.3f} {pp:7.3f} {qq:8.3f}  {prior.theta[i]:+.3f}")
    print(f"  slopes on logit q (failure, success): {prior.theta[-2]:+.3f}, {prior.theta[-1]:+.3f}")
    if len(data) > 1:  # each run's own fit against the pooled one: how far runs of one task lie apart
        own = np.array([_fit(run, prior.kappa, prior.max_depth) for run in data]) - np.array(prior.theta)
        cells = own[:, : 2 * prior.max_depth]
        print(f"  runs' own fits around the pooled one (RMS): cells {np.sqrt(np.mean(cells**2)):.3f}, ", end="")
        print(f"slopes {np.sqrt(np.mean(own[:, -2:] ** 2)):.3f}")


def _fit(run: tuple[np.ndarray, ...], kappa: float, max_depth: int) -> np.ndarray:
    layer = FlipCalibrator(kappa=kappa, max_depth=max_depth)
    layer.observe(*run)
    return layer.theta


if __name__ == "__main__":
    main()
