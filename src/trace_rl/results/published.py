"""The published tables: what each README and results-index table reads from the store, and how it prints.

Each table is a function of stored studies (`results.store`), named in `TABLES`; `trace-rl report` prints them and
rewrites the blocks of the documents that show them (`<!-- report:NAME -->` ... `<!-- /report -->`), and a docs
test checks that each block equals what the store gives. The statistics are the product's own: paired runs of a
compare study (`train.compare`: accuracy curves, equal-token reading), paired percentile-bootstrap intervals and t
intervals (`rollout.report`), the testbed's seed statistics (`testbed.report`) and stage 2's flip calibration
(`predictors.calibration`).

Choices, stated: LM rows pair the runs both methods finished on evaluation seeds (100 and up, where no default was
chosen); accuracy differences are in points (x100), one decimal, bold where the 95% interval excludes zero; the
effective-ratio column is the ratio of the two methods' mean effective ratios over the same pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..predictors.calibration import calibration_tables, depth_names, gap_verdict
from ..rollout.report import at_equal_cost, interval, paired_interval, run_means
from ..testbed.report import seed_statistics
from ..train.compare import FIRST_EVALUATION_SEED, curves
from .store import ANCHOR_COLUMNS, StoreError, read_store, records_as_nan

MINUS = "\u2212"
FOCUS = "trace"  # the method the testbed table reads every other against (and shows in bold)


class MissingRuns(LookupError):
    """A table's runs are not in the store: which study, method and what to run to make them."""


@dataclass(frozen=True)
class Arm:
    """One side of a comparison: a method's runs in a stored study, and the name a table gives it."""

    study: str
    method: str


@dataclass(frozen=True)
class Study:
    """A stored study: the command that makes its runs, and the methods (and which of them keep stage 2's chosen
    prefixes) the store keeps."""

    command: str
    methods: tuple[str, ...]
    anchors: tuple[str, ...] = ()


_SEEDS = "seeds=100,101,102,103,104,105,106,107 warm_starts=0,2 workers=2"
STUDIES: dict[str, Study] = {
    "testbed_accuracy": Study(
        "trace-rl simulate seeds=0,1,2,3,4,5,6,7 out=runs/testbed_accuracy",
        ("grpo", "pcl", "knapsack_rl", "treepo", "tree_grpo", "trace", "trace_oracle"),
    ),
    "lm_regime": Study(
        f"trace-rl compare out=runs/lm_regime methods=grpo,trace,pcl,vip train.env.calculator.preset=rl {_SEEDS}",
        ("grpo", "trace", "pcl", "vip"),
    ),
    "lm_default": Study(
        "trace-rl compare out=runs/lm_default methods=grpo,trace,pcl,vip,trace_uniform,trace_root_only,"
        f"trace_prefix_only {_SEEDS}",
        ("grpo", "trace", "pcl", "vip", "trace_uniform", "trace_root_only", "trace_prefix_only"),
        anchors=("trace",),
    ),
    "lm_calibrated": Study(
        "trace-rl compare out=runs/lm_calibrated methods=trace train.predictor.flip_model=calibrated "
        "train.predictor.root_model=calibrated "
        f"train.predictor.flip_prior=examples/configs/priors/flip-prior-tiny0.json {_SEEDS}",
        ("trace",),
        anchors=("trace",),
    ),
}


