"""Checkpoints that never load wrongly: `out/global_step_N/` is written under a temporary name and renamed
when complete, so a directory with that name is always whole (a kill at any moment leaves at most a
`.tmp-*` directory, which is ignored and removed). `keep_last` bounds the disk.

A checkpoint holds what the next step reads: the policy (`save_pretrained`), the optimizer state, the
predictor (pickled: numpy state, its replay window and random stream), the trainer state (the step, which is
also the data position: pools are drawn per step from the run's seed), the RNG states of python, numpy and
torch, and the resolved config. Pickles are read back only from the run's own directory; never load a
checkpoint from a source you do not trust.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
from pathlib import Path

import numpy as np

_NAME = re.compile(r"^global_step_(\d+)$")


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
    for f in tmp.iterdir():  # on disk before the rename makes the checkpoint visible
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in checkpoints(root)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-global_step_*"):  # left by a process killed while writing
        shutil.rmtree(stale, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model, optimizer) -> tuple[object, dict]:
    """Restore the model's weights, the optimizer and the RNG states in place; (predictor, trainer state)."""
    import torch
    from safetensors.torch import load_file

    weights = path / "model.safetensors"
    state_dict = load_file(weights) if weights.exists() else torch.load(path / "pytorch_model.bin")
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if unexpected or any("lm_head" not in k for k in missing):  # a tied lm_head is not saved separately
        raise ValueError(
            f"{path}: the checkpoint does not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    with open(path / "predictor.pkl", "rb") as fh:
        predictor = pickle.load(fh)
    with open(path / "rng.pkl", "rb") as fh:
        rng = pickle.load(fh)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return predictor, json.loads((path / "trainer_state.json").read_text())
