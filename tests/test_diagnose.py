import json
import sys

import numpy as np
import pytest

from trace_rl.diagnose import (
    CALIBRATION_PNG,
    RELIABILITY_PNG,
    SPEARMAN_PNG,
    diagnose,
    format_calibration,
    format_diagnosis,
    format_p,
)
from trace_rl.predictors.calibration import gap_verdict
from trace_rl.predictors.diagnostics import spearman, spearman_rho, step_diagnostics, summarize_records
from trace_rl.tree import RolloutTree

# n = 10, sum of squared rank differences 66: rho = 1 - 6 * 66 / 990 = 0.6. The t test with 8 degrees of freedom
# gives p = 0.0667 (t = 2.12 is below the 5% critical value 2.306); a normal approximation of t claims 0.034.
X10 = list(range(10))
Y10 = [1, 4, 2, 3, 8, 5, 0, 7, 6, 9]


def test_spearman_p_value_is_the_t_test_not_a_normal_approximation():
    pytest.importorskip("scipy")  # p-values come from scipy (the plots extra)
    assert sum((a - b) ** 2 for a, b in zip(X10, Y10)) == 66
    rho, p = spearman(X10, Y10)
    assert rho == pytest.approx(0.6)
    assert p == pytest.approx(0.0667, abs=5e-4)


def test_spearman_rho_needs_no_scipy_and_matches_it_with_ties():
    spearmanr = pytest.importorskip("scipy.stats").spearmanr  # the reference; the code under test needs no scipy

    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, 40).astype(float)  # many ties
    y = x + rng.normal(0, 1.5, 40)
    assert spearman_rho(x, y) == pytest.approx(spearmanr(x, y).statistic)
    assert np.isnan(spearman_rho([1, 1, 1], [1, 2, 3])) and np.isnan(spearman_rho([1, 2], [2, 1]))
    assert all(np.isnan(v) for v in spearman([0.5] * 5, [0, 1, 0, 1, 1]))


def test_missing_scipy_gives_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.stats", None)  # makes `from scipy.stats import ...` raise ImportError
    with pytest.raises(ImportError, match="pip install scipy"):
        spearman(X10, Y10)
    tree = RolloutTree(0, predicted=0.5)
    for i, r in enumerate([1.0, 0.0, 1.0]):
        tree.add_turn("0", terminal=True, reward=r, predicted=0.2 + 0.3 * i)
    tree.compute_targets()
    assert "diag_brier" in step_diagnostics([tree])  # the per-step scalars a run logs never need scipy


def test_format_p_never_prints_zero_for_a_tiny_p():
    pytest.importorskip("scipy")  # p-values come from scipy (the plots extra)
    assert format_p(0.0667) == "0.067" and format_p(0.001) == "0.001"
    assert format_p(3.2e-8) == "3.2e-08" and format_p(0.0) == "<1e-300" and format_p(float("nan")) == "nan"
    table = format_diagnosis({"trace": summarize_records(_records(200, np.random.default_rng(1)), max_depth=2)})
    assert "e-" in table and "0.000 " not in table.split("p_value")[1].split("\n")[2]


def _records(n: int, rng: np.random.Generator, method: str = "trace", steps: int = 4) -> list[dict]:
    out = []
    for i in range(n):
        v = rng.uniform()
        out.append(
            {
                "method": method,
                "step": i % steps,
                "depth": i % 4,
                "predicted": v,
                "target": float(np.clip(v + rng.normal(0, 0.2), 0, 1)),
                "leaves": 4,
            }
        )
    return out


def _write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_diagnose_writes_into_out_dir_and_leaves_the_run_alone(tmp_path):
    pytest.importorskip("scipy")  # p-values come from scipy (the plots extra)
    rng = np.random.default_rng(0)
    run = tmp_path / "run"
    _write(run / "predictions.jsonl", _records(300, rng) + _records(120, rng, method="grpo"))
    before = sorted(p.name for p in run.iterdir())
    tables = diagnose(run, max_depth=2, out_dir=tmp_path / "report").tables
    assert sorted(p.name for p in run.iterdir()) == before
    assert (tmp_path / "report" / CALIBRATION_PNG).is_file() and (tmp_path / "report" / SPEARMAN_PNG).is_file()
    assert [r["depth"] for r in tables["trace"]] == ["0", "1", "2+", "prefixes"]
    assert tables["trace"][-1]["n"] == sum(1 for i in range(300) if i % 4)
    assert all(r["p_value"] < 1e-3 for r in tables["trace"])