class Stores:
    """The stored studies under one folder, each read once, as {method: {pair: run}} (evaluation seeds only)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._read: dict[str, dict[str, dict[str, dict]]] = {}

    def path(self, study: str) -> Path:
        return self.folder / f"{study}.jsonl.gz"

    def runs(self, arm: Arm, evaluation_only: bool = True) -> dict[str, dict]:
        if arm.study not in self._read:
            if not self.path(arm.study).is_file():
                raise MissingRuns(f"no stored study {arm.study!r} ({self.path(arm.study)}): {_make(arm.study)}")
            try:
                lines = read_store(self.path(arm.study))
            except StoreError as err:
                raise MissingRuns(str(err)) from None
            by_method: dict[str, dict[str, dict]] = {}
            for line in lines:
                run = {**line["summary"], "pair": line["pair"], "warm": line["warm"]}
                run["records"] = records_as_nan(line["records"])
                run["anchors"] = [dict(zip(ANCHOR_COLUMNS, a)) for a in line.get("anchors", [])]
                by_method.setdefault(line["method"], {})[line["pair"]] = run
            self._read[arm.study] = by_method
        found = self._read[arm.study].get(arm.method, {})
        if evaluation_only:
            found = {p: r for p, r in found.items() if r["seed"] >= FIRST_EVALUATION_SEED}
        if not found:
            raise MissingRuns(f"study {arm.study!r} holds no run of {arm.method!r}: {_make(arm.study)}")
        return found

    def paired(self, a: Arm, b: Arm) -> tuple[list[dict], list[dict]]:
        ra, rb = self.runs(a), self.runs(b)
        common = sorted(set(ra) & set(rb))
        if not common:
            raise MissingRuns(f"{a.study}/{a.method} and {b.study}/{b.method} share no finished pair")
        return [ra[p] for p in common], [rb[p] for p in common]


def _make(study: str) -> str:
    known = STUDIES.get(study)
    return f"make it with `{known.command}`, then `trace-rl report keep=runs/{study}`" if known else "unknown study"


# -- number formats ------------------------------------------------------------------------------------------
def points(v: dict, bold: bool = True) -> str:
    """An accuracy difference {mean, lo, hi} in points: '+0.2 [−0.4, +1.0]', bold where the interval excludes 0."""
    text = f"{100 * v['mean']:+.1f} [{100 * v['lo']:+.1f}, {100 * v['hi']:+.1f}]".replace("-", MINUS)
    return f"**{text}**" if bold and (v["lo"] > 0 or v["hi"] < 0) else text


def signed(v: dict, digits: int = 3) -> str:
    return f"{v['mean']:+.{digits}f} [{v['lo']:+.{digits}f}, {v['hi']:+.{digits}f}]".replace("-", MINUS)


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


# -- LM tables -----------------------------------------------------------------------------------------------
def lm_difference(stores: Stores, a: Arm, b: Arm) -> dict:
    """a − b over their common pairs: final accuracy (equal rollouts), accuracy at equal tokens, effective ratios."""
    ra, rb = stores.paired(a, b)
    final = paired_interval([r["accuracy_after"] for r in ra], [r["accuracy_after"] for r in rb])
    tokens = paired_interval(*zip(*[at_equal_cost(curves(x)["tokens"], curves(y)["tokens"]) for x, y in zip(ra, rb)]))
    er_a = run_means([r["records"] for r in ra], "rollout/effective_ratio")
    er_b = run_means([r["records"] for r in rb], "rollout/effective_ratio")
    return {"pairs": len(ra), "final": final, "tokens": tokens, "er_a": er_a, "er_b": er_b}


PEERS = [
    ("paper's regime, `env.calculator.preset=rl`", "lm_regime", "trace", "TRACE", ("grpo", "pcl", "vip")),
    ("default, 3-5-step chains", "lm_default", "trace", "TRACE", ("grpo", "pcl", "vip")),
]


PEER_HEADER = ["task (pairs)", "a − b", "effective ratio a / b", "equal rollouts", "equal tokens"]


def peer_row(stores: Stores, task: str, label: str, a: Arm, b: Arm) -> list[str]:
    """One row of a peers table: a − b over their common pairs (`lm_difference`), `label` naming a."""
    d = lm_difference(stores, a, b)
    ratio = np.mean(d["er_a"]) / np.mean(d["er_b"])
    return [
        f"{task} ({d['pairs']})",
        f"{label} {MINUS} {b.method.upper()}",
        f"{ratio:.2f}x",
        points(d["final"]),
        points(d["tokens"]),
    ]


def lm_peers(stores: Stores) -> str:
    rows = [
        peer_row(stores, task if i == 0 else task.split(",")[0], label, Arm(study, ours), Arm(study, other))
        for task, study, ours, label, others in PEERS
        for i, other in enumerate(others)
    ]
    return markdown(PEER_HEADER, rows)


def lm_calibrated(stores: Stores) -> str:
    ours = Arm("lm_calibrated", "trace")
    rows = [
        peer_row(stores, "default", "TRACE, calibrated", ours, Arm("lm_default", b)) for b in ("grpo", "pcl", "vip")
    ]
    return markdown(PEER_HEADER, rows)


ABLATION = [
    ("root (`trace_root_only`)", "trace_root_only", "+6.3 / +0.3"),
    ("prefix (`trace_prefix_only`)", "trace_prefix_only", "+4.5 / +0.5"),
    ("both (`trace`)", "trace", "+9.5 / +1.1"),
]


def lm_ablation(stores: Stores) -> str:
    rows = []
    for label, method, paper in ABLATION:
        d = lm_difference(stores, Arm("lm_default", method), Arm("lm_default", "trace_uniform"))
        er = paired_interval(d["er_a"], d["er_b"])
        rows.append([label, paper, points(er, bold=False), points(d["final"]), points(d["tokens"])])
    header = [
        "stage active",
        "paper: effective ratio / accuracy (points)",
        "here: effective ratio (points)",
        "accuracy, equal rollouts",
        "equal tokens",
    ]
    return markdown(header, rows)


def flips_of(stores: Stores, arm: Arm) -> dict[str, dict]:
    anchors = []
    for run in stores.runs(arm).values():
        anchors += [{k: v for k, v in a.items() if v is not None} for a in run["anchors"]]
    if not anchors:
        raise MissingRuns(f"study {arm.study!r}: the runs of {arm.method!r} keep no chosen prefixes")
    return calibration_tables(anchors)["flips"]


def lm_calibration(stores: Stores) -> str:
    """Stage 2's predicted flip share against the realised one, by depth: TRACE's default and both layers."""
    before, after = flips_of(stores, Arm("lm_default", "trace")), flips_of(stores, Arm("lm_calibrated", "trace"))
    rows = []
    for name in depth_names(4):
        b, a = before.get(name), after.get(name)
        if not a or not b:
            continue
        verdict = gap_verdict(a["pred"], a["real_lo"], a["real_hi"])
        shown = f"{a['real']:.3f} [{a['real_lo']:.3f}, {a['real_hi']:.3f}]" + (
            " (too few)" if verdict == "too few" else ""
        )
        rows.append(
            [name, f"{b['pred']:.3f}", f"{b['real']:.3f}", f"{a['pred']:.3f}", shown, f"{a['continuations']:,}"]
        )
    header = ["depth", "before: predicted", "realised", "after: predicted", "realised [95%]", "continuations after"]
    return markdown(header, rows)


# -- the testbed -----------------------------------------------------------------------------------------------
def _reach(v: dict | None, seeds: int, none: str) -> str:
    if not v or not v["reached"]:
        return none
    text = f"{v['mean']:,.0f}"
    return text if v["reached"] == seeds else f"{text} ({v['reached']} of {seeds} seeds)"


def testbed_runs(stores: Stores) -> list[dict[str, list[dict]]]:
    """The testbed study as `testbed.report` reads it: per seed every method holds, {method: its records}."""
    methods = STUDIES["testbed_accuracy"].methods
    by_method = {m: stores.runs(Arm("testbed_accuracy", m), evaluation_only=False) for m in methods}
    seeds = sorted(set.intersection(*(set(r) for r in by_method.values())))
    return [{m: by_method[m][s]["records"] for m in methods} for s in seeds]


def testbed_accuracy(stores: Stores) -> str:
    runs = testbed_runs(stores)
    rows = []
    for row in seed_statistics(runs, focus=FOCUS):
        recs = [run[row["method"]] for run in runs]
        er = interval(run_means(recs, "rollout/effective_ratio"))["mean"]
        groups = sum(r["rollout/contrast_groups"] for rs in recs for r in rs)
        spent = sum(r["rollout/rollouts"] for rs in recs for r in rs)
        name = f"**{row['method']}**" if row["method"] == FOCUS else row["method"]
        rows.append(
            [
                name,
                f"{row['start_accuracy']['mean']:.3f} → {row['final_accuracy']['mean']:.3f}",
                signed(row[f"{FOCUS}_minus"]) if f"{FOCUS}_minus" in row else "-",
                _reach(row.get("rollouts_to_grpo_final"), len(runs), "not reached"),
                _reach(row.get("turns_to_grpo_final"), len(runs), "-"),
                f"{er:.3f}",
                f"{1000 * groups / spent:.0f}",
            ]
        )
    header = [
        "method",
        "accuracy start → end",
        "TRACE − this, equal rollouts",
        "rollouts to GRPO's final",
        "turns to GRPO's final",
        "effective ratio",
        "contrast groups / 1k",
    ]
    return markdown(header, rows)


TABLES: dict[str, Callable[[Stores], str]] = {
    "testbed_accuracy": testbed_accuracy,
    "lm_peers": lm_peers,
    "lm_calibrated": lm_calibrated,
    "lm_ablation": lm_ablation,
    "lm_calibration": lm_calibration,
}
