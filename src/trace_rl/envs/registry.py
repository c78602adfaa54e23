"""Environments as plug-ins: each environment is an `EnvPlugin` (its name, a dataclass of its own settings, and a
builder from those settings to an `EnvSpec`), found by name. The commands read an `EnvSpec` only, so none of them
names an environment: adding one edits no file of trace-rl.

An `EnvSpec` says what a command needs of an environment: a fresh environment per rollout, training tasks for
`rollout` and `train`, the benchmarks `trace-rl eval` runs, the held-out tasks training evaluates on, how a report
groups tasks, and the tokens per turn a model needs there.

`resolve_env(name)` finds a plug-in, in this order:
1. one registered in this process (`register_env`);
2. a built-in (`BUILTINS`: calculator, math, qa, bfcl; each module holds its own plug-in and is imported only
   when chosen, so the math env's sandbox or BFCL's package is never loaded for a calculator run);
3. a Python entry point of the group `trace_rl.envs` (an installed package's `pyproject.toml`:
   `[project.entry-points."trace_rl.envs"] countdown = "my_pkg.envs:countdown"`);
4. `module:attr`, imported from `sys.path` (one file of one's own: `env.name=my_envs:countdown`).
The target is an `EnvPlugin` (`@env_plugin(...)` makes one of a builder function), or a class with a `spec`
classmethod (its nested `Settings` dataclass, if any, holds its keys). docs/environments.md walks through one.

Limits: a plug-in's settings are one flat-or-nested dataclass that OmegaConf can type (str, int, float, bool,
lists of them, nested dataclasses); its group is `env.<plugin.name>.*`, so two plug-ins with one name cannot be
told apart in a config. A name is resolved once per process and kept (`resolve_env` caches it), so a module edited
while a process runs is not re-read.
"""

from __future__ import annotations

import dataclasses
import keyword
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Callable

import numpy as np

from ..registry import load_target

ENTRY_POINT_GROUP = "trace_rl.envs"
# the built-ins, as entry points are written: imported only when chosen
BUILTINS = {
    "calculator": "trace_rl.envs.calculator_spec:CALCULATOR",
    "math": "trace_rl.envs.math_env:MATH",
    "qa": "trace_rl.envs.qa_env:QA",
    "bfcl": "trace_rl.envs.bfcl_env:BFCL",
}
ENVS = tuple(BUILTINS)  # the built-in names (what `env.name` offered before plug-ins)


@dataclass
class EnvSpec:
    make: Callable[[], object]  # a fresh environment per rollout
    benchmarks: dict[str, Callable[[int | None], list[dict]]]  # name -> loader(limit)
    train: Callable[[int, int], list[dict]]  # (count, seed) -> training prompts, drawn with replacement if few
    max_new_tokens: int = 256  # tokens per turn a model needs in this env (reasoning plus one action)
    # (count, seed) -> held-out tasks for evaluation during training; None: the first benchmark's first count
    draw_held_out: Callable[[int, int], list[dict]] | None = None
    group: Callable[[dict], str] | None = None  # a task's difficulty label, for reports by difficulty

    def held_out(self, count: int, seed: int) -> list[dict]:
        """`count` held-out tasks (a fresh seeded draw where the env generates tasks, else a fixed benchmark)."""
        if self.draw_held_out is not None:
            return self.draw_held_out(count, seed)
        return next(iter(self.benchmarks.values()))(count)


@dataclass(frozen=True)
class EnvPlugin:
    """An environment as trace-rl finds it by name: `build(settings) -> EnvSpec`, where `settings` is an
    instance of the `settings` dataclass filled from the config group `env.<name>.*` (`build()` with no
    argument when the environment has no settings)."""

    name: str  # the config group: env.<name>.*
    build: Callable[..., EnvSpec]
    settings: type | None = None  # a dataclass of the env's own keys, with defaults; None: no keys

    def __post_init__(self):
        if not self.name.isidentifier() or keyword.iskeyword(self.name) or self.name == "name":
            raise ValueError(
                f"an environment's name is its config group, so a Python identifier other than 'name'; "
                f"got {self.name!r}"
            )
        if self.settings is not None and not (
            isinstance(self.settings, type) and dataclasses.is_dataclass(self.settings)
        ):
            raise ValueError(f"environment {self.name}: settings must be a dataclass, got {self.settings!r}")

    def spec(self, settings: Any = None) -> EnvSpec:
        """The environment's spec under `settings` (None: the defaults)."""
        if self.settings is None:
            spec = self.build()
        else:
            spec = self.build(settings if settings is not None else self.settings())
        if not isinstance(spec, EnvSpec):
            raise TypeError(f"environment {self.name}: its builder returned {type(spec).__name__}, not an EnvSpec")
        return spec


