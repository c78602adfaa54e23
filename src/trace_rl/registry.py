"""Registries of TRACE's parts, found by name the way environments are (`envs/registry.py`): root allocators,
prefix allocators, advantage estimators, predictors and the methods composed of them.

Each entry is a frozen dataclass with a `name` and a one-line `description`. A `Registry` finds an entry, in this
order:
1. an entry object itself (a method may carry its own strategy rather than a name);
2. one registered in this process (`Registry.register`; a registered name wins over a built-in);
3. a built-in: the entry, or its 'module:attr' imported only when chosen (so a method's numpy allocators, an
   experimental method or a testbed predictor never load for a command that does not use them);
4. `module:attr`, imported from `sys.path` (one file of one's own: `method=my_methods:fancy`); the entry is
   renamed to that reference, so records and tables say what the config said.

The rest of the package reads an entry's fields and flags (`PrefixStrategy.branches`, `PredictorEntry.exact`, ...)
and never compares a name: adding a strategy, a predictor or a method edits no file of trace-rl.

Limits: a name is resolved once per process and kept, so a module edited while a process runs is not re-read; an
import error inside an existing module is raised as is (it is that module's bug or missing package, not a wrong
name). This module is the standard library only: the built-ins' code is named by strings.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


def load_target(target: str) -> Any:
    """`module:attr` imported; one line for a module that is not there or has no such attribute."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{target!r} is not module:attr")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        # the module itself (or its package) is missing, not something it imports
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise ValueError(f"no module {module_name!r} on the Python path (from {target!r})") from None
        raise
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ValueError(f"module {module_name} has no {attr!r}") from None
    return obj


def call(fn: Callable | str, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, where `fn` may be named as 'module:attr' (a built-in's code, imported on use)."""
    return (load_target(fn) if isinstance(fn, str) else fn)(*args, **kwargs)


class Registry(Mapping, Generic[T]):
    """Entries of one kind by name (see the module's doc). As a mapping, its keys are the names it knows without a
    module path (registered and built in); `ref in registry` and `registry[ref]` also take `module:attr`."""

    def __init__(self, what: str, kind: type, builtins: Mapping[str, Any] | None = None, hint: str = ""):
        self.what, self.kind, self.hint = what, kind, hint  # e.g. "root strategy", RootStrategy
        self._builtins = dict(builtins or {})
        self._registered: dict[str, Any] = {}
        self._resolved: dict[str, Any] = {}

    def register(self, entry: T, name: str | None = None) -> T:
        """Make `entry` available in this process as `name` (default: its own; another name renames it, so records
        say what the config said). Returns the entry, so it can decorate."""
        self._check(entry, repr(name or getattr(entry, "name", entry)))
        key = name or entry.name
        if dataclasses.is_dataclass(entry) and entry.name != key:
            entry = dataclasses.replace(entry, name=key)
        self._registered[key] = entry
        self._resolved.pop(key, None)
        return entry

    def unregister(self, name: str) -> None:
        """Forget what `register` added as `name` (a test's cleanup); a built-in stays."""
        self._registered.pop(name, None)
        self._resolved.pop(name, None)

    def _check(self, entry: Any, where: str) -> None:
        if not isinstance(entry, self.kind):
            raise ValueError(
                f"{where} is a {type(entry).__name__}, not a {self.what}: give a {self.kind.__module__}."
                f"{self.kind.__name__}"
            )

    def resolve(self, ref: Any) -> T:
        """The entry `ref` stands for (an entry, a name or module:attr), or one ValueError line naming the
        choices."""
        if isinstance(ref, self.kind):
            return ref
        if not isinstance(ref, str) or not ref:
            raise ValueError(f"unknown {self.what} {ref!r}; choose from {', '.join(self)}{self.hint}")
        if ref in self._resolved:
            return self._resolved[ref]
        if ref in self._registered:
            entry = self._registered[ref]
        elif ref in self._builtins:
            entry = self._builtins[ref]
            entry = load_target(entry) if isinstance(entry, str) else entry
            self._check(entry, f"the built-in {ref!r}")
        elif ":" in ref:
            entry = load_target(ref)
            self._check(entry, ref)
            if dataclasses.is_dataclass(entry) and getattr(entry, "name", ref) != ref:
                entry = dataclasses.replace(entry, name=ref)  # named as the config names it
        else:
            raise ValueError(
                f"unknown {self.what} {ref!r}; choose from {', '.join(self)}, or module:attr for one of "
                f"one's own{self.hint}"
            )
        self._resolved[ref] = entry
        return entry

    def __getitem__(self, ref: str) -> T:
        try:
            return self.resolve(ref)
        except ValueError as err:
            raise KeyError(str(err)) from None

    def __contains__(self, ref: object) -> bool:
        try:
            self.resolve(ref)
        except ValueError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._builtins, *self._registered]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*self._builtins, *self._registered]))


# ---- the entries: what a strategy, an estimator and a predictor are


@dataclass(frozen=True)
class RootStrategy:
    """Stage 1: how a step's rollouts are spread over the candidate pool.

    `allocate(v, budget, plan, seed) -> m`: V~ of each candidate (the pool, in order), the rollouts to spend, the
    `BudgetPlan` (`plan.prompts` is P, `plan.max_per_prompt` the cap), a seed; returns rollouts per candidate
    (an int array as long as v; 0 skips a candidate)."""

    name: str
    description: str
    allocate: Callable | str
    reads_value: bool = False  # reads V~ of the roots (so predictor.root_model's recalibration applies)


