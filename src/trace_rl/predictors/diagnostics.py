"""Predictor diagnostics over grown trees: how well V~ at allocation time matched what the tree then showed.

For every node the allocator scored (roots, and anchors of tree methods) we pair the prediction with the
node's empirical success V^ (mean reward of the leaves below it). By depth (0 = root): Spearman rank
correlation with its two-sided p-value from `scipy.stats.spearmanr` (the t distribution with n - 2 degrees of
freedom; at n = 10 and rho = 0.6 that is p = 0.067, where a normal approximation would claim 0.034), expected
calibration error (10 equal-width bins, weighted by count) and the Brier score against V^.
Chosen prefixes (anchors that got continuations) also carry their bare rollout's reward r, the number of
continuations and how many flipped (ended unlike r): stage 2's flip probability for one continuation is
1 - V~ after a success and V~ after a failure (or the calibrated layer's, `experimental.flip`, which the node
records), so `flip_rows` sets the predicted flip rate of the chosen prefixes against the realised one, by
depth. Stage 2 picks the prefixes whose predicted flip is highest, so a realised rate below the predicted one
is partly selection (the winner's curse), not only miscalibration.
The p-values treat nodes as independent; prefixes of one tree share leaves, so pooled over prefixes they
overstate significance: read them as "is there any signal", not as calibrated error rates.

SciPy is imported only where a p-value is asked for (`spearman`, `summarize_records`); the per-step scalars a
run logs (`step_diagnostics`) need numpy only, so training never depends on SciPy.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..tree import RolloutTree
from .calibration import ece, reliability


def node_records(trees: Iterable[RolloutTree]) -> list[dict]:
    """(depth, predicted, target, leaves) of every scored node with leaves below it. A root adds bare_rollouts and
    bare_successes (its finished bare rollouts, rewards above 0.5); an anchor adds bare_reward (its rollout's
    reward) and flip_pred (the flip probability stage 2 allocated on, where the tree recorded it), and a chosen
    one (with continuations) continuations and flips. `calibration` reads these."""
    out = []
    for tree in trees:
        anchors = {node.node_id: r for node, r in tree.anchors()}
        for node in tree.nodes.values():
            if node.predicted is not None and node.target is not None and node.leaves > 0:
                rec = {
                    "depth": node.depth,
                    "predicted": float(node.predicted),
                    "target": float(node.target),
                    "leaves": int(node.leaves),
                }
                if node.node_id == tree.root_id:
                    bare = tree.started_rewards(node.node_id)
                    rec.update({"bare_rollouts": len(bare), "bare_successes": int(sum(x > 0.5 for x in bare))})
                elif node.node_id in anchors:
                    r = anchors[node.node_id]
                    rec["bare_reward"] = r
                    if node.flip_predicted is not None:  # the q stage 2 allocated on (from V~ or calibrated)
                        rec["flip_pred"] = float(node.flip_predicted)
                    started = tree.started_rewards(node.node_id)
                    if started:
                        flips = sum((x > 0.5) != (r > 0.5) for x in started)
                        rec.update({"continuations": len(started), "flips": int(flips)})
                out.append(rec)
    return out


def stage2_flip_prob(rec: dict) -> float:
    """The flip probability stage 2 allocated on for an anchor record: its flip_pred, or (records from before
    trees kept it, and stage 2 then read q from V~) 1 - V~ after a success, V~ after a failure."""
    if "flip_pred" in rec:
        return float(rec["flip_pred"])
    return 1.0 - rec["predicted"] if rec["bare_reward"] > 0.5 else rec["predicted"]


def flip_rows(records: list[dict], max_depth: int = 6) -> dict[str, dict]:
    """Per depth bucket (as `summarize_records`: "1".."{max_depth}+", "prefixes"), over the chosen prefixes:
    chosen (how many), continuations, pred_flip (stage 2's flip probability per continuation, averaged over
    continuations: `stage2_flip_prob`) and real_flip (flips / continuations)."""
    chosen = [r for r in records if r.get("continuations")]
    depth = np.array([r["depth"] for r in chosen], dtype=int)
    n = np.array([r["continuations"] for r in chosen], dtype=float)
    flips = np.array([r["flips"] for r in chosen], dtype=float)
    p = np.array([stage2_flip_prob(r) for r in chosen])
    groups = [(str(d), depth == d) for d in range(1, max_depth)] + [
        (f"{max_depth}+", depth >= max_depth),
        ("prefixes", depth >= 1),
    ]
    out = {}
    for name, sel in groups:
        if sel.any():
            out[name] = {
                "chosen": int(sel.sum()),
                "continuations": int(n[sel].sum()),
                "pred_flip": float((p[sel] * n[sel]).sum() / n[sel].sum()),
                "real_flip": float(flips[sel].sum() / n[sel].sum()),
            }
    return out


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    # average the ranks of ties
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return sums[inv] / counts[inv]


def _degenerate(x: np.ndarray, y: np.ndarray) -> bool:
    """Fewer than 3 points or a constant input: rank correlation is undefined."""
    return len(x) < 3 or bool(np.all(x == x[0])) or bool(np.all(y == y[0]))


def spearman_rho(x, y) -> float:
    """Spearman's rho (Pearson correlation of average ranks), numpy only; nan when undefined."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if _degenerate(x, y):
        return float("nan")
    return float(np.corrcoef(_ranks(x), _ranks(y))[0, 1])


