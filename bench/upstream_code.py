"""Upstream's own code for the faithfulness checks, loaded from a file the developer names in an environment variable.

The repository ships no upstream code: the tests and benches that run a port side by side with its authors'
functions load the authors' file, unmodified, from wherever the developer put it, and skip (tests) or say so in
one line (benches) when the variable is unset. docs/baselines.md says which commit and file each variable names
and the commands. Every other check (brute force, optimality conditions, hand-worked cases, and the recorded
upstream outputs under tests/) runs without it.

Loading executes the named file as a module, with the rights of whoever runs the tests: name only a file you
have read (each is a few hundred lines of numpy, scipy or torch).

Some files import their own package (`import verl.utils.torch_functional as verl_F`) or a training stack the
checks never reach (ray workers, a search agent). `load(var, provide=...)` puts the modules the caller names in
`sys.modules` while the file executes and takes them out again: another upstream file loaded from its own
variable (the package sibling the file would import in its repository), or a `stub` whose names refuse to be
called. The file itself is never edited; what each check provides is listed beside it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
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
    "TRACE_RL_TREE_GRPO_REFERENCE": Reference(
        "github.com/AMAP-ML/Tree-GRPO",
        "90b170995d996d772d68117e0c7bd0b8fe00d393",
        "verl/trainer/ppo/core_algos.py",
        ("compute_grpo_outcome_advantage",),
    ),
    "TRACE_RL_TREE_GRPO_TRAINER_REFERENCE": Reference(
        "github.com/AMAP-ML/Tree-GRPO",
        "90b170995d996d772d68117e0c7bd0b8fe00d393",
        "verl/trainer/ppo/ray_trainer_ts.py",
        ("compute_advantage",),
    ),
    "TRACE_RL_TREEPO_REFERENCE": Reference(
        "github.com/multimodal-art-projection/TreePO",
        "f05552394e734ea2838cf9e3b8191f5093319dcf",
        "verl/trainer/ppo/core_algos.py",
        ("compute_tree_reinforce_plus_plus_baseline_outcome_advantage",),
    ),
    "TRACE_RL_TREEPO_WHITEN_REFERENCE": Reference(
        "github.com/multimodal-art-projection/TreePO",
        "f05552394e734ea2838cf9e3b8191f5093319dcf",
        "verl/utils/torch_functional.py",
        ("masked_whiten", "masked_var", "masked_mean"),
    ),
}


def unset_line(var: str) -> str:
    """The one line a check prints or skips with when `var` is unset."""
    ref = REFERENCES[var]
    return f"no upstream code: set {var}=/path/to/{Path(ref.path).name} ({ref.where()}; docs/baselines.md)"


def stub(name: str, *names: str) -> ModuleType:
    """A stand-in for module `name` that an upstream file imports at its top but the checks never reach: each of
    `names` is a class (so `Type[Worker]` and the like still evaluate) that refuses to be instantiated or called."""
    module = ModuleType(name)

    def refuse(cls, *args, **kwargs):
        raise RuntimeError(f"{cls.__module__}.{cls.__name__} is a stand-in: the upstream checks never call it")

    for attr in names:
        setattr(module, attr, type(attr, (), {"__new__": refuse, "__module__": name}))
    return module


def _with_packages(provide: Mapping[str, ModuleType]) -> dict[str, ModuleType]:
    """`provide` plus an empty package for every missing parent, each parent holding its child as an attribute
    (what `import a.b.c as x` and `from a.b import c` look up)."""
    out = dict(provide)
    for dotted in sorted(provide, key=lambda n: n.count(".")):
        parts = dotted.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in out:
                out[parent] = ModuleType(parent)
                out[parent].__path__ = []  # a package, so submodule imports are allowed
    for dotted, module in out.items():
        if "." in dotted:
            parent, child = dotted.rsplit(".", 1)
            setattr(out[parent], child, module)
    return out


def load(var: str, provide: Mapping[str, ModuleType] | None = None) -> ModuleType | None:
    """The module `var` names, or None when it is unset or empty. A path that is not a readable file, a file that
    fails to import or one without the functions the checks call raises ValueError naming the variable.
    `provide`: modules (dotted name -> module) the file imports, in sys.modules while it executes only."""
    ref = REFERENCES[var]
    value = os.environ.get(var, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"{var}={value}: no such file (want {ref.where()})")
    spec = importlib.util.spec_from_file_location(f"upstream_{var.lower()}", path)
    module = importlib.util.module_from_spec(spec)
    provided = _with_packages(provide or {})
    saved = {name: sys.modules.get(name) for name in provided}
    sys.modules.update(provided)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # any failure of a foreign file becomes the one-line setting error
        raise ValueError(f"{var}={value}: importing it failed: {type(exc).__name__}: {exc}") from exc
    finally:  # the stand-ins must not shadow an installed package for the rest of the process
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    missing = [name for name in ref.names if not hasattr(module, name)]
    if missing:
        raise ValueError(f"{var}={value}: defines no {', '.join(missing)}; want {ref.where()}")
    return module
