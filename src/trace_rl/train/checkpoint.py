"""Checkpoints that never load wrongly: `out/global_step_N/` is written under a temporary name and renamed
when complete, so a directory with that name is always whole (a kill at any moment leaves at most a
`.tmp-*` directory, which is ignored and removed). `keep_last` bounds the disk.

A checkpoint holds what the next step reads: the policy (`save_pretrained`), the optimizer state, the
predictor (pickled: numpy state, its replay window and random stream), the trainer state (the step, which is
also the data position: pools are drawn per step from the run's seed), the RNG states of python, numpy and
torch, and the resolved config. Pickles are read back only from the run's own directory; never load a
checkpoint from a source you do not trust.

Damage after the write (a disk that truncates or garbles a file, a copy cut short) is caught on load:
`manifest.json`, written last, lists every file with its size and SHA-256, and `resume_point` skips a
checkpoint whose files do not match it (one line naming the file) for the newest intact one; a skipped one is
renamed `global_step_N.damaged`, kept for a look but no longer counted by `keep_last`. Hashing reads
every byte once per resume, about a second per GB. Checkpoints written before the manifest existed are
accepted with a one-line warning; their damage is still caught where reading a file fails (a truncated
safetensors file, a garbage pickle, broken JSON), not where a file was altered but still parses. Everything is
read before anything is applied, so a damaged checkpoint never leaves a half-restored model; the weights are
held twice in host memory for that moment.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError

_NAME = re.compile(r"^global_step_(\d+)$")
MANIFEST = "manifest.json"


def checkpoints(out: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `out`, oldest first."""
    root = Path(out)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return sorted(found)


def _write_files(path: Path, model, tokenizer, optimizer, predictor, state: dict, config_yaml: str) -> None:
    import torch

    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    with open(path / "predictor.pkl", "wb") as fh:
        pickle.dump(predictor, fh)
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    with open(path / "rng.pkl", "wb") as fh:
        pickle.dump(rng, fh)
    (path / "trainer_state.json").write_text(json.dumps(state, indent=2))
    (path / "config.yaml").write_text(config_yaml)


def save_checkpoint(
    out: str | Path,
    step: int,
    model,
    tokenizer,
    optimizer,
    predictor,
    state: dict,
    config_yaml: str,
    keep_last: int = 2,
) -> Path:
    """Write `out/global_step_{step}` atomically; then drop all but the `keep_last` newest."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{step}"
    tmp = root / f".tmp-global_step_{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _write_files(tmp, model, tokenizer, optimizer, predictor, state, config_yaml)
    for f in tmp.iterdir():  # on disk before the manifest vouches for them
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _write_manifest(tmp, step)  # last: its presence says every other file was complete
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in checkpoints(root)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-global_step_*"):  # left by a process killed while writing
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name != MANIFEST)


def _write_manifest(path: Path, step: int) -> None:
    files = {str(f.relative_to(path)): {"bytes": f.stat().st_size, "sha256": _sha256(f)} for f in _files(path)}
    with open(path / MANIFEST, "w") as fh:
        json.dump({"format": 1, "step": step, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and what is wrong with it."""


