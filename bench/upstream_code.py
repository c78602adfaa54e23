"""Upstream's own code for the faithfulness checks, loaded from a file the developer names in an environment variable.

The repository ships no upstream code: the tests and benches that run a port side by side with its authors'
functions load the authors' file, unmodified, from wherever the developer put it, and skip (tests) or say so in
one line (benches) when the variable is unset. docs/baselines.md says which commit and file each variable names
and the commands. Every other check (brute force, optimality conditions, hand-worked cases, and the recorded
upstream outputs under tests/) runs without it.

Loading executes the named file as a module, with the rights of whoever runs the tests: name only a file you
have read (each is a few hundred lines of numpy and scipy).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class Reference:
    repo: str
    commit: str
    path: str
    names: tuple[str, ...]  # what the checks call: a file without them is the wrong file

    def where(self) -> str:
        return f"{self.path} of {self.repo} @ {self.commit[:7]}"


REFERENCES = {
    "TRACE_RL_VIP_REFERENCE": Reference(
        "github.com/HieuNT91/VIP",
        "87bedf7f874f1d61741268de28b4f48d39605b84",
        "src/vip/allocation/bernoulli_allocation.py",
        ("allocate_rollout", "solve", "allocation_rounding"),
    ),
    "TRACE_RL_VIP_GP_REFERENCE": Reference(
        "github.com/HieuNT91/VIP",
        "dc365c3af3f5ce24dbe9126c81e4fe52fe640b44",
        "src/vip/success_rate_prediction/gaussian_process.py",
        ("GPR",),
    ),
    "TRACE_RL_KNAPSACK_REFERENCE": Reference(
        "github.com/liziniu/KnapsackRL",
        "ca5d5f5b7e933378d916d05d1aeb4ae9de929ee5",
        "verl/trainer/ppo/exploration_utils.py",
        ("sampling_budget_by_knapsack", "NUMBA_AVAILABLE"),
    ),
}


def unset_line(var: str) -> str:
    """The one line a check prints or skips with when `var` is unset."""
    ref = REFERENCES[var]
    return f"no upstream code: set {var}=/path/to/{Path(ref.path).name} ({ref.where()}; docs/baselines.md)"


def load(var: str) -> ModuleType | None:
    """The module `var` names, or None when it is unset or empty. A path that is not a readable file, a file that
    fails to import or one without the functions the checks call raises ValueError naming the variable."""
    ref = REFERENCES[var]
    value = os.environ.get(var, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"{var}={value}: no such file (want {ref.where()})")
    spec = importlib.util.spec_from_file_location(f"upstream_{var.lower()}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # any failure of a foreign file becomes the one-line setting error
        raise ValueError(f"{var}={value}: importing it failed: {type(exc).__name__}: {exc}") from exc
    missing = [name for name in ref.names if not hasattr(module, name)]
    if missing:
        raise ValueError(f"{var}={value}: defines no {', '.join(missing)}; want {ref.where()}")
    return module
