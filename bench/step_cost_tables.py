"""The tables of `bench/step_cost.py`: one step's cost record (`StepCost`), the paired ratios to GRPO over seeds,
the comparison of batching policies, the fit of a call's cost against its rows, and the stored run's file (a
`--json` file, printed again with `--from`). Reads stored runs without building any model (only `trace_rl.stats`)."""

from __future__ import annotations

import gzip
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

PARTS = ("generate", "env", "predictor", "allocate", "other")


@dataclass
class StepCost:
    """One measured step of one method: its wall split into PARTS (plus `overlap`, subtracted), and its work."""

    method: str
    seed: int
    step: int
    wall: float
    parts: dict
    overlap: float
    rollouts: int
    tokens: int
    rounds: int
    call_tokens: int  # tokens the recorded calls returned: the step's own count, if every call was seen
    prompt_tokens: int
    cached_tokens: int
    batching: str = "round"
    update: float | None = None
    reference_tps: float | None = None
    stages: dict = field(default_factory=dict)  # first bare end and first/last stage-2 start, seconds into the step
    calls: list = field(default_factory=list)  # (rows, decode iterations, seconds) of each backend call

    @property
    def busy_share(self) -> float | None:
        """Achieved tokens/s over one batch's tokens/s (None without a reference call)."""
        if not self.reference_tps or self.wall <= 0:
            return None
        return self.tokens / self.wall / self.reference_tps


def row_scaling(calls: list[tuple[int, int, float]], least_iterations: int = 4) -> tuple[float, int] | None:
    """How a call's cost per decode iteration grows with its rows, as the exponent b of rows^b fitted by least
    squares on logs over `calls`, (rows, decode iterations, seconds) each (those of at least `least_iterations`
    iterations), and how many calls it rests on:
    b = 1, each row costs its own (the engine is saturated); b = 0, a call costs the same whatever its rows (the
    engine waits on something other than its rows: latency, launch overhead). None with fewer than 3 calls or a
    single row count."""
    import math

    pts = [(math.log(r), math.log(sec / it)) for r, it, sec in calls if it >= least_iterations and sec > 0]
    if len(pts) < 3 or len({x for x, _ in pts}) < 2:
        return None
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return slope, len(pts)


def _mean(xs):
    return sum(xs) / len(xs)


def summarize(rows: list[StepCost], base: str = "grpo") -> list[dict]:
    """Per method: means over its steps, and the ratios to `base` paired by seed (each seed's mean step against
    the base's on the same pools) with a 95% interval over seeds: wall, tokens, and wall over tokens."""
    from trace_rl.stats import mean_ci

    methods = list(dict.fromkeys(r.method for r in rows))
    seeds = sorted({r.seed for r in rows})
    by = {(m, s): [r for r in rows if r.method == m and r.seed == s] for m in methods for s in seeds}
    table = []
    for m in methods:
        mine = [r for r in rows if r.method == m]
        wall = _mean([r.wall for r in mine])
        row = {
            "method": m,
            "wall": wall,
            "tokens": _mean([r.tokens for r in mine]),
            "rollouts": _mean([r.rollouts for r in mine]),
            "rounds": _mean([r.rounds for r in mine]),
            "cached": sum(r.cached_tokens for r in mine) / max(sum(r.prompt_tokens for r in mine), 1),
            "parts": {p: _mean([r.parts[p] for r in mine]) / wall for p in PARTS},
            "overlap": _mean([r.overlap for r in mine]) / wall,
        }
        busy = [r.busy_share for r in mine if r.busy_share is not None]
        row["busy_share"] = _mean(busy) if busy else None
        updates = [r.update for r in mine if r.update is not None]
        row["update"] = _mean(updates) if updates else None
        if base in methods and all(by[(m, s)] and by[(base, s)] for s in seeds):
            ratios = {"wall_ratio": [], "token_ratio": [], "excess": [], "round_ratio": []}
            for s in seeds:
                mine, theirs = by[(m, s)], by[(base, s)]
                w = _mean([r.wall for r in mine]) / _mean([r.wall for r in theirs])
                t = _mean([r.tokens for r in mine]) / _mean([r.tokens for r in theirs])
                ratios["wall_ratio"].append(w), ratios["token_ratio"].append(t), ratios["excess"].append(w / t)
                ratios["round_ratio"].append(_mean([r.rounds for r in mine]) / _mean([r.rounds for r in theirs]))
                if all(r.update is not None for r in mine[-1:] + theirs[-1:]):  # a training step: rollouts + update
                    full = (w * _mean([r.wall for r in theirs]) + mine[-1].update) / (
                        _mean([r.wall for r in theirs]) + theirs[-1].update
                    )
                    ratios.setdefault("full_excess", []).append(full / t)
            for key, xs in ratios.items():
                row[key] = mean_ci(xs) if len(xs) > 1 else (xs[0], xs[0], xs[0])
        table.append(row)
    return table


