"""Strict JSON for every file a run writes: a value that is not a finite number (NaN, an infinity; a standard
error of one sample is NaN, GRPO's flip rate over no continuation is NaN) is written as null, so `jq`, browsers
and other strict readers take the file. Python's json module writes bare `NaN` and `Infinity` by default, which
no JSON standard allows; `dumps` maps them first and then asks json for strict output (`allow_nan=False`), so a
value it missed fails loudly here rather than in a reader.

Numpy scalars and arrays are written as the Python numbers and lists they hold. A reader that needs the NaN back
maps null to NaN itself (`rollout.records.read_metrics` does so for metrics). Part of the core: the standard
library only, so every layer, the trees' writer included, writes through it. numpy is never imported here: a numpy
value can only exist once numpy is loaded, so `finite` looks numpy up in `sys.modules` (importing the configuration,
which writes trees, stays numpy-free).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every non-finite float (also inside dicts, lists and tuples, and numpy's) replaced by None."""
    if isinstance(value, float):  # np.float64 is a float too
        return value if math.isfinite(value) else None
    np = sys.modules.get("numpy")  # None while numpy is not loaded: then no value here is numpy's
    if np is None:
        return _finite_containers(value)
    if isinstance(value, np.generic):  # np.float32, np.int64, np.bool_: their Python value, then as above
        return finite(value.item())
    if isinstance(value, np.ndarray):
        return finite(value.tolist())
    return _finite_containers(value)


def _finite_containers(value: Any) -> Any:
    """`finite` of a dict, list or tuple (element by element); any other value unchanged."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps as strict JSON (NaN and infinities become null); `kwargs` go to json.dumps (indent, default,
    sort_keys, ...), except allow_nan, which is always False."""
    kwargs.pop("allow_nan", None)
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def write_json(path: str | Path, obj: Any, indent: int | None = 2, **kwargs: Any) -> Path:
    """Write `obj` to `path` as strict JSON (`dumps`), with a final newline; returns the path."""
    path = Path(path)
    path.write_text(dumps(obj, indent=indent, **kwargs) + "\n", encoding="utf-8")
    return path
