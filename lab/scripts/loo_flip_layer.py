"""Choose the flip layer's prior and ageing on tuning runs: leave one run out, fit, replay on it, pool.

    python lab/scripts/loo_flip_layer.py --shipped PRIOR.json --own RUN RUN RUN [--other RUN ...] \\
        [--half-lives 16,8,4 --sigmas 0.5,1.0]

`--own` are runs with the calibrated layer (predictor.flip_model=calibrated): their chosen anchors are the layer's
own selection. `--other` are runs that chose otherwise (flip_model=raw), pooled into the prior's fit in the
"own+other" rows. For each prior source (the shipped prior's mean and slope spread, with the grid's cell spread and
half-life; refitted on the other own runs; refitted on those and every --other run), half-life and sigma of the
cells, each --own run in turn is replayed (`lab/scripts/replay_flip_layer.py`'s step-by-step predict-then-observe) under
the prior fitted without it. Printed per variant, pooled over the held-out runs: log loss per continuation, the
largest |predicted - realised| flip share over depth bins 1-3 (the 4+ bin holds a handful of continuations on the
layer's own selection), the gap in every depth bin, then after failures alone and after failures in steps 20+. A
replay keeps the anchors the run chose; a variant that would choose others is only approximated (the note that uses
this says what that misses). Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse

import numpy as np
from fit_flip_prior import pooled, read_runs  # lab/scripts/, on the path when the script runs

from trace_rl.experimental.flip import FlipPrior, fit_flip_prior

SIGMA_SLOPE = 0.25  # the slopes' spread, as fit_flip_prior.py chose it


def replay(steps: dict, prior: FlipPrior, half_life: float, sigma_cell: float) -> np.ndarray:
    """Rows (step, success, depth bin, continuations, flips, prediction) of every chosen anchor."""
    layer = FlipPrior(**{**prior.__dict__, "sigma_cell": sigma_cell}).layer(half_life)
    out = []
    for step in sorted(steps):
        r, v, d, k, f = steps[step][:5]
        p = layer.predict(r, v, d)
        out.append(np.stack([np.full(r.size, step), r > 0.5, np.minimum(d, layer.max_depth), k, f, p], axis=1))
        layer.observe(r, v, d, k, f)
    return np.concatenate(out)


def gap(data: np.ndarray, sel: np.ndarray) -> float:
    k, f, p = data[sel, 3], data[sel, 4], data[sel, 5]
    return float((p * k).sum() / k.sum() - f.sum() / k.sum()) if k.sum() else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shipped", required=True, help="the prior file in use (its sigma_cell and half-life are the grid's)"
    )
    parser.add_argument("--own", nargs="+", required=True)
    parser.add_argument("--other", nargs="*", default=[])
    parser.add_argument("--half-lives", default="16,8,4")
    parser.add_argument("--sigmas", default="0.5,1.0")
    args = parser.parse_args()
    shipped, own, other = FlipPrior.load(args.shipped), read_runs(args.own), read_runs(args.other)
    if len(own) < 2:
        raise SystemExit("loo_flip_layer: leaving one out needs at least two --own runs")
    sources = ["shipped", "own"] + (["own+other"] if other else [])
    print(f"{len(own)} own runs, {len(other)} other runs; gaps are predicted - realised flip share")
    for source in sources:
        for half_life in (float(x) for x in args.half_lives.split(",")):
            for sigma in (float(x) for x in args.sigmas.split(",")):
                parts = []
                for held in own:
                    if source == "shipped":
                        prior = shipped
                    else:
                        fit_on = [pooled(own[n]) for n in own if n != held]
                        fit_on += [pooled(steps) for steps in other.values()] if source == "own+other" else []
                        prior = fit_flip_prior(fit_on, sigma, SIGMA_SLOPE)
                    parts.append(replay(own[held], prior, half_life, sigma))
                data = np.concatenate(parts)
                step, success, depth, k, f, p = data.T
                pc = np.clip(p, 1e-6, 1 - 1e-6)
                loss = -(f * np.log(pc) + (k - f) * np.log(1 - pc)).sum() / k.sum()
                bins = [gap(data, depth == b) for b in (1, 2, 3, 4)]
                fail = [gap(data, (depth == b) & (success == 0)) for b in (1, 2, 3)]
                late = [gap(data, (depth == b) & (success == 0) & (step >= 20)) for b in (1, 2, 3)]
                worst = max(abs(x) for x in bins[:3])
                print(
                    f"{source:9s} half-life {half_life:4.0f} sigma {sigma:3.1f}: loss {loss:.4f}  worst 1-3 {worst:.3f}"
                    f"  | depth 1,2,3,4+ {' '.join(f'{x:+.3f}' for x in bins)}"
                    f"  | failures {' '.join(f'{x:+.3f}' for x in fail)}"
                    f"  | failures, steps 20+ {' '.join(f'{x:+.3f}' for x in late)}"
                )


if __name__ == "__main__":
    main()
