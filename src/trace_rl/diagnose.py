"""Predictor quality by depth for a finished run, as tables and PNG plots (behind `trace-rl diagnose`).

Reads RUN_DIR/predictions.jsonl, or RUN_DIR/seed*/predictions.jsonl for a multi-seed run (one record per node
the allocator scored: method, step, depth, predicted, target, and the outcomes `predictors.calibration` reads),
and writes into `out_dir`, which defaults to the run directory:

- calibration_by_depth.png: mean empirical success V^ per predicted-value bin, one line per depth, one panel per
  method on a grid at most three panels wide (seeds pooled);
- spearman_over_steps.png: Spearman(V~, V^) per step, a panel for the roots and one for the prefixes, one line
  per method; several seeds draw the mean and a min-max band;
- reliability.png: one row per method, against outcomes no allocation choice biased
  (`predictors.calibration`): V~ at the roots against their bare rollouts (the run, its early and its late
  half), V~ at the prefixes against each anchor's own rollout by depth, and the chosen prefixes' predicted
  flip probability against their realised flip share (by depth, and binned by the predicted q).

Two sets of tables. The first, per depth, sets V~ against the leaf mean V^ (Spearman rho and p, ECE, Brier),
with the flip calibration of the chosen prefixes (`predictors.diagnostics.flip_rows`) where the records carry
it; V^ is biased where stage 2 branched (module docstring of `predictors.base`), so read its ECE as a ranking
aid. The second (`format_calibration`) is the calibration proper, over the run and over its early and late
halves (steps split at the median step; seeds pooled): V~ reliability at roots and by prefix depth with its
bins, and the flips of the chosen prefixes with the recalibrated prediction and the mean q of all anchors. A
run written before the records carried the bare outcomes has only the first set.

A `trace-rl compare` directory is read per method, its pairs pooled: RUN_DIR/<method>/<pair>/predictions.jsonl
(a pair is seed<k> or ws<W>-seed<k>). Every plot comes
from predictions.jsonl alone, so none depends on how metrics.jsonl names its keys. Without matplotlib no plot
is drawn and `Diagnosis.note` says so in one line; the tables need numpy, and SciPy for the p-values.
`format_diagnosis` prints p-values in scientific notation below 0.001 instead of rounding them to 0.000.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .plots import grid_shape, plot_panels
from .predictors.calibration import calibration_tables, depth_names, gap_verdict
from .predictors.diagnostics import flip_rows, spearman_rho, summarize_records
from .safe_read import loads, read_lines

CALIBRATION_PNG = "calibration_by_depth.png"
SPEARMAN_PNG = "spearman_over_steps.png"
RELIABILITY_PNG = "reliability.png"
NO_MATPLOTLIB = "plots skipped: matplotlib is not installed (pip install 'trace-rl[plots]')"
MIN_PER_DEPTH = 10  # fewer predictions at a depth than this draw no calibration line
MIN_PER_BIN = 3  # a calibration point needs this many predictions in its bin
PAIR_DIR = re.compile(r"(ws\d+-)?seed\d+")  # a compare run's directory (train.compare.pair_name)
FLIP_GAP_BOUND = 0.05  # |predicted - realised| flip share the tables test per depth bin


def _read_jsonl(path: Path) -> list[dict]:
    """The records of a predictions.jsonl, within safe_read.BOUNDS["records"] (16 MiB a line, 4 GiB a file)."""
    rows = []
    for lineno, line in read_lines(path, "records"):
        if line.strip():
            try:
                rows.append(loads(line, strict=False))  # NaN from runs before strict JSON still reads
            except ValueError as err:
                raise ValueError(f"{path}:{lineno}: not JSON ({err})") from None
    return rows


def load_run(run_dir: str | Path) -> dict[str, list[dict]]:
    """Prediction records per seed: {"": records} for a one-seed run, {"seed0": ..., "seed1": ...} otherwise."""
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory {run} does not exist")
    if (run / "predictions.jsonl").is_file():
        return {"": _read_jsonl(run / "predictions.jsonl")}
    seeds = sorted(run.glob("seed*/predictions.jsonl"))
    if not seeds:  # a compare directory: <method>/<pair>/, a pair being seed<k> or ws<W>-seed<k>
        seeds = sorted(p for p in run.glob("*/*seed*/predictions.jsonl") if PAIR_DIR.fullmatch(p.parent.name))
        if seeds:
            # records name the allocation only; the directory also names the advantage (trace_adv-grpo)
            return {
                f"{p.parent.parent.name}/{p.parent.name}": [
                    {**r, "method": p.parent.parent.name} for r in _read_jsonl(p)
                ]
                for p in seeds
            }
    if not seeds:
        raise FileNotFoundError(f"no predictions.jsonl in {run} (written by trace-rl simulate / rollout)")
    return {p.parent.name: _read_jsonl(p) for p in seeds}


@dataclass
class Diagnosis:
    """What `diagnose` found: the depth tables against V^, the calibration per period, the plots it drew."""

    tables: dict[str, list[dict]]  # per method: one row per depth (n, Spearman rho and p, ECE, Brier; flips)
    calibration: dict[str, dict[str, dict]]  # per method, per period label: `calibration_tables`
    max_depth: int = 4
    plots: list[Path] = field(default_factory=list)
    note: str = ""  # why no plot was drawn ("" when they were)


def periods(records: list[dict]) -> dict[str, list[dict]]:
    """{"run": all, "early (steps a-b)": first half of the steps, "late (steps c-d)": the rest}; steps are shown
    1-based, as the progress lines print them. One step: the run alone."""
    steps = sorted({int(r["step"]) for r in records})
    out = {"run": records}
    if len(steps) >= 2:
        split = steps[len(steps) // 2]
        for name, lo, hi in (("early", steps[0], split - 1), ("late", split, steps[-1])):
            sel = [r for r in records if lo <= int(r["step"]) <= hi]
            out[f"{name} (steps {lo + 1}-{hi + 1})"] = sel
    return out


def diagnose(run_dir: str | Path, max_depth: int = 4, out_dir: str | Path | None = None) -> Diagnosis:
    """Per method, the depth tables and the calibration over the run and its halves; writes the plots into
    out_dir when matplotlib is installed."""
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    seeds = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_method: dict[str, list[dict]] = {}
    for recs in seeds.values():
        for r in recs:
            by_method.setdefault(r["method"], []).append(r)
    if not by_method:
        raise ValueError(f"{run_dir}: predictions.jsonl holds no records")
    tables = {m: summarize_records(recs, max_depth=max_depth) for m, recs in by_method.items()}
    for m, rows in tables.items():
        flips = flip_rows(by_method[m], max_depth=max_depth)
        if flips:
            empty = dict.fromkeys(("chosen", "continuations", "pred_flip", "real_flip"), float("nan"))
            for row in rows:
                row.update(flips.get(row["depth"], empty))
    calibration = {
        m: {label: calibration_tables(sel, max_depth=max_depth) for label, sel in periods(recs).items()}
        for m, recs in by_method.items()
    }
    result = Diagnosis(tables, calibration, max_depth)
    try:
        import matplotlib  # noqa: F401  (only whether it is there)
    except ImportError:
        result.note = NO_MATPLOTLIB
        return result
    plot_calibration(by_method, out / CALIBRATION_PNG, max_depth)
    panels: dict[str, dict[str, list[list[dict]]]] = {"roots (depth 0)": {}, "prefixes (depth >= 1)": {}}
    for method in by_method:
        for (_label, curves), roots in zip(panels.items(), (True, False)):
            curves[method] = [
                spearman_by_step([r for r in recs if r["method"] == method and (r["depth"] == 0) == roots])
                for recs in seeds.values()
            ]
    plot_panels(
        panels, "spearman", out / SPEARMAN_PNG, "Predictor rank correlation per step", ylabel="Spearman(V~, V^)"
    )
    result.plots = [out / CALIBRATION_PNG, out / SPEARMAN_PNG]
    if any(c["run"].get("roots") or c["run"]["prefixes"] for c in calibration.values()):
        result.plots.append(plot_reliability(calibration, out / RELIABILITY_PNG, max_depth))
    return result


def spearman_by_step(records: list[dict]) -> list[dict]:
    """[{"step", "spearman"}] per step of `records`; steps where rho is undefined are left out."""
    steps: dict[int, list[dict]] = {}
    for r in records:
        steps.setdefault(int(r["step"]), []).append(r)
    out = []
    for step in sorted(steps):
        rho = spearman_rho([r["predicted"] for r in steps[step]], [r["target"] for r in steps[step]])
        if not math.isnan(rho):
            out.append({"step": step, "spearman": rho})
    return out


def plot_calibration(by_method: dict[str, list[dict]], path: Path, max_depth: int) -> Path:
    """Reliability curves per depth, one square panel per method; the last depth pools the deeper ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(by_method)
    rows, cols = grid_shape(len(names))
    fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols, 3.6 * rows), dpi=100, squeeze=False)
    bins = np.linspace(0, 1, 11)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for k, (ax, name) in enumerate(zip(axes.flat, names)):
        recs = by_method[name]
        for d in range(max_depth + 1):
            sel = [r for r in recs if (r["depth"] == d if d < max_depth else r["depth"] >= d)]
            if len(sel) < MIN_PER_DEPTH:
                continue
            p = np.array([r["predicted"] for r in sel])
            t = np.array([r["target"] for r in sel])
            idx = np.minimum(np.digitize(p, bins) - 1, 9)
            keep = [b for b in range(10) if (idx == b).sum() >= MIN_PER_BIN]
            ax.plot(
                [p[idx == b].mean() for b in keep],
                [t[idx == b].mean() for b in keep],
                marker="osD^v"[d % 5],
                ms=4,
                lw=1.3,
                color=f"C{d}",
                label=f"depth {d}{'+' if d == max_depth else ''} (n={len(sel)})",
            )
        ax.plot([0, 1], [0, 1], "k:", lw=1)
        ax.set(xlim=(0, 1), ylim=(0, 1), aspect="equal", title=name)
        ax.title.set_fontsize(10)
        if k % cols == 0:
            ax.set_ylabel("empirical success V^")
        if k >= len(names) - cols:
            ax.set_xlabel("predicted V~")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    return _save(fig, "Calibration by depth (dotted: perfect)", path)


