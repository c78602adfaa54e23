"""lab/scripts/fit_flip_prior.py and lab/scripts/replay_flip_layer.py on a hand-written run: the script's prior is the
layer's fit on the run's chosen anchors, read alike from predictions.jsonl and from a run archive, and the
replay under that prior predicts it at step 0."""

import importlib.util
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from trace_rl.experimental.flip import FlipPrior, fit_flip_prior

BENCH = Path(__file__).resolve().parents[2] / "lab" / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDS = [  # two steps of one run: roots, anchors without continuations and chosen anchors
    {"method": "trace", "step": 0, "depth": 0, "predicted": 0.5, "target": 0.0, "leaves": 4},
    {"method": "trace", "step": 0, "depth": 1, "predicted": 0.5, "target": 0.0, "leaves": 2},
    {"method": "trace", "step": 0, "depth": 2, "predicted": 0.5, "bare_reward": 0.0, "continuations": 2, "flips": 1},
    {"method": "trace", "step": 0, "depth": 5, "predicted": 0.5, "bare_reward": 1.0, "continuations": 1, "flips": 0},
    {"method": "trace", "step": 1, "depth": 1, "predicted": 0.8, "bare_reward": 1.0, "continuations": 3, "flips": 1},
    {"method": "trace", "step": 1, "depth": 3, "predicted": 0.3, "bare_reward": 0.0, "continuations": 1, "flips": 0},
]
CHOSEN = [rec for rec in RECORDS if rec.get("continuations")]


@pytest.fixture()
def run(tmp_path):
    jsonl = tmp_path / "trace" / "seed3" / "predictions.jsonl"
    jsonl.parent.mkdir(parents=True)
    jsonl.write_text("".join(json.dumps(rec) + "\n" for rec in RECORDS))
    archive = tmp_path / "trace--seed3.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(jsonl, arcname="trace/seed3/predictions.jsonl")
    return jsonl, archive


def test_the_scripts_prior_is_the_layers_fit_on_the_chosen_anchors(run, tmp_path, monkeypatch):
    fit = _load("fit_flip_prior")
    jsonl, archive = run
    rows = tuple(np.array([rec[key] for rec in CHOSEN]) for key in fit.PER_STEP)
    expected = fit_flip_prior([rows], fit.SIGMA_CELL, fit.SIGMA_SLOPE)
    for source in (jsonl, jsonl.parent, archive):  # a file, a run directory, an archive: the same rows
        (name, steps), *others = fit.read_runs([str(source)]).items()
        assert not others and sorted(steps) == [0, 1] and name.endswith("(trace)")
        assert all(np.array_equal(a, b) for a, b in zip(fit.pooled(steps), rows))
        out = tmp_path / "prior.json"
        monkeypatch.setattr(sys, "argv", ["fit_flip_prior.py", str(out), str(source)])
        fit.main()
        prior = FlipPrior.load(out)
        assert prior.theta == expected.theta and prior.continuations == expected.continuations
        assert prior.runs == (name,)
    with pytest.raises(SystemExit, match="no predictions.jsonl"):
        fit.read_runs([str(tmp_path / "nowhere")])


def test_archives_of_one_name_from_two_studies_stay_two_runs(run, tmp_path):
    fit = _load("fit_flip_prior")
    _, archive = run
    other = tmp_path / "other_study" / archive.name  # the same file name, another study's directory
    other.parent.mkdir()
    other.write_bytes(archive.read_bytes())
    runs = fit.read_runs([str(archive), str(other)])
    assert len(runs) == 2 and all(len(steps) == 2 for steps in runs.values())
    with pytest.raises(SystemExit, match="given twice"):
        fit.read_runs([str(archive), str(archive)])


def test_the_replay_under_a_prior_predicts_it_at_step_0(run, tmp_path, monkeypatch, capsys):
    jsonl, _ = run
    out = tmp_path / "prior.json"
    fit = _load("fit_flip_prior")
    monkeypatch.setattr(sys, "argv", ["fit_flip_prior.py", str(out), str(jsonl)])
    fit.main()
    monkeypatch.syspath_prepend(str(BENCH))  # the replay imports fit_flip_prior as a script would
    replay = _load("replay_flip_layer")
    monkeypatch.setattr(sys, "argv", ["replay_flip_layer.py", "--prior", str(out), str(jsonl)])
    replay.main()
    assert "steps 0-4" in capsys.readouterr().out
    args = type("Args", (), {"prior": str(out), "half_life": 16.0, "check": False})()
    (steps,) = fit.read_runs([str(jsonl)], extra=("flip_pred",)).values()
    data, _ = replay.replay(steps, args)
    step0 = [rec for rec in CHOSEN if rec["step"] == 0]
    r, v, d = (np.array([rec[key] for rec in step0]) for key in ("bare_reward", "predicted", "depth"))
    assert np.allclose(data[data[:, 0] == 0, 4], FlipPrior.load(out).layer().predict(r, v, d), atol=1e-12)
