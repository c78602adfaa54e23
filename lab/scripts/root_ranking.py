"""How well can the roots be ranked, and what would a perfect ranking buy stage 1? Offline, on a TRACE checkpoint.

    trace-rl eval policy.model=runs/X/global_step_20 env.calculator.preset=train limit=256 eval_samples=16 seed=5 \
        out=runs/roots/X-step20
    python lab/scripts/root_ranking.py runs/roots/X-step20 [more eval dirs ...] [--pools 4000] [--out FILE.json]

Each eval directory holds 16 samples of every task under the checkpoint's own policy (`samples.jsonl`); its
config.yaml names the checkpoint, whose `predictor.pkl` (the light predictor, V~) and `trainer_state.json` (the
calibrated root layer, when the run had one) are read. Samples 0-7 (half A) are the only targets anything is
fitted on, and the oracle's values; samples 8-15 (half B) are what every ranking is scored against and what
every allocation's disagreement is estimated with (unbiasedly: the chance that m of a task's 8 half-B outcomes,
drawn without replacement, disagree), so no value is scored on the samples it came from.

Value sources: the oracle (half A's rate), and half B's own rate (allocating on the noise the allocation is
then scored on: optimistic, a ranking no predictor can have); V~ as the run left it, raw and through its root
layer; and three 8-fold cross-validated L2 logistic fits on half A's counts with the same tasks and folds,
differing only in features: the policy's own hidden states (last layer at the prompt's final token and averaged over the
prompt), the light predictor's hashed n-grams and structure, and the task's group (chain length) alone.
For each: Spearman's rho against half B's rate, and over random pools of 32 tasks the expected effective
ratio and mixed prompts of stage 1's exact count allocation (32 bare rollouts, at most 8 a prompt: the
default budget's root share), beside GRPO's 8 prompts x 8 rollouts from the same pools. Stage 2's
continuations are not modelled. Also a sequential stage 1 (`probe_extend`): one probe rollout (the task's
first sample) on each of the k candidates V~ says are likeliest to disagree, then the other 32 - k rollouts
where, given the probe's outcome, they are likeliest to make its group disagree (no Spearman: it ranks
nothing). Needs torch and scipy.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import pickle
from pathlib import Path

import numpy as np

from trace_rl.allocation import allocate_roots
from trace_rl.commands.eval import read_run
from trace_rl.tree import RolloutTree

HALF = 8  # samples per half
POOL, ROOT_BUDGET, MAX_PER_PROMPT, GRPO_PROMPTS, GRPO_GROUP = 32, 32, 8, 8, 8
FOLDS, LAMBDA = 8, 1.0


def load_eval(run: Path) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray, Path, dict]:
    """Tasks, half A's and half B's success counts per task, the first sample's outcome (a probe's), the
    checkpoint and the environment's spec."""
    cfg, spec = read_run(run)
    scores: dict[int, dict[int, float]] = collections.defaultdict(dict)
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        scores[int(r["index"])][int(r["sample"])] = float(r["score"])
    n = max(scores) + 1
    if any(len(scores[i]) < 2 * HALF for i in range(n)):
        raise SystemExit(f"root_ranking: {run} needs {2 * HALF} samples of every task (trace-rl eval eval_samples=16)")
    if n < POOL:
        raise SystemExit(f"root_ranking: {run} has {n} tasks; pools of {POOL} need at least that many (limit=256)")
    bench = next(iter(spec.benchmarks))
    tasks = spec.benchmarks[bench](n)
    ka = np.array([sum(scores[i][s] > 0.5 for s in range(HALF)) for i in range(n)])
    kb = np.array([sum(scores[i][s] > 0.5 for s in range(HALF, 2 * HALF)) for i in range(n)])
    first = np.array([int(scores[i][0] > 0.5) for i in range(n)])
    return tasks, ka, kb, first, Path(cfg.policy.model), spec


def run_values(ckpt: Path, tasks: list[dict]) -> dict[str, np.ndarray]:
    """V~ of every task's root from the checkpoint's predictor, raw and through its root layer if it has one."""
    with open(ckpt / "predictor.pkl", "rb") as fh:
        pred = pickle.load(fh)
    trees = [RolloutTree(i, prompt=t) for i, t in enumerate(tasks)]
    raw = np.asarray(pred.predict([(t, t.root_id) for t in trees]), dtype=np.float64)
    out = {"V~ raw": raw}
    state = json.loads((ckpt / "trainer_state.json").read_text()).get("root_model")
    if state:
        from trace_rl.experimental.root_calibration import RootCalibrator

        layer = RootCalibrator(**{k: state["settings"][k] for k in ("sigma_a", "sigma_b", "half_life")})
        layer.load_state_dict(state)
        out["V~ root layer"] = np.asarray(layer.predict(raw), dtype=np.float64)
    return out


