"""The warm-start cache: its key (seed, code without docstrings, library versions, numerics), one line for an entry
that is not built, a lock that makes concurrent builders build once, and the portable build: a fresh process on one
thread with MKL's and ATen's AVX2 code paths, whose weights do not depend on the parent's thread count."""

import json
import shutil
import threading
from pathlib import Path

import pytest

from trace_rl.errors import ConfigError
from trace_rl.lm import warm_start as ws


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_RL_CACHE", str(tmp_path))
    return tmp_path


def test_names():
    assert ws.parse_tiny("tiny") == 0 and ws.parse_tiny("tiny@3") == 3
    assert ws.parse_tiny("random-tiny") is None and ws.parse_tiny("tiny@") is None and ws.parse_tiny("tiny3") is None


def test_the_code_digest_follows_code_and_defaults_not_comments_or_docstrings(tmp_path):
    root = Path(ws.__file__).resolve().parents[1]
    for rel in ws.SOURCES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, tmp_path / rel)
    base = ws.code_digest(tmp_path)
    assert base == ws.code_digest()
    sft = tmp_path / "train" / "sft.py"
    text = sft.read_text()
    sft.write_text(text.replace('"""Warm start by', '"""A reworded docstring. Warm start by', 1) + "\n# a comment\n")
    assert ws.code_digest(tmp_path) == base
    plumbing = text.replace('print(f"warm start {entry.name}: {entry}")', "print(entry)")
    assert plumbing != text
    sft.write_text(plumbing)  # the command's plumbing, outside the named definitions
    assert ws.code_digest(tmp_path) == base
    sft.write_text(text.replace("final_lr: float = 0.35", "final_lr: float = 0.36"))
    assert ws.code_digest(tmp_path) != base
    sft.write_text(text.replace("def train_sft(", "def train_sft_renamed("))
    with pytest.raises(RuntimeError, match="train_sft"):
        ws.code_digest(tmp_path)


def test_the_key_follows_seed_settings_and_versions(cache, monkeypatch):
    a, b = ws.entry_dir(0), ws.entry_dir(1)
    assert a != b and a.name.startswith("seed0-") and b.name.startswith("seed1-") and a.parent == cache / "tiny-sft"
    assert ws.entry_dir(0, {"steps": 5}).name.startswith("custom-seed0-")
    versions = ws.library_versions()
    monkeypatch.setattr(ws, "library_versions", lambda: {**versions, "transformers": "0.0.1"})
    assert ws.entry_dir(0) != a
    monkeypatch.setattr(ws, "library_versions", lambda: versions)
    assert ws.entry_dir(0) == a
    monkeypatch.setattr(ws, "numerics", lambda: "native-arm64")
    assert ws.entry_dir(0) != a


def test_numerics_are_portable_only_on_x86_64_with_avx2(monkeypatch):
    monkeypatch.setattr(ws.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(ws, "_has_avx2", lambda: True)
    assert ws.numerics() == ws.PORTABLE
    monkeypatch.setattr(ws, "_has_avx2", lambda: False)
    assert ws.numerics() == "native-x86_64"
    monkeypatch.setattr(ws.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(ws, "_has_avx2", lambda: True)
    assert ws.numerics() == "native-arm64"


def test_portable_env_is_set_inside_and_restored(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    with ws.portable_env():
        assert all(ws.os.environ[k] == v for k, v in ws.PORTABLE_ENV.items())
    assert ws.os.environ["MKL_CBWR"] == "COMPATIBLE" and "ATEN_CPU_CAPABILITY" not in ws.os.environ


def test_an_entry_is_read_only_with_its_manifest_and_others_are_named_not_reused(cache, monkeypatch):
    with pytest.raises(ConfigError, match=r"tiny@2 .*not built.*trace-rl sft seed=2"):
        ws.resolve("tiny@2")
    entry = ws.entry_dir(0)
    entry.mkdir(parents=True)
    with pytest.raises(ConfigError, match="not built"):  # a build that never finished: no manifest
        ws.resolve("tiny")
    (entry / ws.MANIFEST).write_text(json.dumps({"key": "k", "report": {"overall": 0.5}, "weights_digest": "w"}))
    assert ws.resolve("tiny") == entry and ws.resolve("tiny@0") == entry
    assert ws.describe(entry)["sft_success"] == 0.5 and ws.describe(entry)["numerics"] is None  # an older entry
    versions = ws.library_versions()
    monkeypatch.setattr(ws, "library_versions", lambda: {**versions, "torch": "9.9"})
    with pytest.raises(
        ConfigError, match=f"holds {entry.name}, made by other code, library versions or numerics, not reused"
    ):
        ws.resolve("tiny")


def test_concurrent_builders_build_once(cache, monkeypatch):
    pytest.importorskip("omegaconf")
    from trace_rl.train import sft

    builds = []

    def fake_train_and_save(cfg, out, yaml_text, manifest=None):
        builds.append(out)
        out.mkdir(parents=True)
        threading.Event().wait(0.2)  # the second builder arrives while the first is building
        (out / ws.MANIFEST).write_text(json.dumps({"key": ws.key_of(manifest), **manifest}))
        return out

    monkeypatch.setattr(sft, "_build_entry", fake_train_and_save)
    monkeypatch.setattr(sft, "_settings", lambda cfg: None)  # the defaults, without their 1,500 steps
    cfg = sft.SFTConfig.__new__(sft.SFTConfig)  # no __post_init__: no model check
    cfg.out, cfg.seed, cfg.policy = "", 0, type("P", (), {"model": "tiny"})()
    got = []
    threads = [threading.Thread(target=lambda: got.append(sft.run_sft(cfg))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and got == [ws.entry_dir(0)] * 2
    assert ws.read_manifest(ws.entry_dir(0))["seed"] == 0
    assert not list(cache.glob("tiny-sft/.*tmp*"))  # built aside, renamed into place


@pytest.mark.skipif(ws.numerics() != ws.PORTABLE, reason="portable numerics need x86-64 with AVX2")
def test_the_portable_build_pins_its_process_and_its_weights_do_not_follow_the_parents_threads(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("omegaconf")
    from trace_rl.train import sft

    threads, digests, env = torch.get_num_threads(), [], {k: ws.os.environ.get(k) for k in ws.PORTABLE_ENV}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            monkeypatch.setenv("TRACE_RL_CACHE", str(tmp_path / f"cache{n}"))
            cfg = sft.SFTConfig(
                seed=1, steps=3, sft=sft.SFTParams(batch_size=4, warmup_steps=1, tasks=16, eval_tasks=4)
            )
            entry = sft.run_sft(cfg)
            manifest = ws.read_manifest(entry)
            assert manifest["numerics"] == ws.PORTABLE and manifest["threads"] == 1
            assert manifest["processor"]["torch_cpu"] == "AVX2"  # the worker ran ATen's AVX2 kernels
            digests.append(manifest["weights_digest"])
    finally:
        torch.set_num_threads(threads)
    assert digests[0] == digests[1] and torch.get_num_threads() == threads
    assert {k: ws.os.environ.get(k) for k in ws.PORTABLE_ENV} == env  # the pins stayed in the worker