def test_diagnose_reads_a_multi_seed_run(tmp_path):
    pytest.importorskip("scipy")  # p-values come from scipy (the plots extra)
    rng = np.random.default_rng(1)
    for seed in (0, 1):
        _write(tmp_path / f"seed{seed}" / "predictions.jsonl", _records(200, rng))
    tables = diagnose(tmp_path, max_depth=3).tables
    assert tables["trace"][0]["n"] == 100  # depth 0 of both seeds
    assert (tmp_path / SPEARMAN_PNG).is_file()
    with pytest.raises(FileNotFoundError):
        diagnose(tmp_path / "nope")


def test_flip_calibration_of_chosen_prefixes_by_hand():
    from trace_rl.predictors.diagnostics import flip_rows

    recs = [
        {"depth": 0, "predicted": 0.5, "target": 0.5},
        # depth 1: after a success the flip probability is 1 - V~ = 0.25 (2 continuations, 1 flip)
        {"depth": 1, "predicted": 0.75, "target": 0.5, "bare_reward": 1.0, "continuations": 2, "flips": 1},
        # depth 2: after a failure it is V~ = 0.5 (1 continuation, no flip)
        {"depth": 2, "predicted": 0.5, "target": 0.0, "bare_reward": 0.0, "continuations": 1, "flips": 0},
        {"depth": 2, "predicted": 0.9, "target": 1.0},  # scored, not chosen
    ]
    rows = flip_rows(recs, max_depth=2)
    assert rows["1"] == {"chosen": 1, "continuations": 2, "pred_flip": 0.25, "real_flip": 0.5}
    assert rows["2+"]["pred_flip"] == 0.5 and rows["2+"]["real_flip"] == 0.0
    assert rows["prefixes"]["pred_flip"] == pytest.approx((0.25 * 2 + 0.5) / 3)
    assert rows["prefixes"]["real_flip"] == pytest.approx(1 / 3)


def test_node_records_mark_chosen_prefixes_with_their_flips():
    from trace_rl.predictors.diagnostics import node_records
    from trace_rl.tree import BRANCH, RolloutTree

    t = RolloutTree(0)
    a = t.add_turn(t.root_id, predicted=0.7)
    t.add_turn(a.node_id, terminal=True, reward=1.0)  # the bare rollout succeeds
    t.add_turn(a.node_id, terminal=True, reward=0.0, origin=BRANCH)  # a continuation from a flips
    t.add_turn(a.node_id, terminal=True, reward=1.0, origin=BRANCH)
    t.root.predicted = 0.6
    t.compute_targets()
    recs = {r["depth"]: r for r in node_records([t])}
    assert recs[1]["continuations"] == 2 and recs[1]["flips"] == 1 and recs[1]["bare_reward"] == 1.0
    assert "continuations" not in recs[0]


def test_diagnose_reads_a_compare_directory_per_method_directory(tmp_path):
    pytest.importorskip("scipy")  # p-values come from scipy (the plots extra)
    rng = np.random.default_rng(2)
    for method in ("trace", "trace_adv-grpo"):
        for pair in ("seed0", "ws2-seed0"):  # compare's pair directories, warm starts tiny@0 and tiny@2
            _write(tmp_path / method / pair / "predictions.jsonl", _records(80, rng))  # records say "trace"
    _write(tmp_path / "trace" / "old-seed0" / "predictions.jsonl", _records(80, rng))  # not a pair: not read
    tables = diagnose(tmp_path, max_depth=2).tables
    assert sorted(tables) == ["trace", "trace_adv-grpo"] and tables["trace"][0]["n"] == 40


def _fixture_run(run, late_root_v: float = 0.9) -> None:
    """Four steps of one hand-built trace tree (see tests/predictors/test_calibration.py: hand_tree) and grpo roots;
    from step 2 on the trace root is scored late_root_v instead of 0.6."""
    recs = []
    for step in range(4):
        root_v = 0.6 if step < 2 else late_root_v
        recs += [
            {"depth": 0, "predicted": root_v, "target": 0.5, "leaves": 5, "bare_rollouts": 2, "bare_successes": 1},
            {
                "depth": 1,
                "predicted": 0.7,
                "target": 2 / 3,
                "leaves": 3,
                "bare_reward": 1.0,
                "continuations": 2,
                "flips": 1,
            },
            {"depth": 1, "predicted": 0.2, "target": 0.0, "leaves": 1, "bare_reward": 0.0},
            {
                "depth": 2,
                "predicted": 0.4,
                "target": 0.5,
                "leaves": 2,
                "bare_reward": 0.0,
                "continuations": 1,
                "flips": 1,
            },
        ]
        recs = [{"method": "trace", "step": step, **r} if "method" not in r else r for r in recs]
        recs.append(
            {
                "method": "grpo",
                "step": step,
                "depth": 0,
                "predicted": 0.3,
                "target": 0.25,
                "leaves": 4,
                "bare_rollouts": 4,
                "bare_successes": 1,
            }
        )
    _write(run / "predictions.jsonl", recs)


