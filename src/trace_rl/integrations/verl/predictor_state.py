"""The predictor verl's processes share: built once per process from the settings, moved between processes as
bytes of its own checkpoint format (`Predictor.save` / `load`).

The manager (stage 1) and the trainer (the predictor update) live in one process, verl's TaskRunner actor, so
they share one object (`shared_predictor`). The agent-loop workers (stage 2) are other Ray actors: before
each training batch the manager sends them the current weights (`to_bytes` / `load_bytes`). Only weights and
optimiser state travel; the replay window stays with the trainer's copy, the only one that is updated.
"""

from __future__ import annotations

import os
import tempfile

from ...predictors.base import Predictor
from ...predictors.history import RewardHistoryPredictor
from ...predictors.text import light_text_predictor

PREDICTORS = ("light_text", "history")
_shared: dict[tuple[str, int], Predictor] = {}


def build_predictor(name: str, seed: int = 0) -> Predictor:
    if name == "light_text":
        return light_text_predictor(seed=seed)
    if name == "history":
        return RewardHistoryPredictor()
    raise ValueError(f"unknown trace_rl.predictor {name!r}; choose from {', '.join(PREDICTORS)}")


def shared_predictor(name: str, seed: int = 0) -> Predictor:
    """This process's predictor for (name, seed), built on first use."""
    key = (name, seed)
    if key not in _shared:
        _shared[key] = build_predictor(name, seed)
    return _shared[key]


def to_bytes(predictor: Predictor) -> bytes:
    fd, path = tempfile.mkstemp(suffix=".npz")  # np.savez appends .npz to a name without it
    os.close(fd)
    try:
        predictor.save(path)
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        os.unlink(path)


def load_bytes(predictor: Predictor, blob: bytes) -> None:
    fd, path = tempfile.mkstemp(suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        predictor.load(path)
    finally:
        os.unlink(path)
