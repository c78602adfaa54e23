"""bench/gpu_check.py on CPU: the dry mode runs the training part for real (random-tiny, float32: one step with a
checkpoint, resumed for a second) and writes its table as JSON; the run checks pass a correct float32 run, a KL a
hair below zero included, and each spoiled figure fails its own check; the preflight refuses in one line."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # gpu_check imports its parts by name
    spec.loader.exec_module(module)  # runs nothing: main() is behind __name__ == "__main__"
    return module


gpu_check = _load("gpu_check")
train_part = _load("gpu_check_train")


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """The dry mode's training part, once: (exit code, the JSON document, the float32 run folder)."""
    root = tmp_path_factory.mktemp("dry")
    args = ["--device", "cpu", "--model", "random-tiny", "--parts", "train", "--dtypes", "float32"]
    rc = gpu_check.main([*args, "--out", str(root / "runs"), "--json", str(root / "check.json")])
    return rc, json.loads((root / "check.json").read_text()), root / "runs" / "float32"


def test_the_dry_mode_passes_and_writes_every_check_with_its_tolerance(dry):
    rc, doc, _ = dry
    assert rc == 0 and doc["passed"] and doc["device"] == "cpu"
    checks = {r["check"]: r for r in doc["checks"]}
    assert all(r["passed"] and r["tolerance"] for r in doc["checks"]), doc["checks"]
    assert checks["train float32: resumed from global_step_1 (first record kept, one new)"]["value"] == [0, 1]
    assert checks["train float32: step 0: sampler-to-update k3 KL (float32)"]["tolerance"] == "-1e-06 <= KL < 0.0001"
    figs = doc["figures"]["train float32"]
    assert figs["generate_tokens_per_s"] > 0 and figs["update_tokens_per_s"] > 0 and figs["peak_gpu_gib"] is None


def spoiled(run: Path, tmp_path: Path, **changes) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    recs = train_part.records(copy)
    recs[0].update(changes)
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return copy


def test_a_correct_float32_run_passes_with_rounding_below_zero(dry, tmp_path):
    run = dry[2]
    assert all(ok for ok, *_ in train_part.check_run(run, "float32", "cpu"))
    # the k3 KL is >= 0 exactly; float32 rounding gave -2.2e-10 on a correct run, which the old check failed
    rounded = train_part.check_run(spoiled(run, tmp_path, **{"train/approx_kl": -2.2e-10}), "float32", "cpu")
    assert all(ok for ok, *_ in rounded)
    assert train_part.kl_agrees(-1e-6, "float32") and not train_part.kl_agrees(-1.1e-6, "float32")
    assert not train_part.kl_agrees(float("nan"), "float32") and not train_part.kl_agrees(None, "bfloat16")
    assert train_part.kl_agrees(1.9e-3, "bfloat16") and not train_part.kl_agrees(1.9e-3, "float32")


@pytest.mark.parametrize(
    "changes, failing",
    [
        ({"train/approx_kl": 0.01}, "k3 KL"),  # a sampler in another dtype than the update
        ({"train/approx_kl": -1e-3}, "k3 KL"),  # below zero by more than rounding: a bug, not noise
        ({"train/clip_frac": 0.05}, "clip_frac"),
        ({"train/policy_tokens": 0.0}, "policy tokens"),
        ({"train/update_kl": float("inf")}, "finite"),
    ],
)
def test_a_spoiled_figure_fails_its_check(dry, tmp_path, changes, failing):
    checks = train_part.check_run(spoiled(dry[2], tmp_path, **changes), "float32", "cpu")
    assert [c for ok, c, *_ in checks if not ok] == [next(c for _, c, *_ in checks if failing in c and "step 0" in c)]


def test_a_missing_step_and_another_device_fail(dry):
    assert not all(ok for ok, *_ in train_part.check_run(dry[2], "float32", "cpu", steps=3))
    device = [ok for ok, c, *_ in train_part.check_run(dry[2], "float32", "cuda") if "policy.device" in c]
    assert device == [False]  # the run recorded cpu


def test_preflight_refuses_a_cpu_only_torch_and_a_torch_without_a_gpu(monkeypatch):
    import torch

    if torch.version.cuda is None:
        with pytest.raises(gpu_check.Refusal, match="is a CPU-only build"):
            gpu_check.preflight("cuda")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(gpu_check.Refusal) as err:
        gpu_check.preflight("cuda")
    assert "sees no GPU" in str(err.value) and "\n" not in str(err.value)
    assert gpu_check.preflight("cpu")["torch"] == torch.__version__  # the dry mode needs no GPU


def test_a_model_that_is_not_here_and_bad_options_are_one_line(tmp_path, capsys):
    assert gpu_check.main(["--device", "cpu", "--model", str(tmp_path / "none"), "--json", str(tmp_path / "j")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--model must be tiny" in err and not (tmp_path / "j").exists()
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--dtypes", "float16"])


def test_missing_packages_install_from_the_carried_wheels_or_are_named(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda n, *a: None if n == "omegaconf" else real(n, *a))
    with pytest.raises(gpu_check.Refusal) as err:
        gpu_check.ensure_packages(tmp_path)  # no wheels there
    assert "lacks omegaconf==2.4.0" in str(err.value) and "\n" not in str(err.value)
