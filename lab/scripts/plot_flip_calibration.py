"""Stage 2's flip calibration before and after, as one picture: for each labelled run directory, the share of the
prefixes stage 2 chose that flipped their rollout's outcome against what stage 2 predicted, by depth, with the
realised share's 95% interval and the number of continuations behind each point.

    python lab/scripts/plot_flip_calibration.py "default (q of V~)=runs/portable_default" \
        "calibrated layers=runs/portable_cal" --method trace --out docs/img/lm_flip_calibration.png

Each LABEL=DIR is a run or a `compare` directory (`trace-rl diagnose` reads it the same way; pairs pooled). The
figures are `predictors.calibration.calibration_tables` over the whole run, the ones `trace-rl diagnose` prints
under "flips of the prefixes stage 2 chose".
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trace_rl.diagnose import load_run
from trace_rl.predictors.calibration import calibration_tables, depth_names


def flips_by_depth(run_dir: str, method: str, max_depth: int = 4) -> dict[str, dict]:
    """{depth name: {pred, real, real_lo, real_hi, continuations}} of `method`'s chosen prefixes in `run_dir`."""
    records = [r for recs in load_run(run_dir).values() for r in recs if r.get("method", method) == method]
    if not records:
        raise SystemExit(f"plot_flip_calibration: no records of method {method!r} in {run_dir}")
    flips = calibration_tables(records, max_depth=max_depth)["flips"]
    return {d: flips[d] for d in depth_names(max_depth) if d in flips}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="LABEL=RUN_DIR, one per arm")
    ap.add_argument("--method", default="trace", help="the method whose stage 2 is read (default trace)")
    ap.add_argument("--out", default="flip_calibration.png")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    top = 0.0  # the axes end a little above the largest prediction or interval drawn
    for i, spec in enumerate(args.runs):
        label, _, run_dir = spec.partition("=")
        if not run_dir:
            raise SystemExit(f"plot_flip_calibration: {spec!r} is not LABEL=RUN_DIR")
        rows = flips_by_depth(run_dir, args.method)
        pred = [r["pred"] for r in rows.values()]
        real = [r["real"] for r in rows.values()]
        err = [[r["real"] - r["real_lo"] for r in rows.values()], [r["real_hi"] - r["real"] for r in rows.values()]]
        ax.errorbar(pred, real, yerr=err, marker="os^D"[i % 4], capsize=3, label=label, linestyle="none")
        for j, (name, r) in enumerate(rows.items()):
            # the first arm labels each point below-right of it; later arms, whose points often sit together
            # near the diagonal, stack their labels up-left with a leader line so none covers another
            leader = {"xytext": (-30, 22 + 11 * j), "ha": "right", "arrowprops": {"arrowstyle": "-", "color": "0.6"}}
            side = {"xytext": (4, -10)} if i % 2 == 0 else leader
            ax.annotate(
                f"d{name} ({r['continuations']:,})",
                (r["pred"], r["real"]),
                fontsize=7,
                textcoords="offset points",
                **side,
            )
        print(label, {k: (round(v["pred"], 3), round(v["real"], 3), v["continuations"]) for k, v in rows.items()})
        top = max(top, *pred, *(r["real_hi"] for r in rows.values()))
    top = min(1.0, 1.1 * top)
    ax.plot([0, top], [0, top], ":", color="0.5", label="perfect")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("predicted flip share (what stage 2 allocated on)")
    ax.set_ylabel("realised flip share [95%]")
    ax.set_title("Stage 2's chosen prefixes, by depth (continuations)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
