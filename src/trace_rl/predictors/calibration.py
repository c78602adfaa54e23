"""Calibration of V~ and of stage 2's flip probability, measured against outcomes no allocation choice biased.

Three measurements, per step (`step_calibration`: `predictor/calib_*` and `predictor/flip_*` in metrics.jsonl)
and pooled over a run (`calibration_tables`, printed and drawn by `trace-rl diagnose`). They read the records
of `diagnostics.node_records`: V~ as the allocator saw it (before the step's predictor update).

- **Roots**: V~(x) against the outcomes of x's bare rollouts, one sample per rollout. How many rollouts a root
  got depends on the predictions only, so within a bin of V~ the outcomes are fair draws.
- **Prefixes**: V~(H) of every anchor (each non-terminal turn of a finished bare rollout; stage 2 scores them
  all, chosen or not) against its own rollout's outcome r. Given H, r is one draw of V(H) and nothing was
  chosen on it. Continuations are left out here: stage 2 picked their anchors by r, so the anchors that got
  them are a biased set (and the leaf mean V^ the older `diagnostics` tables use is biased by them too).
  Anchors of one rollout share r, so a bin counts more samples than independent outcomes.
- **Flips of the chosen prefixes**: the flip probability stage 2 allocated on (q = r(1 - V~) + (1 - r)V~, or
  the calibrated layer's, `experimental.flip`, as the anchor's record says in flip_pred), averaged per
  continuation, against the share of continuations that ended unlike r, by depth. Beside them, per depth: `raw`,
  q from V~ alone (equal to the first with `predictor.flip_model=raw`); the mean allocated q of all anchors
  (what stage 2 chose from: the margin the arg-max bought); and `recal`, q from V~ with V~ replaced by the
  realised success of its bin in the prefix reliability at that depth (what a perfect calibration map of V~
  would have predicted; fitted on the same records, so optimistic).

Why a calibrated V~ still over-predicts flips. If V~ = E[V(H) | what the predictor sees], a continuation from H
flips with probability 2V(1 - V), whose mean is 2V~(1 - V~) - 2 Var(V | what it sees), while the mean of q is
2V~(1 - V~): the gap is twice the variance of V that the features leave unexplained. Per anchor, after a success
P(flip) = 1 - V~ - Var/V~ where q says 1 - V~ (r itself says V(H) is above V~), after a failure V~ - Var/(1 - V~);
and the arg-max, which takes a success's prefix with the lowest V~ and a failure's with the highest, takes the
anchors where that term is largest. So a flip gap beside a small prefix ECE (and that `recal` does not close)
points to what the features cannot see, not to a miscalibrated V~; a gap that `recal` closes points to
calibration.

How many continuations a bin needs before a bound on its gap can be read (`flip_share_interval`,
`gap_verdict`). A depth bin of a run holds tens to hundreds of continuations, and continuations from one anchor
share their prefix, so the realised share carries sampling noise of several points: at a share of 0.3, 62
continuations give a 95% half-width of about 11 points. The interval is Wilson's on the continuations, widened
by the design effect of clustering by anchor (the anchors' ratio-estimator variance over the binomial one, at
least 1). A bound |predicted - realised| <= b is then read three ways: `holds` (the whole interval within b of the
prediction), `misses` (the whole interval beyond b) or `too few` (the data allow both); "every bin within b"
can only be claimed of bins that hold, and refuted by one that misses.

Bins are equal-width (10 by default; a prediction of exactly 1 goes to the last); ECE = sum over bins of
(n_b / n) |mean predicted - mean realised|, weighted by samples. On few samples ECE is biased upwards (noise
alone makes each bin's gap positive): read a step's ECE beside its n. A reward counts as a success above 0.5,
as in the effective ratio and the flip counts. numpy only.
"""

from __future__ import annotations

import numpy as np

STEP_MAX_DEPTH = 4  # per-step metrics pool depths 4 and deeper ("4plus")


def reliability(pred, outcome, weight=None, bins: int = 10) -> list[dict]:
    """Equal-width bins of `pred` in [0, 1]: per non-empty bin, lo, hi, n (summed weight), pred and real (the
    weighted means of `pred` and `outcome`)."""
    pred, outcome = np.asarray(pred, float), np.asarray(outcome, float)
    weight = np.ones_like(pred) if weight is None else np.asarray(weight, float)
    if not pred.shape == outcome.shape == weight.shape:
        raise ValueError(f"reliability: pred, outcome and weight differ in shape ({pred.shape}, {outcome.shape})")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if pred.size and (np.nanmin(pred) < 0 or np.nanmax(pred) > 1 or np.isnan(pred).any()):
        raise ValueError("reliability: predictions must lie in [0, 1]")
    idx = np.minimum((pred * bins).astype(int), bins - 1)
    rows = []
    for b in range(bins):
        sel = (idx == b) & (weight > 0)
        if sel.any():
            w = weight[sel]
            rows.append(
                {
                    "lo": b / bins,
                    "hi": (b + 1) / bins,
                    "n": float(w.sum()),
                    "pred": float((pred[sel] * w).sum() / w.sum()),
                    "real": float((outcome[sel] * w).sum() / w.sum()),
                }
            )
    return rows