def verify_checkpoint(path: Path) -> bool:
    """True when every file matches the manifest; False for a checkpoint without one (written before manifests
    existed); CheckpointError naming the first file that is missing, cut short or altered."""
    manifest = path / MANIFEST
    if not manifest.exists():
        return False
    try:
        files = json.loads(manifest.read_text())["files"]
        entries = [(name, int(e["bytes"]), str(e["sha256"])) for name, e in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{manifest}: unreadable ({type(err).__name__}: {err})") from None
    for name, size, digest in entries:
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{f}: missing")
        if f.stat().st_size != size:
            raise CheckpointError(f"{f}: {f.stat().st_size} bytes, the manifest says {size}")
        if _sha256(f) != digest:
            raise CheckpointError(f"{f}: contents differ from the manifest (SHA-256)")
    return True


@dataclass
class Checkpoint:
    """Everything a checkpoint holds, read into memory and not yet applied."""

    step: int
    path: Path
    weights: dict
    optimizer: dict
    predictor: Any
    rng: dict
    state: dict
    verified: bool  # False: written before manifests existed, read unchecked


def read_checkpoint(path: Path, step: int) -> Checkpoint:
    """Verify and read every file of a checkpoint; CheckpointError names the file that cannot be read."""
    import torch
    from safetensors.torch import load_file

    verified = verify_checkpoint(path)

    def read(name: str, how):
        try:
            return how(path / name)
        except Exception as err:  # noqa: BLE001 - unpickling and deserialising raise anything on garbage
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise CheckpointError(f"{path / name}: unreadable ({type(err).__name__}: {first[:200]})") from None

    def pickled(p: Path):
        with open(p, "rb") as fh:
            return pickle.load(fh)

    safetensors = (path / "model.safetensors").exists()
    weights = read(
        "model.safetensors" if safetensors else "pytorch_model.bin",
        (lambda p: load_file(p, device="cpu")) if safetensors else (lambda p: torch.load(p, map_location="cpu")),
    )
    optimizer = read("optimizer.pt", lambda p: torch.load(p, map_location="cpu", weights_only=False))
    predictor = read("predictor.pkl", pickled)
    rng = read("rng.pkl", pickled)
    state = read("trainer_state.json", lambda p: json.loads(p.read_text()))
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"{path / 'trainer_state.json'}: no step in it")
    if not isinstance(rng, dict) or not {"python", "numpy", "torch"} <= set(rng):
        raise CheckpointError(f"{path / 'rng.pkl'}: not the RNG states of python, numpy and torch")
    return Checkpoint(step, path, weights, optimizer, predictor, rng, state, verified)


def resume_point(out: str | Path, warn: Callable[[str], None] | None = None) -> Checkpoint:
    """The newest checkpoint under `out` that verifies and reads back. Each one skipped, and each one accepted
    without a manifest, costs one line to `warn`; UserError when none is usable."""
    warn = warn or (lambda line: None)
    skipped = []
    for step, path in reversed(checkpoints(out)):
        try:
            ckpt = read_checkpoint(path, step)
        except CheckpointError as err:
            warn(f"skipping a damaged checkpoint: {err}")
            skipped.append(path)
            continue
        if not ckpt.verified:
            warn(f"{path} has no {MANIFEST} (written before checkpoints were verified): loaded unchecked")
        for bad in skipped:  # kept for a look, but out of the way: a later save must not prune a good one for it
            os.replace(bad, _free_name(bad.with_name(f"{bad.name}.damaged")))
        return ckpt
    raise UserError(
        f"out: no usable checkpoint in {out} ({', '.join(p.name for p in skipped)} damaged); move them away to "
        "start over, "
        "or choose another out"
    )


def _free_name(path: Path) -> Path:
    n = 1
    while path.exists():
        n += 1
        path = path.with_name(f"{path.name.split('.damaged')[0]}.damaged{n}")
    return path


def restore(ckpt: Checkpoint, model, optimizer) -> None:
    """Apply a read checkpoint: the model's weights, the optimizer and the RNG states, in place."""
    import torch

    missing, unexpected = model.load_state_dict(ckpt.weights, strict=False)
    if unexpected or any("lm_head" not in k for k in missing):  # a tied lm_head is not saved separately
        raise UserError(
            f"policy.model: the checkpoint {ckpt.path} does not match the model "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); resume with the run's own policy.model"
        )
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    optimizer.load_state_dict(ckpt.optimizer)
    random.setstate(ckpt.rng["python"])
    np.random.set_state(ckpt.rng["numpy"])
    torch.set_rng_state(ckpt.rng["torch"])
    ckpt.weights = {}  # the model holds them now
