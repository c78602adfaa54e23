"""The predictor verl's processes share: built once per process from the settings by the one predictor builder
(`predictors.build`: the method's own V~, else `trace_rl.predictor.kind`), moved between processes as bytes of
its own checkpoint format (`Predictor.save` / `load`); with them the calibration layers of
`trace_rl.predictor.flip_model` and `root_model` (`shared_layers`), the flip layer's state as JSON bytes.

The manager (stage 1) and the trainer (the predictor update) live in one process, verl's TaskRunner actor, so
they share one object (`shared_predictor`). The agent-loop workers (stage 2) are other Ray actors: before
each training batch the manager sends them the current weights (`to_bytes` / `load_bytes`) and the flip layer's
state (`layer_bytes` / `load_layer`), which stage 2 reads; the root layer is read by the manager alone. Only weights and
optimiser state travel; the replay window stays with the trainer's copy, the only one that is updated.
"""

from __future__ import annotations

import json
import os
import tempfile

from ...predictors.base import Predictor
from ...predictors.build import build_predictor
from ...rollout.engine import calibration_layers
from ...trace_config import TraceConfig

_shared: dict[tuple, Predictor] = {}
_layers: dict[tuple, tuple] = {}


def shared_predictor(config: TraceConfig, seed: int = 0) -> Predictor:
    """This process's predictor for the configuration's method and predictor settings and `seed`, built on first
    use."""
    key = (config.method, config.predictor, seed)
    if key not in _shared:
        _shared[key] = build_predictor(config.predictor, config.method_spec, seed)
    return _shared[key]


def shared_layers(config: TraceConfig, seed: int = 0) -> tuple:
    """This process's (flip, root) calibration layers of the configuration (None where a layer is raw), built on
    first use: the manager reads the root layer, the trainer fits both."""
    key = (config.method, config.predictor, seed)
    if key not in _layers:
        _layers[key] = calibration_layers(config)
    return _layers[key]


def layer_bytes(layer) -> bytes | None:
    """A calibration layer's state (its checkpoint's `state_dict`, JSON) as bytes; None for a raw layer."""
    return None if layer is None else json.dumps(layer.state_dict()).encode("utf-8")


def load_layer(layer, blob: bytes | None) -> None:
    """Restore what `layer_bytes` wrote into `layer` (nothing for a raw layer or no state)."""
    if layer is not None and blob is not None:
        layer.load_state_dict(json.loads(blob.decode("utf-8")))


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