def ece(rows: list[dict]) -> float:
    """Expected calibration error of `reliability` rows: their |pred - real| weighted by n; nan when empty."""
    n = sum(r["n"] for r in rows)
    return float(sum(r["n"] * abs(r["pred"] - r["real"]) for r in rows) / n) if n else float("nan")


def summary(pred, outcome, weight=None, bins: int = 10) -> dict:
    """n, mean predicted, mean realised, ECE and the bins of one set of samples ({} when there are none)."""
    rows = reliability(pred, outcome, weight, bins)
    if not rows:
        return {}
    n = sum(r["n"] for r in rows)
    return {
        "n": n,
        "pred": sum(r["n"] * r["pred"] for r in rows) / n,
        "real": sum(r["n"] * r["real"] for r in rows) / n,
        "ece": ece(rows),
        "bins": rows,
    }


def depth_names(max_depth: int) -> list[str]:
    """Prefix depth bins: "1" .. str(max_depth - 1), then f"{max_depth}+"."""
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    return [str(d) for d in range(1, max_depth)] + [f"{max_depth}+"]


def _depth_bin(depth: np.ndarray, max_depth: int) -> np.ndarray:
    return np.minimum(depth, max_depth) - 1  # index into depth_names


def _success(x) -> np.ndarray:
    return (np.asarray(x, float) > 0.5).astype(float)