def hidden_features(ckpt: Path, tasks: list[dict], spec) -> np.ndarray:
    """The policy's last hidden layer at the prompt's final token and its mean over the prompt (what the agent
    sees at turn 0: system prompt and question, chat-formatted)."""
    import torch

    from trace_rl.agent.react import ChatFormat, start_episode
    from trace_rl.lm.models import load_model

    model, tok = load_model(str(ckpt))
    fmt = ChatFormat(tok)
    rows = []
    with torch.no_grad():
        for task in tasks:
            ids = start_episode(spec.make(), task, fmt).token_ids
            h = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
            rows.append(torch.cat([h[-1], h.mean(0)]).numpy())
    return np.asarray(rows, dtype=np.float64)


def text_features(tasks: list[dict]) -> np.ndarray:
    from trace_rl.predictors.text import HashedTextFeatures

    trees = [RolloutTree(i, prompt=t) for i, t in enumerate(tasks)]
    return HashedTextFeatures()([(t, t.root_id) for t in trees])


def group_features(tasks: list[dict], spec) -> np.ndarray:
    labels = [spec.group(t) if spec.group else "" for t in tasks]
    names = sorted(set(labels))
    return np.array([[float(lab == n) for n in names] for lab in labels])


def fit_logistic(x: np.ndarray, k: np.ndarray, n: int, lam: float) -> tuple[np.ndarray, float]:
    """L2 logistic on binomial counts (k of n), the intercept unpenalised."""
    from scipy.optimize import minimize
    from scipy.special import expit

    def loss(theta):
        w, b = theta[:-1], theta[-1]
        z = x @ w + b
        # -log L = sum n log(1 + e^z) - k z
        val = np.sum(n * np.logaddexp(0.0, z) - k * z) + 0.5 * lam * w @ w
        p = expit(z)
        g = n * p - k
        return val, np.concatenate([x.T @ g + lam * w, [g.sum()]])

    res = minimize(loss, np.zeros(x.shape[1] + 1), jac=True, method="L-BFGS-B", options={"maxiter": 2000})
    if not res.success:
        raise RuntimeError(f"root_ranking: the logistic fit did not converge ({res.message})")
    return res.x[:-1], float(res.x[-1])