def test_diagnose_prints_and_draws_the_calibration_of_a_fixture_run(tmp_path):
    pytest.importorskip("scipy")  # p-values come from scipy (the plots extra)
    pytest.importorskip("matplotlib")
    _fixture_run(tmp_path)
    found = diagnose(tmp_path, max_depth=2)
    trace = found.calibration["trace"]
    assert list(trace) == ["run", "early (steps 1-2)", "late (steps 3-4)"]
    assert trace["run"]["roots"]["n"] == 8 and trace["run"]["roots"]["pred"] == pytest.approx(0.75)
    assert trace["early (steps 1-2)"]["roots"]["ece"] == pytest.approx(0.1)
    assert trace["late (steps 3-4)"]["roots"]["ece"] == pytest.approx(0.4)
    assert trace["run"]["prefixes"]["1"]["ece"] == pytest.approx(0.25)  # V~ 0.2 -> failure, 0.7 -> success
    flips = trace["run"]["flips"]["all"]
    assert (
        flips["continuations"] == 12 and flips["pred"] == pytest.approx(1 / 3) and flips["real"] == pytest.approx(2 / 3)
    )
    assert found.calibration["grpo"]["run"]["roots"]["real"] == 0.25 and not found.calibration["grpo"]["run"]["flips"]
    assert (tmp_path / RELIABILITY_PNG).is_file() and tmp_path / RELIABILITY_PNG in found.plots and not found.note
    text = format_calibration(found)
    rows = {tuple(line.split()[:4]) for line in text.splitlines()}
    assert ("roots", "late", "(steps", "3-4)") in rows
    block = next(b for b in text.split("\n\n") if b.startswith("trace: flips of the prefixes stage 2 chose"))
    line = next(x for x in block.splitlines() if x.startswith("prefixes") and " run " in x)
    # chosen .. all anchors; the fixture's records predate flip_pred, so q of V~ is what stage 2 allocated on
    lo, hi = flips["real_lo"], flips["real_hi"]
    assert 0.0 < lo < 2 / 3 < hi < 1.0  # 12 continuations: the interval says what they can show
    assert line.split()[1:] == ["run", "8", "12", "0.333", "0.333", "0.000", "0.667", f"[{lo:.3f},", f"{hi:.3f}]"] + [
        *gap_verdict(1 / 3, lo, hi).split(),
        "0.300",
    ]
    assert "flips by predicted q" in text and "grpo: reliability bins over the run" in text
    by_r = trace["run"]["flips_by_outcome"]  # split by the bare outcome, the pieces add up to the whole
    assert sum(by_r[o]["all"]["continuations"] for o in by_r) == 12
    block = next(b for b in text.split("\n\n") if b.startswith("trace: the same flips by the anchor's bare outcome"))
    for outcome, f in by_r.items():
        line = next(
            x for x in block.splitlines() if x.startswith(f"after a {outcome}") and " prefixes " in x and " run " in x
        )
        assert line.split()[4:8] == [
            "run",
            str(f["all"]["continuations"]),
            f"{f['all']['pred']:.3f}",
            f"{f['all']['real']:.3f}",
        ]


def test_diagnose_without_matplotlib_writes_no_plot_and_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("scipy")  # p-values come from scipy (the plots extra)
    from trace_rl.cli import main

    _fixture_run(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    found = diagnose(tmp_path, max_depth=2)
    assert found.plots == [] and "matplotlib" in found.note and not list(tmp_path.glob("*.png"))
    assert found.calibration["trace"]["run"]["flips"]  # the tables do not need it
    assert main(["diagnose", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "flips of the prefixes stage 2 chose" in captured.out
    assert captured.err.strip() == found.note


def test_records_from_before_the_bare_outcomes_get_the_older_tables_only(tmp_path):
    pytest.importorskip("scipy")  # p-values come from scipy (the plots extra)
    _write(tmp_path / "predictions.jsonl", _records(40, np.random.default_rng(3)))
    found = diagnose(tmp_path, max_depth=2)
    assert found.tables["trace"] and not found.calibration["trace"]["run"]["prefixes"]
    assert "no calibration records" in format_calibration(found)
