"""The predictor verl's processes share: built once per process from the settings by the one predictor builder
(`predictors.build`: the method's own V~, else `trace_rl.predictor.kind`), moved between processes as bytes of
its own checkpoint format (`Predictor.save` / `load`).

The manager (stage 1) and the trainer (the predictor update) live in one process, verl's TaskRunner actor, so
they share one object (`shared_predictor`). The agent-loop workers (stage 2) are other Ray actors: before
each training batch the manager sends them the current weights (`to_bytes` / `load_bytes`). Only weights and
optimiser state travel; the replay window stays with the trainer's copy, the only one that is updated.
"""

from __future__ import annotations

import os
import tempfile

from ...predictors.base import Predictor
from ...predictors.build import build_predictor
from ...trace_config import TraceConfig

_shared: dict[tuple[str, str, float, int], Predictor] = {}


def shared_predictor(config: TraceConfig, seed: int = 0) -> Predictor:
    """This process's predictor for the configuration's method and predictor settings and `seed`, built on first
    use."""
    key = (config.method, config.predictor.kind, config.predictor.prefix_share, seed)
    if key not in _shared:
        _shared[key] = build_predictor(config.predictor, config.method_spec, seed)
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