def _roots(records: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(V~, success share of the bare rollouts, how many) per root that logged its bare rollouts."""
    rs = [r for r in records if r["depth"] == 0 and r.get("bare_rollouts")]
    n = np.array([r["bare_rollouts"] for r in rs], float)
    k = np.array([r["bare_successes"] for r in rs], float)
    return np.array([r["predicted"] for r in rs], float), k / np.maximum(n, 1), n


def _anchors(records: list[dict]) -> list[dict]:
    return [r for r in records if r["depth"] >= 1 and "bare_reward" in r]


def flip_prob(bare_reward, v) -> np.ndarray:
    """q per anchor: 1 - V~ after a success, V~ after a failure (as `allocation.prefix_flip_prob` on 0/1)."""
    r = _success(bare_reward)
    v = np.asarray(v, float)
    return r * (1 - v) + (1 - r) * v


def flip_share_interval(flips, continuations, z: float = 1.96) -> tuple[float, float]:
    """95% interval (z = 1.96) of sum(flips) / sum(continuations) over anchors (one entry per chosen anchor):
    Wilson's score interval on n / deff continuations, deff = max(1, clustered variance / binomial variance)."""
    f = np.asarray(flips, dtype=np.float64)
    c = np.asarray(continuations, dtype=np.float64)
    n = c.sum()
    if f.shape != c.shape or n <= 0:
        return (0.0, 1.0)
    share = f.sum() / n
    binom = share * (1.0 - share) / n
    deff = 1.0
    if c.size > 1 and binom > 0:
        clustered = float(((f - share * c) ** 2).sum()) / n**2  # equals the binomial one for single continuations
        deff = max(1.0, clustered / binom)
    m = n / deff
    centre = (share + z * z / (2 * m)) / (1 + z * z / m)
    half = z / (1 + z * z / m) * np.sqrt(share * (1 - share) / m + z * z / (4 * m * m))
    return (float(max(0.0, centre - half)), float(min(1.0, centre + half)))


def gap_verdict(pred: float, lo: float, hi: float, bound: float = 0.05) -> str:
    """'holds' if the realised interval [lo, hi] lies within `bound` of pred, 'misses' if it lies wholly beyond
    it, 'too few' otherwise (the module docstring)."""
    if pred - bound <= lo and hi <= pred + bound:
        return "holds"
    if lo > pred + bound or hi < pred - bound:
        return "misses"
    return "too few"


def calibration_tables(records: list[dict], max_depth: int = STEP_MAX_DEPTH, bins: int = 10) -> dict:
    """The three measurements of the module docstring over `records`:
    {"roots": summary, "prefixes": {depth name or "all": summary},
     "flips": {depth name or "all": {chosen, continuations, pred, raw, recal, real, real_lo, real_hi,
     anchors_pred}} (real_lo, real_hi: `flip_share_interval`),
     "flips_by_outcome": {"failure" or "success": {depth name or "all": {continuations, pred, real, real_lo,
     real_hi}}} (the same flips split by the anchor's bare outcome r, where a layer's bias can hide in a
     depth bin that pools both),
     "flips_by_q": reliability rows of q against the flip share, weighted by continuations}.
    A piece with no samples is left out."""
    names = depth_names(max_depth)
    out: dict = {"prefixes": {}, "flips": {}, "flips_by_outcome": {}}
    roots = summary(*_roots(records), bins=bins)
    if roots:
        out["roots"] = roots
    anchors = _anchors(records)
    if not anchors:
        return out
    dbin = _depth_bin(np.array([a["depth"] for a in anchors], int), max_depth)
    v = np.array([a["predicted"] for a in anchors], float)
    r = _success([a["bare_reward"] for a in anchors])
    cont = np.array([a.get("continuations", 0) for a in anchors], float)
    flips = np.array([a.get("flips", 0) for a in anchors], float)
    q_raw = flip_prob(r, v)
    q = np.array([a.get("flip_pred", qr) for a, qr in zip(anchors, q_raw)], float)  # what stage 2 allocated on
    # V~ mapped to the realised success of its bin (per depth bin, over all anchors): the recalibrated V~
    v_recal = np.empty_like(v)
    idx = np.minimum((v * bins).astype(int), bins - 1)
    for d, name in enumerate(names):
        sel = dbin == d
        s = summary(v[sel], r[sel], bins=bins)
        if s:
            out["prefixes"][name] = s
        for b in np.unique(idx[sel]):
            cell = sel & (idx == b)
            v_recal[cell] = r[cell].mean()
    out["prefixes"]["all"] = summary(v, r, bins=bins)
    q_recal = flip_prob(r, v_recal)

    def per_continuation(x: np.ndarray, chosen: np.ndarray) -> float:
        """Mean of a per-anchor q over the chosen anchors' continuations."""
        return float((x[chosen] * cont[chosen]).sum() / cont[chosen].sum())

    def flip_cell(chosen: np.ndarray) -> dict:
        """The chosen anchors' continuations, the q stage 2 allocated on and the realised share with its interval."""
        w = cont[chosen]
        lo, hi = flip_share_interval(flips[chosen], w)
        return {
            "continuations": int(w.sum()),
            "pred": per_continuation(q, chosen),
            "real": float(flips[chosen].sum() / w.sum()),
            "real_lo": lo,
            "real_hi": hi,
        }

    depth_sel = [
        (name, np.ones_like(v, bool) if d is None else dbin == d) for d, name in [*enumerate(names), (None, "all")]
    ]
    for name, sel in depth_sel:
        chosen = sel & (cont > 0)
        if chosen.any():
            out["flips"][name] = flip_cell(chosen) | {
                "chosen": int(chosen.sum()),
                "raw": per_continuation(q_raw, chosen),
                "recal": per_continuation(q_recal, chosen),
                "anchors_pred": float(q[sel].mean()),
            }
    for outcome, label in ((0.0, "failure"), (1.0, "success")):
        for name, sel in depth_sel:
            chosen = sel & (r == outcome) & (cont > 0)
            if chosen.any():
                out["flips_by_outcome"].setdefault(label, {})[name] = flip_cell(chosen)
    chosen = cont > 0
    if chosen.any():
        out["flips_by_q"] = reliability(q[chosen], flips[chosen] / cont[chosen], cont[chosen], bins)
    return out


def _key(name: str) -> str:
    return "d" + name.replace("+", "plus")


def step_calibration(records: list[dict], max_depth: int = STEP_MAX_DEPTH, bins: int = 10) -> dict:
    """Flat per-step scalars (metrics.jsonl puts them under predictor/):
    calib_root_{n,pred,real,ece}: V~ of the roots against their bare rollouts (n: rollouts);
    calib_prefix_{n,pred,real,ece} and calib_prefix_d1_{n,pred,real} .. d4plus_*: V~ of every anchor against its
    rollout's outcome (n: anchors);
    flip_{chosen,continuations,pred,raw,real,anchors_pred} and flip_d1_{continuations,pred,real} .. d4plus_*:
    the chosen prefixes' predicted flip probability (as allocated; raw: from V~ alone) against the realised flip
    share (`recal` is left to `diagnose`:
    fitted on one step's few anchors it is mostly the anchors' own outcomes). What a step lacks (no anchor, no
    continuation) is left out rather than logged as NaN."""
    tables = calibration_tables(records, max_depth, bins)
    out: dict = {}
    for where, s in [("root", tables.get("roots")), ("prefix", tables["prefixes"].get("all"))]:
        if s:
            out.update(
                {
                    f"calib_{where}_n": int(round(s["n"])),
                    **{f"calib_{where}_{k}": s[k] for k in ("pred", "real", "ece")},
                }
            )
    for name in depth_names(max_depth):
        s = tables["prefixes"].get(name)
        if s:
            out.update(
                {
                    f"calib_prefix_{_key(name)}_n": int(round(s["n"])),
                    **{f"calib_prefix_{_key(name)}_{k}": s[k] for k in ("pred", "real")},
                }
            )
    f = tables["flips"].get("all")
    if f:
        out.update({f"flip_{k}": f[k] for k in ("chosen", "continuations", "pred", "raw", "real", "anchors_pred")})
    for name in depth_names(max_depth):
        f = tables["flips"].get(name)
        if f:
            out.update({f"flip_{_key(name)}_{k}": f[k] for k in ("continuations", "pred", "real")})
    return out