def spearman(x, y) -> tuple[float, float]:
    """(rho, two-sided p) from scipy.stats.spearmanr; (nan, nan) when fewer than 3 points or a constant input."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if _degenerate(x, y):
        return float("nan"), float("nan")
    try:
        from scipy.stats import spearmanr
    except ImportError:
        raise ImportError("Spearman p-values need SciPy: pip install scipy") from None
    res = spearmanr(x, y)
    return float(res.statistic), float(res.pvalue)


def calibration_error(pred, target, bins: int = 10) -> float:
    """ECE of `pred` against `target` (equal-width bins weighted by count; `calibration.ece`); nan when empty."""
    return ece(reliability(pred, target, bins=bins))


def brier(pred, target) -> float:
    pred, target = np.asarray(pred, float), np.asarray(target, float)
    return float(np.mean((pred - target) ** 2)) if len(pred) else float("nan")


def summarize_records(records: list[dict], max_depth: int = 6) -> list[dict]:
    """One row per depth bucket (0 = roots; the last bucket holds max_depth and deeper) plus 'all prefixes'."""
    rows = []
    depth = np.array([r["depth"] for r in records], dtype=int)
    pred = np.array([r["predicted"] for r in records])
    targ = np.array([r["target"] for r in records])
    groups = [(str(d), depth == d) for d in range(max_depth)] + [
        (f"{max_depth}+", depth >= max_depth),
        ("prefixes", depth >= 1),
    ]
    for name, sel in groups:
        if not sel.any():
            continue
        rho, p = spearman(pred[sel], targ[sel])
        rows.append(
            {
                "depth": name,
                "n": int(sel.sum()),
                "spearman": rho,
                "p_value": p,
                "ece": calibration_error(pred[sel], targ[sel]),
                "brier": brier(pred[sel], targ[sel]),
            }
        )
    return rows


def step_diagnostics(trees: list[RolloutTree]) -> dict:
    """Per-step scalars for metrics.jsonl: Spearman at roots and over prefixes, ECE and Brier overall."""
    recs = node_records(trees)
    if not recs:
        return {}
    depth = np.array([r["depth"] for r in recs])
    pred = np.array([r["predicted"] for r in recs])
    targ = np.array([r["target"] for r in recs])
    out = {"diag_ece": calibration_error(pred, targ), "diag_brier": brier(pred, targ)}
    for name, sel in (("root", depth == 0), ("prefix", depth >= 1)):
        rho = spearman_rho(pred[sel], targ[sel])
        if not np.isnan(rho):  # undefined (constant input) is left out rather than logged as NaN
            out[f"diag_spearman_{name}"] = rho
    return out