def _save(fig, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _curve(ax, bins: list[dict], **style) -> None:
    """A reliability curve from `calibration.reliability` rows: bins with fewer than MIN_PER_BIN samples left out."""
    keep = [b for b in bins if b["n"] >= MIN_PER_BIN]
    if keep:
        ax.plot([b["pred"] for b in keep], [b["real"] for b in keep], ms=4, lw=1.3, **style)


def plot_reliability(calibration: dict[str, dict[str, dict]], path: Path, max_depth: int) -> Path:
    """One row per method: roots per period, prefixes by depth (the run), flips of the chosen prefixes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(calibration)
    fig, axes = plt.subplots(len(names), 3, figsize=(11.4, 3.8 * len(names)), dpi=100, squeeze=False)
    for row, name in zip(axes, names):
        by_period = calibration[name]
        run = by_period["run"]
        for k, (label, tab) in enumerate(by_period.items()):
            if tab.get("roots"):
                s = tab["roots"]
                lab = f"{label}: n={s['n']:.0f}, ECE {s['ece']:.2f}"
                _curve(row[0], s["bins"], marker="osD"[k % 3], color=f"C{k}", label=lab)
        for d, dn in enumerate(depth_names(max_depth)):
            s = run["prefixes"].get(dn)
            if s:
                lab = f"depth {dn}: n={s['n']:.0f}, ECE {s['ece']:.2f}"
                _curve(row[1], s["bins"], marker="osD^v"[d % 5], color=f"C{d}", label=lab)
        for d, dn in enumerate(depth_names(max_depth)):
            f = run["flips"].get(dn)
            if f:
                size = 12 + 4 * math.sqrt(f["continuations"])
                row[2].scatter(f["pred"], f["real"], s=size, color=f"C{d}", label=f"depth {dn}", zorder=3)
                row[2].scatter(f["recal"], f["real"], s=size, facecolors="none", edgecolors=f"C{d}", zorder=3)
                row[2].plot([f["pred"], f["recal"]], [f["real"]] * 2, color=f"C{d}", lw=0.8, ls=":")
                if abs(f.get("raw", f["pred"]) - f["pred"]) > 1e-9:  # a calibrated flip layer: q of V~ beside it
                    row[2].scatter(f["raw"], f["real"], s=size, marker="x", color=f"C{d}", zorder=3)
        if run.get("flips_by_q"):
            _curve(row[2], run["flips_by_q"], marker="x", color="0.3", label="binned by q")
        titles = (
            f"{name}: roots, V~ vs bare rollouts",
            f"{name}: prefixes, V~ vs own rollout",
            f"{name}: flips (x: q of V~; ring: V~ recal.)",
        )
        labels = (
            ("predicted V~", "realised success"),
            ("predicted V~", "realised success"),
            ("predicted flip q", "realised flip share"),
        )
        for k, (ax, title, (xl, yl)) in enumerate(zip(row, titles, labels)):
            if k and not run["prefixes"]:
                ax.text(0.5, 0.5, f"{name}: no prefix scored\n(the method does not branch)", ha="center", fontsize=9)
                ax.set_axis_off()
                continue
            ax.plot([0, 1], [0, 1], "k:", lw=1)
            ax.set(xlim=(0, 1), ylim=(0, 1), aspect="equal", xlabel=xl, ylabel=yl)
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6.5, loc="upper left")
    return _save(fig, "Reliability against outcomes no allocation choice biased (dotted: perfect)", path)


def _num(x: float, fmt: str = "{:.3f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _bound_cells(flip: dict) -> list[str]:
    """The realised flip share's 95% interval and the reading of the bound on it, as two table cells."""
    lo, hi = flip["real_lo"], flip["real_hi"]
    return [f"[{lo:.3f}, {hi:.3f}]", gap_verdict(flip["pred"], lo, hi, FLIP_GAP_BOUND)]


def format_calibration(diagnosis: Diagnosis) -> str:
    """The calibration tables of `diagnose`, one set of blocks per method: V~ reliability (summary over the run
    and its halves, then the bins over the run), the chosen prefixes' flips, and the flips binned by q."""
    blocks = []
    names = depth_names(diagnosis.max_depth)
    for method, by_period in diagnosis.calibration.items():
        run = by_period["run"]
        if not run.get("roots") and not run["prefixes"]:
            blocks.append(f"{method}: no calibration records (predictions.jsonl from before bare outcomes were logged)")
            continue
        wheres = [("roots", lambda t: t.get("roots"))]
        wheres += [(f"depth {dn}", lambda t, dn=dn: t["prefixes"].get(dn)) for dn in names]
        wheres += [("prefixes", lambda t: t["prefixes"].get("all"))]
        blocks.append(_reliability_block(method, by_period, wheres))
        blocks.append(_reliability_bins_block(method, run, wheres))
        blocks += _flips_block(method, by_period, names)
        blocks += _flips_by_outcome_block(method, by_period, names)
        blocks += _flips_by_q_block(method, run)
    return "\n\n".join(blocks)


def _reliability_block(method: str, by_period: dict[str, dict], wheres: list) -> str:
    """V~ against outcomes no choice biased, per where (roots, each depth, all prefixes) and period."""
    rows = []
    for where, get in wheres:
        for label, tab in by_period.items():
            s = get(tab)
            if s:
                rows.append([where, label, f"{s['n']:.0f}", _num(s["pred"]), _num(s["real"]), _num(s["ece"])])
    header = ["where", "period", "n", "predicted", "realised", "ece"]
    title = (
        f"{method}: V~ against outcomes no choice biased (roots: their bare rollouts; prefixes: every "
        "anchor against its own rollout)"
    )
    return "\n".join([title, *_table(header, rows)])


def _reliability_bins_block(method: str, run: dict, wheres: list) -> str:
    """The reliability bins over the run, per where."""
    rows = []
    for where, get in wheres:
        s = get(run)
        for b in s["bins"] if s else []:
            gap = f"{b['real'] - b['pred']:+.3f}"
            rows.append([where, f"{b['lo']:.1f}-{b['hi']:.1f}", f"{b['n']:.0f}", _num(b["pred"]), _num(b["real"]), gap])
    header = ["where", "V~ bin", "n", "predicted", "realised", "realised - predicted"]
    return "\n".join([f"{method}: reliability bins over the run", *_table(header, rows)])


def _flips_block(method: str, by_period: dict[str, dict], names: list[str]) -> list[str]:
    """The flips of the prefixes stage 2 chose, per depth and period: one block, or none without flips."""
    rows = []
    for dn in [*names, "all"]:
        for label, tab in by_period.items():
            f = tab["flips"].get(dn)
            if f:
                where = "prefixes" if dn == "all" else f"depth {dn}"
                preds = [_num(f["pred"]), _num(f.get("raw", f["pred"])), _num(f["recal"]), _num(f["real"])]
                counts = [str(f["chosen"]), str(f["continuations"])]
                rows.append([where, label, *counts, *preds, *_bound_cells(f), _num(f["anchors_pred"])])
    if not rows:
        return []
    header = ["where", "period", "chosen", "continuations", "predicted", "q of V~", "V~ recal.", "realised"]
    header += ["95% interval", f"gap <= {FLIP_GAP_BOUND}", "all anchors"]
    title = (
        f"{method}: flips of the prefixes stage 2 chose (predicted: the q stage 2 allocated on; q of "
        "V~: 1 - V~ after a success, V~ after a failure, the same unless predictor.flip_model="
        "calibrated; V~ recal.: q of V~ with V~ mapped to its bin's realised success; gap <= b: "
        "holds / misses when the realised share's interval lies within / beyond b of the prediction, "
        "too few when the continuations cannot tell; all anchors: mean predicted q of every anchor)"
    )
    return ["\n".join([title, *_table(header, rows)])]


def _flips_by_outcome_block(method: str, by_period: dict[str, dict], names: list[str]) -> list[str]:
    """The same flips split by the anchor's bare outcome: one block, or none without them."""
    rows = []
    for outcome in ("failure", "success"):
        for dn in [*names, "all"]:
            for label, tab in by_period.items():
                f = tab.get("flips_by_outcome", {}).get(outcome, {}).get(dn)
                if f:
                    where = "prefixes" if dn == "all" else f"depth {dn}"
                    cells = [str(f["continuations"]), _num(f["pred"]), _num(f["real"]), *_bound_cells(f)]
                    rows.append([f"after a {outcome}", where, label, *cells])
    if not rows:
        return []
    header = ["bare outcome", "where", "period", "continuations", "predicted", "realised", "95% interval"]
    header.append(f"gap <= {FLIP_GAP_BOUND}")
    title = f"{method}: the same flips by the anchor's bare outcome (a bias can hide in a bin that pools both)"
    return ["\n".join([title, *_table(header, rows)])]


def _flips_by_q_block(method: str, run: dict) -> list[str]:
    """The flips binned by predicted q over the run: one block, or none without them."""
    if not run.get("flips_by_q"):
        return []
    rows = [
        [f"{b['lo']:.1f}-{b['hi']:.1f}", f"{b['n']:.0f}", _num(b["pred"]), _num(b["real"])] for b in run["flips_by_q"]
    ]
    header = ["q bin", "continuations", "predicted", "realised"]
    return ["\n".join([f"{method}: flips by predicted q over the run", *_table(header, rows)])]


def format_p(p: float) -> str:
    """A p-value for people: 3 decimals from 0.001 up, scientific notation below (never a bare 0.000)."""
    if math.isnan(p):
        return "nan"
    if p == 0.0:
        return "<1e-300"  # below what a double holds; the statistic, not the p-value, carries information here
    return f"{p:.3f}" if p >= 1e-3 else f"{p:.1e}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Header, a dashed rule and rows, padded to each column's widest cell (first column left-aligned)."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    return ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in lines]


def format_diagnosis(tables: dict[str, list[dict]]) -> str:
    """The tables `diagnose` returns as text: one block per method, columns aligned."""
    blocks = []
    for method, rows in tables.items():
        if not rows:
            continue
        cols = list(rows[0])
        cells = [
            [
                format_p(r[c])
                if c == "p_value"
                else ("-" if math.isnan(r[c]) else f"{r[c]:.3f}")
                if isinstance(r[c], float)
                else str(r[c])
                for c in cols
            ]
            for r in rows
        ]
        blocks.append("\n".join([method, *_table(cols, cells)]))
    return "\n\n".join(blocks)