@dataclass(frozen=True)
class PrefixStrategy:
    """Stage 2: how a prompt's continuations are spread over the anchors of its bare rollouts.

    `allocate(flip_prob, budget, rng, cost, rollout_cost) -> n`: the flip probability of each anchor, the
    continuations to spend, the prompt's random stream, and (with `priced`) each anchor's cost and a whole
    rollout's; returns continuations per anchor. Not called when `branches` is False. A ValueError it raises is a
    phrase that follows the method's name ("prices continuations: ...")."""

    name: str
    description: str
    allocate: Callable | str | None = None
    branches: bool = True  # spends part of the budget on continuations (a tree method)
    priced: bool = False  # reads each anchor's cost (`RolloutTree.anchor_costs`): the row count varies
    pooled: bool = False  # one allocation over the step's prompts (`rollout.grow.PooledStage2`), local only


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator: `per_tree(tree, **kw) -> {leaf id: advantage}`; `batch(trees, **kw)`, when set,
    normalises across a step's trees (treepo's whitening) instead of one tree at a time."""

    name: str
    description: str
    per_tree: Callable | str
    batch: Callable | str | None = None

    def __call__(self, tree: Any, **kwargs: Any) -> dict:
        return call(self.per_tree, tree, **kwargs)


@dataclass(frozen=True)
class PredictorEntry:
    """A V~: `build(settings, seed) -> Predictor` on LM agents (settings: the predictor group or
    `trace_config.PredictorSettings`; None: not on LM agents), `testbed(env, tasks, policy, settings, seed) ->
    Predictor` on the synthetic testbed (None: the testbed's learned logistic on turn features)."""

    name: str
    description: str
    build: Callable | str | None = None
    testbed: Callable | str | None = None
    exact: bool = False  # reads the exact V, which only the testbed has
    kind: bool = True  # a choice of `predictor.kind` (False: only a method's own, e.g. VIP's GP)
    probe: Callable | str | None = None  # probe(settings): what it needs is there, once before any work


# ---- the registries, with their built-ins (code named by strings; experimental ones in trace_rl.experimental)

_M, _X = "trace_rl.methods", "trace_rl.experimental.strategies"

ROOTS: Registry[RootStrategy] = Registry(
    "root strategy",
    RootStrategy,
    {
        "uniform": RootStrategy("uniform", "the pool's first P prompts, rollouts spread evenly", f"{_M}:uniform_roots"),
        "pcl": RootStrategy("pcl", "the P prompts with V~ nearest 1/2, rollouts spread evenly", f"{_M}:pcl_roots"),
        "knapsack": RootStrategy(
            "knapsack", "Knapsack RL's allocation over the first P prompts, as its code runs", f"{_M}:knapsack_roots"
        ),
        "vip": RootStrategy(
            "vip", "VIP's allocation over the first P prompts, as its trainer calls it", f"{_M}:vip_roots"
        ),
        "active": RootStrategy(
            "active",
            "TRACE's exact root allocation: the pool's prompts by expected contrast of their groups",
            f"{_M}:active_roots",
            reads_value=True,
        ),
        "knapsack_repaired": f"{_X}:KNAPSACK_REPAIRED",
        "active_rows": f"{_X}:ACTIVE_ROWS",
        "active_grad": f"{_X}:ACTIVE_GRAD",
        "active_grad_unscaled": f"{_X}:ACTIVE_GRAD_UNSCALED",
    },
)

PREFIXES: Registry[PrefixStrategy] = Registry(
    "prefix strategy",
    PrefixStrategy,
    {
        "none": PrefixStrategy("none", "no continuations: every rollout is a bare one (a flat method)", branches=False),
        "random": PrefixStrategy("random", "continuations at uniformly random anchors", f"{_M}:random_prefixes"),
        "active": PrefixStrategy(
            "active", "TRACE's exact stage 2: continuations where an outcome is likely to flip", f"{_M}:active_prefixes"
        ),
        "cost": f"{_X}:COST",
        "mix": f"{_X}:MIX",
    },
)

_A = "trace_rl.advantages"
ADVANTAGES: Registry[Estimator] = Registry(
    "advantage estimator",
    Estimator,
    {
        "grpo": Estimator("grpo", "reward minus the prompt's mean (flat GRPO)", f"{_A}:grpo"),
        "tree_grpo": Estimator("tree_grpo", "Tree-GRPO's inter- plus intra-tree terms, as its code", f"{_A}:tree_grpo"),
        "tree_grpo_nested": Estimator(
            "tree_grpo_nested", "trace-rl's earlier Tree-GRPO variant (nested groups)", f"{_A}:tree_grpo_nested"
        ),
        "treepo": Estimator(
            "treepo", "TreePO's mean over prefixes, whitened over the step", f"{_A}:treepo", f"{_A}:treepo_batch"
        ),
        "trace": Estimator(
            "trace", "a node's V^ against its siblings' at each branching, plus a root term", f"{_A}:trace"
        ),
    },
)

_P, _T = "trace_rl.predictors.build", "trace_rl.testbed.predictors"
PREDICTORS: Registry[PredictorEntry] = Registry(
    "predictor",
    PredictorEntry,
    {
        "light": PredictorEntry("light", "hashed n-grams of the text + online logistic", f"{_P}:build_light"),
        "history": PredictorEntry(
            "history", "each prompt's reward history (Knapsack RL's)", f"{_P}:build_history", f"{_T}:history_predictor"
        ),
        "gp": PredictorEntry(
            "gp",
            "VIP's Gaussian process on prompt embeddings",
            f"{_P}:build_gp",
            f"{_T}:gp_predictor",
            kind=False,
            probe=f"{_P}:probe_gp",
        ),
        "oracle": PredictorEntry(
            "oracle", "the exact V (the testbed only)", None, f"{_T}:oracle_predictor", exact=True, kind=False
        ),
    },
    hint=" (predictor.kind also takes an LM critic backbone: a name, a path or a hub id)",
)