def env_plugin(name: str, settings: type | None = None) -> Callable[[Callable[..., EnvSpec]], EnvPlugin]:
    """Decorator: a builder function `(settings) -> EnvSpec` (or `() -> EnvSpec` without settings) as the
    plug-in `name` with the settings dataclass `settings`."""
    return lambda build: EnvPlugin(name, build, settings)


_REGISTERED: dict[str, EnvPlugin] = {}
_RESOLVED: dict[str, EnvPlugin] = {}


def register_env(plugin: EnvPlugin, name: str | None = None) -> EnvPlugin:
    """Make `plugin` available in this process as `name` (default: its own); a registered name wins over a
    built-in or an entry point of that name. Returns the plug-in, so it can decorate."""
    key = name or plugin.name
    _REGISTERED[key] = plugin
    _RESOLVED.pop(key, None)
    return plugin


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered_envs() -> list[str]:
    """Every name `env.name` takes without a module path: registered here, built in, and installed entry points."""
    return list(dict.fromkeys([*_REGISTERED, *BUILTINS, *_entry_points()]))


def as_plugin(obj: Any, where: str) -> EnvPlugin:
    """An `EnvPlugin` as is; a class with a `spec` classmethod as the plug-in named after the class (lower case),
    whose keys are its nested `Settings` dataclass (if any)."""
    if isinstance(obj, EnvPlugin):
        return obj
    if isinstance(obj, type) and callable(getattr(obj, "spec", None)):
        settings = getattr(obj, "Settings", None)
        return EnvPlugin(obj.__name__.lower(), obj.spec, settings)
    raise ValueError(
        f"{where} is a {type(obj).__name__}, not an environment: give an EnvPlugin (trace_rl.envs.registry."
        "env_plugin) or a class with a spec(settings) classmethod"
    )


def resolve_env(name: str) -> EnvPlugin:
    """The plug-in `name` stands for (registered, built-in, entry point or module:attr; see the module's doc), or
    one ValueError line saying what is registered. An import error inside an existing plug-in module is raised as
    is: it is that module's bug or missing package, not a wrong name."""
    if name in _RESOLVED:
        return _RESOLVED[name]
    if name in _REGISTERED:
        plugin = _REGISTERED[name]
    elif name in BUILTINS:
        plugin = as_plugin(load_target(BUILTINS[name]), BUILTINS[name])
    elif name in (eps := _entry_points()):
        plugin = as_plugin(eps[name].load(), f"the entry point {name} ({eps[name].value})")
    elif ":" in name:
        plugin = as_plugin(load_target(name), name)
    else:
        raise ValueError(
            f"unknown env {name!r}; registered: {', '.join(registered_envs())}; or module:attr for an environment "
            "of one's own (docs/environments.md)"
        )
    _RESOLVED[name] = plugin
    return plugin


def get_env(name: str, **settings: Any) -> EnvSpec:
    """The spec of env `name` with the given keys of its settings group (the rest at their defaults):
    `get_env("qa", retriever_url=URL)`, `get_env("calculator", preset="train")`."""
    plugin = resolve_env(name)
    if plugin.settings is None:
        if settings:
            raise ValueError(f"env {name} has no settings, got {', '.join(settings)}")
        return plugin.spec()
    known = {f.name for f in dataclasses.fields(plugin.settings)}
    unknown = [k for k in settings if k not in known]
    if unknown:
        raise ValueError(f"env {name} has no setting {', '.join(unknown)}; its settings: {', '.join(sorted(known))}")
    return plugin.spec(plugin.settings(**settings))


def sample_rows(load: Callable[[], list[dict]]) -> Callable[[int, int], list[dict]]:
    """(count, seed) -> `count` rows of `load()` in a seeded order, reindexed so each prompt id is unique: a
    training set from a fixed list of tasks (repeated when `count` exceeds it)."""

    def draw(count: int, seed: int) -> list[dict]:
        rows = load()
        if not rows:
            raise ValueError("the training set is empty")
        rng = np.random.default_rng(seed)
        idx = np.concatenate([rng.permutation(len(rows)) for _ in range(-(-count // len(rows)))])[:count]
        return [{**rows[i], "index": j} for j, i in enumerate(idx)]

    return draw