def across_batchings(rows: list[StepCost], base: str = "round") -> list[str]:
    """For each other batching policy: each method's step wall over its own under `base`, paired by seed."""
    from trace_rl.stats import mean_ci

    lines = []
    for batching in dict.fromkeys(r.batching for r in rows if r.batching != base):
        parts = []
        for m in dict.fromkeys(r.method for r in rows):
            ratios = []
            for seed in sorted({r.seed for r in rows}):
                mine = [r.wall for r in rows if (r.method, r.seed, r.batching) == (m, seed, batching)]
                ref = [r.wall for r in rows if (r.method, r.seed, r.batching) == (m, seed, base)]
                if mine and ref:
                    ratios.append(_mean(mine) / _mean(ref))
            if ratios:
                mean, lo, hi = mean_ci(ratios) if len(ratios) > 1 else (ratios[0],) * 3
                parts.append(f"{m} {mean:.2f} [{lo:.2f}, {hi:.2f}]")
        lines.append(f"step wall, {batching} over {base} (paired by seed): " + "; ".join(parts))
    return lines


def format_table(table: list[dict], base: str = "grpo") -> str:
    """The printed table: one line per method, the paired ratios to `base` with their intervals over seeds."""
    head = (f"{'method':<18} {'step s':>7} {'tokens':>8} {'wall/' + base:>18} {'tokens/' + base:>9} "
            f"{'(wall/tokens)/' + base:>24} {'calls':>6} {'cached':>6} {'busy':>5}  "
            f"{'gen/env/pred/alloc/other %':<26} {'update s':>8}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in table:
        ci = lambda k, r=r: f"{r[k][0]:.2f} [{r[k][1]:.2f},{r[k][2]:.2f}]" if k in r else "-"  # noqa: E731
        parts = "/".join(f"{100 * r['parts'][p]:.0f}" for p in PARTS)
        busy = f"{r['busy_share']:.2f}" if r["busy_share"] is not None else "-"
        update = f"{r['update']:.2f}" if r["update"] is not None else "-"
        tok = f"{r['token_ratio'][0]:.2f}" if "token_ratio" in r else "-"
        lines.append(f"{r['method']:<18} {r['wall']:>7.2f} {r['tokens']:>8,.0f} {ci('wall_ratio'):>18} {tok:>9} "
                     f"{ci('excess'):>24} {r['rounds']:>6.1f} {100 * r['cached']:>5.0f}% {busy:>5}  "
                     f"{parts:<26} {update:>8}")  # fmt: skip
    return "\n".join(lines)


def goal_line(table: list[dict], method: str = "trace", slack: float = 1.1, rounds: bool = True) -> str:
    """Whether `method`'s step costs no more than its tokens (wall ratio <= token ratio x slack); with `rounds`
    (round batching, where a call is a round), what the ratio would be if every call cost the same."""
    row = next((r for r in table if r["method"] == method and "excess" in r), None)
    if row is None:
        return f"goal: {method} or grpo not measured"
    mean, lo, hi = row["excess"]
    verdict = "holds" if mean <= slack else "missed"
    line = (f"goal ({method} wall/grpo <= tokens/grpo x {slack}): {verdict}: wall/tokens ratio {mean:.2f} "
            f"[{lo:.2f}, {hi:.2f}] over seeds; wall ratio {row['wall_ratio'][0]:.2f}, against "
            f"{row['token_ratio'][0]:.2f} if a call cost what its tokens cost")  # fmt: skip
    if rounds:
        line += f", {row['round_ratio'][0]:.2f} if every round cost the same"
    if "full_excess" in row:
        mean, lo, hi = row["full_excess"]
        line += f"; with the step's update: wall/tokens ratio {mean:.2f} [{lo:.2f}, {hi:.2f}]"
    return line


def stored(row: StepCost) -> dict:
    """A step as the JSON file keeps it: its calls only under round batching (what the fit reads), so a stored
    run of continuous batching (a call per episode turn) stays small."""
    out = asdict(row)
    if row.batching != "round":
        out["calls"] = []
    return out


def report(rows: list[StepCost], batchings: list[str], sync: float | None = None) -> dict:
    """Print the tables of measured (or stored) steps, one per batching policy, and what explains them."""
    tables = {}
    for batching in batchings:
        tables[batching] = table = summarize([r for r in rows if r.batching == batching])
        print(f"\nbatching={batching}\n{format_table(table)}\n{goal_line(table, rounds=batching == 'round')}")
    for line in across_batchings(rows, batchings[0]):
        print(line)
    fit = row_scaling([c for r in rows if r.batching == "round" for c in r.calls])
    if fit is not None:
        print(f"the engine's cost per decode iteration grows as rows^{fit[0]:.2f} (round batching's {fit[1]} calls; "
              "1: each row costs its own, 0: a call costs the same whatever its rows)")  # fmt: skip
    if sync is not None:
        print(f"one weight sync into the engine: {sync:.2f} s")
    return tables


def reprint(path: str) -> dict:
    """The tables of a stored run (`--json`'s file), printed again without measuring anything."""
    try:
        raw = Path(path).read_bytes()
        if len(raw) > 64 << 20:
            raise ValueError(f"{len(raw):,} bytes, past the 64 MiB a stored run may hold")
        run = json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)
        rows = [StepCost(**{**s, "calls": [tuple(c) for c in s.get("calls", [])]}) for s in run["steps"]]
        batchings = run["args"]["batchings"]
    except (OSError, ValueError, KeyError, TypeError, EOFError) as err:
        sys.exit(f"step_cost: --from {path}: not a stored step_cost run ({err})")
    print(f"stored run {path}: {' '.join(run.get('settings', []))}")
    return report(rows, batchings, run.get("sync"))