def cross_validated(x: np.ndarray, k: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """Out-of-fold success probabilities: each fold predicted by a fit on the others (features standardised on
    the training folds)."""
    from scipy.special import expit

    out = np.zeros(len(k))
    for f in np.unique(folds):
        train, test = folds != f, folds == f
        mu, sd = x[train].mean(0), x[train].std(0)
        sd[sd == 0] = 1.0
        w, b = fit_logistic((x[train] - mu) / sd, k[train], HALF, LAMBDA)
        out[test] = expit(((x[test] - mu) / sd) @ w + b)
    return out


_BINOM = np.array([[math.comb(n, k) for k in range(HALF + 1)] for n in range(HALF + 1)], dtype=np.float64)


def _choose(n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """C(n, k) elementwise for 0 <= n, k <= 8 (0 where k > n)."""
    return _BINOM[np.asarray(n, dtype=int), np.asarray(k, dtype=int)]


def mixed_prob(kb: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Unbiased estimate from half B of P(a group of m <= 8 rollouts disagrees) = 1 - v^m - (1 - v)^m: the
    chance that m of the 8 outcomes drawn without replacement disagree, 1 - (C(k, m) + C(8 - k, m)) / C(8, m)
    (E C(k, m) / C(8, m) = v^m for k ~ Binomial(8, v))."""
    m = np.asarray(m)
    if (m > HALF).any():
        raise ValueError(f"groups of more than {HALF} rollouts cannot be estimated from {HALF} samples")
    same = (_choose(kb, m) + _choose(HALF - kb, m)) / _choose(np.full(len(kb), HALF), m)
    return np.where(m >= 2, 1.0 - same, 0.0)


def beta_powers(a: np.ndarray, b: np.ndarray, upto: int) -> np.ndarray:
    """E[v^e] under Beta(a_i, b_i) for e = 0..upto: one row per i."""
    j = np.arange(upto)
    steps = (a[:, None] + j) / (a[:, None] + b[:, None] + j)
    return np.concatenate([np.ones((len(a), 1)), np.cumprod(steps, axis=1)], axis=1)


def probe_extend(v: np.ndarray, first: np.ndarray, probes: int, budget: int, strength: float) -> np.ndarray:
    """Extra rollouts per candidate after one probe rollout on the `probes` candidates whose V~ says they are
    likeliest to disagree (largest v(1 - v)); -1 marks a candidate not probed. After its probe's outcome r a
    candidate's group disagrees iff one of its e extra rollouts differs from r: 1 - E[v^e] after a success,
    1 - E[(1 - v)^e] after a failure, under Beta(strength v + r, strength (1 - v) + 1 - r). Each extra
    rollout's gain falls with e, so handing the remaining budget out greedily is exact."""
    order = np.argsort(-(v * (1.0 - v)), kind="stable")[:probes]
    extra = np.full(len(v), -1)
    extra[order] = 0
    a = strength * v[order] + first[order]
    b = strength * (1.0 - v[order]) + 1 - first[order]
    # Beta parameters of the chance that one more rollout repeats the probe's outcome (keeps the group pure)
    same_a = np.where(first[order] == 1, a, b)
    same_b = np.where(first[order] == 1, b, a)
    table = beta_powers(same_a, same_b, MAX_PER_PROMPT - 1)
    e, rows = np.zeros(len(order), dtype=int), np.arange(len(order))
    for _ in range(budget - probes):
        gain = np.where(
            e < MAX_PER_PROMPT - 1, table[rows, e] - table[rows, np.minimum(e + 1, MAX_PER_PROMPT - 1)], -1.0
        )
        best = int(np.argmax(gain))
        if gain[best] <= 0:
            break
        e[best] += 1
    extra[order] = e
    return extra


def probe_mixed(kb: np.ndarray, first: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """Unbiased estimate from half B of P(a probed candidate's group disagrees): 1 - P(all its e extra rollouts
    repeat the probe's outcome) = 1 - C(k_same, e) / C(8, e), k_same half B's count of that outcome."""
    e = np.maximum(extra, 0)
    same = _choose(np.where(first == 1, kb, HALF - kb), e) / _choose(np.full(len(kb), HALF), e)
    return np.where(extra > 0, 1.0 - same, 0.0)


PROBES = (8, 12, 16)  # probe rollouts out of stage 1's 32
PRIOR_STRENGTH = 2.0  # V~ counts as this many rollouts in a probed candidate's prior (not tuned)


def pool_study(
    values: dict[str, np.ndarray], kb: np.ndarray, pools: int, seed: int, first: np.ndarray | None = None
) -> dict[str, dict]:
    """Mean over pools of stage 1's effective ratio and mixed prompts per value source, and GRPO's; with
    `first` (each task's probe outcome), also probe-then-extend on V~ raw."""
    rng = np.random.default_rng(seed)
    groups = collections.defaultdict(list)  # source -> per pool, the disagreement chance of each active prompt
    for p in range(pools):
        pool = rng.choice(len(kb), size=POOL, replace=False)
        groups["GRPO (8 x 8)"].append(mixed_prob(kb[pool[:GRPO_PROMPTS]], np.full(GRPO_PROMPTS, GRPO_GROUP)))
        for name, v in values.items():
            m = allocate_roots(np.clip(v[pool], 0.0, 1.0), ROOT_BUDGET, MAX_PER_PROMPT, seed=p)
            groups[name].append(mixed_prob(kb[pool], m)[m > 0])
        if first is not None and "V~ raw" in values:
            for k in PROBES:
                extra = probe_extend(values["V~ raw"][pool], first[pool], k, ROOT_BUDGET, PRIOR_STRENGTH)
                groups[f"probe {k}, extend {ROOT_BUDGET - k} (V~ raw)"].append(
                    probe_mixed(kb[pool], first[pool], extra)[extra >= 0]
                )
    return {
        name: {
            "ratio": float(np.mean([g.mean() if g.size else 0.0 for g in per_pool])),
            "mixed": float(np.mean([g.sum() for g in per_pool])),
            "prompts": float(np.mean([g.size for g in per_pool])),
        }
        for name, per_pool in groups.items()
    }


def study(run: Path, pools: int) -> dict:
    from scipy.stats import spearmanr

    tasks, ka, kb, first, ckpt, spec = load_eval(run)
    folds = np.random.default_rng(0).permutation(len(tasks)) % FOLDS
    values = {
        "oracle, in-sample (optimistic)": (kb + 0.5) / (HALF + 1.0),  # chosen on the noise it is scored with
        "oracle (half A)": (ka + 0.5) / (HALF + 1.0),
    }
    values.update(run_values(ckpt, tasks))
    values["CV: policy hidden states"] = cross_validated(hidden_features(ckpt, tasks, spec), ka, folds)
    values["CV: hashed n-grams"] = cross_validated(text_features(tasks), ka, folds)
    values["CV: chain length"] = cross_validated(group_features(tasks, spec), ka, folds)
    values["all equal (0.5)"] = np.full(len(tasks), 0.5)
    rho = {n: float(spearmanr(v, kb).statistic) if np.ptp(v) > 0 else 0.0 for n, v in values.items()}
    return {
        "run": str(run),
        "checkpoint": str(ckpt),
        "tasks": len(tasks),
        "success": float((ka + kb).sum() / (2 * HALF * len(tasks))),
        "spearman_vs_half_b": rho,
        "pools": pool_study(values, kb, pools, seed=1, first=first),
    }


def plot(results: list[dict], path: Path) -> None:
    """Three panels, one bar per value source (mean over checkpoints, each checkpoint a dot); GRPO's as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in results[0]["pools"] if n != "GRPO (8 x 8)"]
    panels = [
        ("Spearman vs an independent estimate", lambda r, n: r["spearman_vs_half_b"].get(n, 0.0), None),
        ("stage 1's effective ratio", lambda r, n: r["pools"][n]["ratio"], "ratio"),
        ("mixed prompts a step", lambda r, n: r["pools"][n]["mixed"], "mixed"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), sharey=True)
    y = np.arange(len(names))
    for ax, (title, get, grpo_key) in zip(axes, panels):
        vals = np.array([[get(r, n) for n in names] for r in results])
        ax.barh(y, vals.mean(0), color="#8fb3d9")
        for row in vals:
            ax.plot(row, y, "o", color="#1f4e79", ms=3)
        if grpo_key:
            g = np.mean([r["pools"]["GRPO (8 x 8)"][grpo_key] for r in results])
            ax.axvline(g, color="#c0392b", lw=2, label=f"GRPO 8 x 8: {g:.2f}")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(title, fontsize=10)
    axes[0].set_yticks(y, names, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(f"Ranking the roots, {len(results)} checkpoints: 32 bare rollouts over pools of 32 (stage 1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="trace-rl eval output directories (eval_samples=16)")
    ap.add_argument("--pools", type=int, default=4000, help="random candidate pools per checkpoint")
    ap.add_argument("--out", type=Path, help="write every figure as JSON here too")
    ap.add_argument("--plot", type=Path, help="a PNG: rho, stage 1's effective ratio and mixed prompts by source")
    args = ap.parse_args(argv)
    results = [study(r, args.pools) for r in args.runs]
    if args.plot:
        plot(results, args.plot)
    names = list(results[0]["pools"])
    for res in results:
        print(f"\n{res['run']}  ({res['tasks']} tasks, success {res['success']:.3f}; checkpoint {res['checkpoint']})")
        print(f"  {'values':28s} {'rho vs B':>9s} {'stage-1 ER':>11s} {'mixed/step':>11s} {'prompts':>8s}")
        for n in names:
            p = res["pools"][n]
            rho = res["spearman_vs_half_b"].get(n)
            print(
                f"  {n:28s} {'' if rho is None else f'{rho:+.3f}':>9s} {p['ratio']:11.3f} {p['mixed']:11.2f} "
                f"{p['prompts']:8.1f}"
            )
    if len(results) > 1:
        print(f"\nmean over {len(results)} checkpoints")
        for n in names:
            rhos = [r["spearman_vs_half_b"][n] for r in results if n in r["spearman_vs_half_b"]]
            er = [r["pools"][n]["ratio"] for r in results]
            mixed = [r["pools"][n]["mixed"] for r in results]
            rho_txt = f"{np.mean(rhos):+.3f} [{min(rhos):+.2f}, {max(rhos):+.2f}]" if rhos else ""
            print(
                f"  {n:28s} rho {rho_txt:24s} ER {np.mean(er):.3f} [{min(er):.3f}, {max(er):.3f}]  "
                f"mixed {np.mean(mixed):.2f}"
            )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
