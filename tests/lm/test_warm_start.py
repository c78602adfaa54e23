"""The warm-start cache: its key (seed, code without docstrings, library versions), one line for an entry that is
not built, a lock that makes concurrent builders build once, and SFT weights that do not depend on the thread count."""

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


def test_an_entry_is_read_only_with_its_manifest_and_others_are_named_not_reused(cache, monkeypatch):
    with pytest.raises(ConfigError, match=r"tiny@2 .*not built.*trace-rl sft seed=2"):
        ws.resolve("tiny@2")
    entry = ws.entry_dir(0)
    entry.mkdir(parents=True)
    with pytest.raises(ConfigError, match="not built"):  # a build that never finished: no manifest
        ws.resolve("tiny")
    (entry / ws.MANIFEST).write_text(json.dumps({"key": "k", "report": {"overall": 0.5}, "weights_digest": "w"}))
    assert ws.resolve("tiny") == entry and ws.resolve("tiny@0") == entry
    assert ws.describe(entry)["sft_success"] == 0.5
    versions = ws.library_versions()
    monkeypatch.setattr(ws, "library_versions", lambda: {**versions, "torch": "9.9"})
    with pytest.raises(ConfigError, match=f"holds {entry.name}, made by other code or library versions, not reused"):
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

    monkeypatch.setattr(sft, "_train_and_save", fake_train_and_save)
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


def test_sft_weights_do_not_depend_on_the_thread_count():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from trace_rl.envs.calculator import make_tasks
    from trace_rl.lm.models import create_tiny_model
    from trace_rl.train.sft import SFTParams, train_sft

    threads, weights = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            model, tok = create_tiny_model(seed=1)
            params = SFTParams(batch_size=4, warmup_steps=1)
            train_sft(model, tok, make_tasks(32, seed=5), max_steps=4, params=params, seed=1, log_every=0)
            weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(weights[0], weights[1])
