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


def test_numerics_are_portable_only_on_intel_x86_64_with_avx2_and_fma(monkeypatch):
    monkeypatch.setattr(ws.platform, "machine", lambda: "x86_64")
    cpus = {
        ("GenuineIntel", frozenset({"avx2", "fma", "sse2"})): ws.PORTABLE,
        ("GenuineIntel", frozenset({"avx2"})): "native-x86_64",  # ATen's AVX2 kernels use FMA
        ("AuthenticAMD", frozenset({"avx2", "fma"})): "native-x86_64",  # MKL's pinned path is documented for Intel
        ("", frozenset()): "native-x86_64",  # no /proc/cpuinfo
    }
    for (vendor, flags), want in cpus.items():
        monkeypatch.setattr(ws, "cpu_info", lambda v=vendor, f=flags: (v, "model", set(f)))
        assert ws.numerics() == want
    monkeypatch.setattr(ws.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(ws, "cpu_info", lambda: ("GenuineIntel", "m", {"avx2", "fma"}))
    assert ws.numerics() == "native-arm64"
    assert all(f"{k}={v}" in ws.PORTABLE for k, v in ws.PORTABLE_ENV.items())  # a change of pins changes the key


def test_cpu_info_reads_this_machine():
    vendor, model, flags = ws.cpu_info()
    if ws.Path("/proc/cpuinfo").is_file() and ws.platform.machine() == "x86_64":
        assert vendor and "sse2" in flags


def test_run_portable_returns_raises_and_names_a_death():
    assert ws.run_portable("os:getenv", "MKL_CBWR") == "AVX2"  # the worker's environment carries the pins
    assert ws.run_portable("os:getenv", "ATEN_CPU_CAPABILITY") == "avx2"
    with pytest.raises(ValueError, match="invalid literal"):  # an exception in the worker is raised here
        ws.run_portable("builtins:int", "x")
    with pytest.raises(RuntimeError, match="ended with exit code 137 and no result"):  # a death is an error, no wait
        ws.run_portable("os:_exit", 137)


def test_an_entry_is_read_only_with_its_manifest_and_others_are_named_not_reused(cache, monkeypatch):
    # seeds the package does not ship: 1 and 3
    with pytest.raises(ConfigError, match=r"tiny@3 .*not built.*trace-rl sft seed=3"):
        ws.resolve("tiny@3")
    entry = ws.entry_dir(1)
    entry.mkdir(parents=True)
    with pytest.raises(ConfigError, match="not built"):  # a build that never finished: no manifest
        ws.resolve("tiny@1")
    (entry / ws.MANIFEST).write_text(json.dumps({"key": "k", "report": {"overall": 0.5}, "weights_digest": "w"}))
    assert ws.resolve("tiny@1") == entry
    assert ws.describe(entry)["sft_success"] == 0.5 and ws.describe(entry)["numerics"] is None  # an older entry
    versions = ws.library_versions()
    monkeypatch.setattr(ws, "library_versions", lambda: {**versions, "torch": "9.9"})
    with pytest.raises(
        ConfigError, match=f"holds {entry.name}, made by other code, library versions or numerics, not reused"
    ):
        ws.resolve("tiny@1")


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


# a short portable build (seed 1, 3 steps) where these library versions built it: another Intel machine with AVX2
# that runs this test checks that the pins give the same weights there
STORED_BUILD = {
    "versions": {
        "torch": "2.13.0+cpu",
        "transformers": "5.25.0",
        "tokenizers": "0.23.3",
        "safetensors": "0.8.0",
        "numpy": "2.4.6",
    },
    "weights_digest": "3c1f052f4582d559",
}


@pytest.mark.skipif(ws.numerics() != ws.PORTABLE, reason="portable numerics need Intel x86-64 with AVX2")
def test_the_portable_build_pins_its_process_and_its_weights_are_the_stored_ones(tmp_path, monkeypatch):
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
            manifest = ws.read_manifest(sft.run_sft(cfg))
            assert manifest["numerics"] == ws.PORTABLE and manifest["threads"] == 1
            assert manifest["processor"]["torch_cpu"] == "AVX2"  # the worker ran ATen's AVX2 kernels
            digests.append(manifest["weights_digest"])
    finally:
        torch.set_num_threads(threads)
    assert digests[0] == digests[1] and torch.get_num_threads() == threads
    assert {k: ws.os.environ.get(k) for k in ws.PORTABLE_ENV} == env  # the pins stayed in the worker
    versions = ws.library_versions()
    if all(versions.get(k) == v for k, v in STORED_BUILD["versions"].items()):
        assert digests[0] == STORED_BUILD["weights_digest"]


# the shipped warm starts' weights digests, written here apart from warm_start.SHIPPED: a change to either the
# weights or the table fails this test
SHIPPED_DIGESTS = {0: "28583b334b2ee00a", 2: "147fc1a5bcef3f6e"}


def test_the_shipped_warm_starts_resolve_on_any_machine_with_their_pinned_digests(cache, monkeypatch):
    monkeypatch.setattr(ws, "_CHECKED", set())
    monkeypatch.setattr(ws, "numerics", lambda: "native-aarch64")  # another processor, an empty cache: the same bits
    assert ws.SHIPPED == SHIPPED_DIGESTS
    for seed, digest in SHIPPED_DIGESTS.items():
        path = ws.resolve(f"tiny@{seed}")
        assert path == ws.SHIPPED_ROOT / f"tiny-seed{seed}" and ws.weights_digest(path) == digest
        manifest = ws.read_manifest(path)
        assert manifest["weights_digest"] == digest and manifest["seed"] == seed
        assert ws.describe(path)["weights_digest"] == digest
    assert ws.resolve("tiny") == ws.resolve("tiny@0")
    assert not list(cache.iterdir())  # nothing built, nothing cached


def test_a_damaged_or_missing_shipped_warm_start_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(ws, "_CHECKED", set())
    monkeypatch.setattr(ws, "SHIPPED_ROOT", tmp_path)
    with pytest.raises(ConfigError, match=r"tiny@0 is missing from .*reinstall trace-rl"):
        ws.resolve("tiny")
    shutil.copytree(ws.Path(ws.__file__).resolve().parent / "shipped" / "tiny-seed0", tmp_path / "tiny-seed0")
    weights = tmp_path / "tiny-seed0" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"has weights digest \w+, not 28583b334b2ee00a: the file is damaged"):
        ws.resolve("tiny")


def test_a_rebuild_says_whether_it_matches_the_shipped_bits():
    assert "matches the shipped warm start tiny@0 bit for bit" in ws.shipped_verdict(0, SHIPPED_DIGESTS[0])
    other = ws.shipped_verdict(2, "0123456789abcdef")
    assert "(0123456789abcdef) differ from the shipped warm start tiny@2 (147fc1a5bcef3f6e)" in other
    assert "every command still trains from the shipped weights" in other
    assert ws.shipped_verdict(1, "0123456789abcdef") == ""  # a seed the package does not ship


def test_train_starts_from_a_shipped_warm_start_without_building(cache, monkeypatch):
    pytest.importorskip("torch")
    from trace_rl.train import sft, trainer

    monkeypatch.setattr(sft, "run_sft", lambda cfg: pytest.fail("a shipped warm start was built"))
    cfg = type("C", (), {"policy": type("P", (), {"model": "tiny@2"})()})()
    assert trainer.ensure_policy(cfg)["weights_digest"] == SHIPPED_DIGESTS[2]
