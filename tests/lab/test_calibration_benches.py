"""lab/scripts/loo_flip_layer.py, lab/scripts/replay_root_layer.py and lab/scripts/root_outcomes.py on hand-written
runs: what each prints is computed from the layers and records it names (the figures in the notes come from these)."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from trace_rl.experimental.flip import FlipPrior, fit_flip_prior
from trace_rl.experimental.root_calibration import RootCalibrator

BENCH = Path(__file__).resolve().parents[2] / "lab" / "scripts"


def _load(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import fit_flip_prior as a script would
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_run(path: Path, seed: int) -> None:
    """Three steps of `trace`: roots with bare outcomes, chosen anchors with continuations and flips."""
    rng = np.random.default_rng(seed)
    recs = []
    for step in range(3):
        for _ in range(4):
            k = int(rng.integers(2, 5))
            recs.append(
                {
                    "method": "trace",
                    "step": step,
                    "depth": 0,
                    "predicted": float(rng.uniform(0.1, 0.9)),
                    "target": 0.5,
                    "leaves": k,
                    "bare_rollouts": k,
                    "bare_successes": int(rng.integers(0, k + 1)),
                }
            )
            c = int(rng.integers(1, 3))
            recs.append({"method": "trace", "step": step, "depth": int(rng.integers(1, 5)),
                         "predicted": float(rng.uniform(0.1, 0.9)), "bare_reward": float(rng.integers(0, 2)),
                         "continuations": c, "flips": int(rng.integers(0, c + 1))})  # fmt: skip
            recs[-2]["leaves"] += c  # a root's leaves: its bare rollouts and the continuations under it
    path.mkdir(parents=True)
    (path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.fixture()
def runs(tmp_path):
    dirs = [tmp_path / "trace" / f"seed{s}" for s in (10, 11, 12)]
    for seed, d in enumerate(dirs):
        _write_run(d, seed)
    return dirs


def test_loo_refits_without_the_held_out_run_and_replays_it(runs, tmp_path, monkeypatch, capsys):
    loo = _load("loo_flip_layer", monkeypatch)
    fit = _load("fit_flip_prior", monkeypatch)
    own = fit.read_runs([str(d) for d in runs])
    names = list(own)
    prior = fit_flip_prior([fit.pooled(own[n]) for n in names[1:]], 1.0, loo.SIGMA_SLOPE)  # the first held out
    data = loo.replay(own[names[0]], prior, 4.0, 1.0)
    r, v, d = (np.concatenate([own[names[0]][0][i]]) for i in range(3))
    assert np.allclose(data[data[:, 0] == 0, 5], prior.layer(4.0).predict(r, v, d), atol=1e-12)  # step 0: the prior
    shipped = tmp_path / "shipped.json"
    fit_flip_prior([fit.pooled(own[n]) for n in names], 0.5, 0.25).save(shipped)
    argv = ["loo_flip_layer.py", "--shipped", str(shipped), "--own", *map(str, runs), "--half-lives", "4"]
    monkeypatch.setattr(sys, "argv", argv + ["--sigmas", "1.0"])
    loo.main()
    out = capsys.readouterr().out
    assert out.count("half-life    4 sigma 1.0") == 2 and "worst 1-3" in out  # shipped and own, no other runs
    monkeypatch.setattr(sys, "argv", ["loo_flip_layer.py", "--shipped", str(shipped), "--own", str(runs[0])])
    with pytest.raises(SystemExit, match="at least two"):
        loo.main()


def test_the_prior_file_carries_the_half_life_the_script_was_given(runs, tmp_path, monkeypatch):
    fit = _load("fit_flip_prior", monkeypatch)
    out = tmp_path / "prior.json"
    monkeypatch.setattr(sys, "argv", ["fit_flip_prior.py", str(out), str(runs[0]), "--half-life", "4"])
    fit.main()
    assert FlipPrior.load(out).half_life == 4.0 and FlipPrior.load(out).layer().half_life == 4.0


def test_the_root_replay_is_the_layer_step_by_step(runs, monkeypatch, capsys):
    replay = _load("replay_root_layer", monkeypatch)
    (steps, *_) = replay.read_roots([str(runs[0])]).values()
    with pytest.raises(SystemExit, match="given twice"):  # one run read twice would merge into one run's steps
        replay.read_roots([str(runs[0]), str(runs[0])])
    data = replay.replay(steps, RootCalibrator(0.5, 0.25, 16.0))
    layer = RootCalibrator(0.5, 0.25, 16.0)
    for step in sorted(steps):
        v, n, s = steps[step]
        assert np.array_equal(data[data[:, 0] == step, 4], layer.predict(v))  # predicted before it observes
        layer.observe(v, n, s)
    grid = ["--sigma-a", "0.5,1", "--sigma-b", "0.25", "--half-lives", "16"]
    monkeypatch.setattr(sys, "argv", ["replay_root_layer.py", *map(str, runs), *grid])
    replay.main()
    out = capsys.readouterr().out
    assert out.startswith("3 runs") and "V~ itself" in out and out.count("half-life   16") == 2


def test_root_outcomes_counts_the_roots_bare_results(runs, monkeypatch, capsys):
    outcomes = _load("root_outcomes", monkeypatch)
    rows = outcomes.root_rows(outcomes.tree_rows(runs[0].parent))
    recs = [json.loads(x) for d in runs for x in (d / "predictions.jsonl").read_text().splitlines()]
    roots = [r for r in recs if r["depth"] == 0]
    assert len(rows) == len(roots) and rows[:, 1].sum() == sum(r["bare_successes"] for r in roots)
    monkeypatch.setattr(sys, "argv", ["root_outcomes.py", str(runs[0].parent)])
    outcomes.main()
    line = capsys.readouterr().out.splitlines()[1].split()
    k, s = rows[:, 0], rows[:, 1]
    assert float(line[3]) == pytest.approx(s.sum() / k.sum(), abs=5e-4)
    assert float(line[4]) == pytest.approx(np.mean(s == 0), abs=5e-4)


def _tree(bare: int, succ: int, target: float, anchors: list[tuple[int, int]]) -> list[dict]:
    cont = sum(c for c, _ in anchors)
    root = {"depth": 0, "predicted": 0.5, "target": target, "leaves": bare + cont, "bare_rollouts": bare,
            "bare_successes": succ}  # fmt: skip
    return [root] + [
        {
            "depth": 1,
            "predicted": 0.5,
            "target": target,
            "leaves": 1,
            "bare_reward": 1.0,
            "continuations": c,
            "flips": f,
        }
        for c, f in anchors
    ]


def test_stage2_split_and_estimate_by_hand(tmp_path, monkeypatch, capsys):
    outcomes = _load("root_outcomes", monkeypatch)
    recs = (
        _tree(3, 3, 1.0, [(2, 0), (1, 0)])  # agreeing, stays so: 3 continuations, no flip
        + _tree(3, 0, 0.2, [(3, 1)])  # agreeing, made mixed by one flip in 3
        + _tree(2, 1, 0.5, [(1, 1), (1, 0)])  # mixed already: 2 continuations, one flip
        + [{"depth": 2, "predicted": 0.5, "target": 0.5, "leaves": 1, "bare_reward": 0.0}]  # an anchor with none
    )
    run = tmp_path / "trace" / "seed100"
    run.mkdir(parents=True)
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = outcomes.tree_rows(run.parent)
    assert rows.tolist() == [[3, 3, 1.0, 3, 0], [3, 0, 0.2, 3, 1], [2, 1, 0.5, 2, 1]]
    f = outcomes.stage2_figures(rows)
    assert f["agreeing"] == pytest.approx(2 / 3) and f["cont_agree"] == 3.0 and f["flip_agree"] == pytest.approx(1 / 6)
    assert f["made_mixed"] == 0.5 and f["cont_mixed"] == 2.0 and f["flip_mixed"] == 0.5
    assert f["ratio"] == pytest.approx(2 / 3)
    # all 8 continuations to the agreeing trees: the all-succeeded one flips at 0, the all-failed one at 1/3,
    # so all 8 go to the latter: (1 mixed + 1 - (2/3)^8) / 3 trees
    assert f["estimate"] == pytest.approx((1 + 1 - (2 / 3) ** 8) / 3)
    monkeypatch.setattr(sys, "argv", ["root_outcomes.py", str(run.parent)])
    outcomes.main()
    assert capsys.readouterr().out.splitlines()[-1].split()[-2:] == ["0.667", f"{f['estimate']:.3f}"]
    (run.parent / "seed101").mkdir()  # a second run: no record crosses from one file to the next
    (run.parent / "seed101" / "predictions.jsonl").write_text("\n".join(json.dumps(r) for r in recs[:3]) + "\n\n")
    assert outcomes.tree_rows(run.parent).tolist() == rows.tolist() + [[3, 3, 1.0, 3, 0]]
    bad = recs[:3] + recs[4:]  # the second tree's root lost: its anchor would land under the first tree
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    with pytest.raises(SystemExit, match="not one tree after another"):
        outcomes.tree_rows(run.parent)


def test_plot_flip_calibration_reads_the_chosen_prefixes_flips_by_depth(runs, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    plot = _load("plot_flip_calibration", monkeypatch)
    compare_dir = runs[0].parent.parent  # <dir>/trace/seed1k: a compare directory's layout
    rows = plot.flips_by_depth(str(compare_dir), "trace")
    anchors = [
        json.loads(line)
        for d in runs
        for line in (d / "predictions.jsonl").read_text().splitlines()
        if json.loads(line)["depth"] > 0
    ]
    for name, row in rows.items():  # the realised share by hand: flips over continuations at that depth
        at = [a for a in anchors if (str(a["depth"]) if a["depth"] < 4 else "4+") == name]
        assert row["continuations"] == sum(a["continuations"] for a in at)
        assert row["real"] == pytest.approx(sum(a["flips"] for a in at) / sum(a["continuations"] for a in at))
        assert row["real_lo"] <= row["real"] <= row["real_hi"]
    assert set(rows) == {str(d) if d < 4 else "4+" for d in (a["depth"] for a in anchors)}
    out = tmp_path / "flip.png"
    plot.main([f"before={compare_dir}", f"after={compare_dir}", "--out", str(out)])
    assert out.stat().st_size > 0 and "wrote" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no records of method 'pcl'"):
        plot.flips_by_depth(str(compare_dir), "pcl")
