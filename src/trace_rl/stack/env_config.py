"""The `env` settings group: `env.name` chooses an environment plug-in (`envs.registry`), and that environment's own
settings dataclass becomes the group `env.<name>.*` (`env.name=math env.math.sandbox=weak`,
`env.calculator.preset=train`, `env.qa.corpus=FILE`).

The group's class therefore depends on the choice: `env_class(name)` makes (once per name) a subclass of
`LMEnvConfig` with one more field, the plug-in's settings. The config loader (`config.py`) reads the choice from
the command line or the --config file before it types the config, through the small protocol this class offers
(`CHOICE`, `choose`, `upgrade`, `MOVED`), so `--help`, the key check and config.yaml show the chosen env's keys
and no other env's. Trade-offs: such a class cannot be pickled by name, so instances pickle (and deep-copy) as
(env name, settings) and are rebuilt (`__reduce__`; compare's worker processes receive them so); and a key of an
env not chosen is refused as unknown, like any key the command lacks.

Configs written before plug-ins kept every env's keys in one flat group (`env.chain_steps`, `env.sandbox`, ...):
on the command line such a key is one line naming its new place; in a --config file (an old run's config.yaml)
or in a run's stored settings (`compare`, checkpoints) it is moved into its env's group (`upgrade`), so old runs
still load, resume and compare equal.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, make_dataclass
from typing import Any, ClassVar

from ..envs.registry import EnvPlugin, resolve_env


@dataclass
class LMEnvConfig:
    """Which environment the agent acts in; its own settings are the group env.<name>.*"""

    name: str = "calculator"  # calculator | math | qa | bfcl, an entry point (trace_rl.envs), or module:attr

    CHOICE: ClassVar[str] = "name"  # the key whose value decides the group's class (config.py)
    # keys of the flat group before plug-ins -> where they live now
    MOVED: ClassVar[dict[str, str]] = {
        "chain_steps": "calculator.chain_steps",
        "digits": "calculator.digits",
        "corpus": "qa.corpus",
        "retriever_url": "qa.retriever_url",
        "sandbox": "math.sandbox",
    }
    _GROUP: ClassVar[str | None] = None  # the settings field of an `env_class`, None on the base class

    def __post_init__(self):
        try:
            plugin = resolve_env(self.name)
        except ValueError as err:
            raise ValueError(f"name: {err}") from None
        if self._GROUP is not None and self._GROUP != plugin.name:
            raise ValueError(f"name: {self.name!r} is env {plugin.name}, but the settings here are env {self._GROUP}'s")

    def plugin(self) -> EnvPlugin:
        return resolve_env(self.name)

    def settings(self) -> Any:
        """The env's settings (its defaults where this object holds none), or None for an env without any."""
        plugin = self.plugin()
        if plugin.settings is None:
            return None
        value = getattr(self, plugin.name, None) if self._GROUP == plugin.name else None
        return value if value is not None else plugin.settings()

    def __reduce__(self):
        return (_restore, (self.name, self.settings()))

    @classmethod
    def choose(cls, name: str) -> LMEnvConfig:
        """The group with env `name` chosen, at its defaults (a ValueError line for a name not registered)."""
        return env_config(name)

    @classmethod
    def upgrade(cls, values: dict) -> dict:
        """A group as written before plug-ins (every env's keys flat beside `name`) in today's shape: the chosen
        env's keys in its own group, in the canonical form its settings give them, and the keys of the other envs
        (which it never read) dropped. A group in today's shape is returned as it is."""
        if not isinstance(values, dict) or not any(k in cls.MOVED for k in values):
            return values
        out = {k: v for k, v in values.items() if k not in cls.MOVED}
        plugin = resolve_env(str(out.get(cls.CHOICE, cls.name)))
        mine = {}
        for key, value in values.items():
            group, _, leaf = cls.MOVED.get(key, "").partition(".")
            if group == plugin.name:
                mine[leaf] = value
        if plugin.settings is not None:
            out[plugin.name] = dataclasses.asdict(plugin.settings(**{**mine, **out.get(plugin.name, {})}))
        return out


_CLASSES: dict[str, type] = {}


def env_class(name: str) -> type[LMEnvConfig]:
    """The subclass of `LMEnvConfig` for env `name`: `name` defaults to it, and the plug-in's settings dataclass is
    the field named after the plug-in (absent for an env without settings). Made once per name."""
    if name not in _CLASSES:
        plugin = resolve_env(name)
        fields: list = [("name", str, field(default=name))]
        if plugin.settings is not None:
            if hasattr(LMEnvConfig, plugin.name):
                raise ValueError(f"env {name}: its name {plugin.name!r} is taken by the env group itself; rename it")
            fields.append((plugin.name, plugin.settings, field(default_factory=plugin.settings)))
        cls = make_dataclass(
            f"LMEnvConfig_{plugin.name}",
            fields,
            bases=(LMEnvConfig,),
            namespace={"_GROUP": plugin.settings and plugin.name},
        )
        cls.__module__, cls.__doc__ = __name__, LMEnvConfig.__doc__
        _CLASSES[name] = cls
    return _CLASSES[name]


def env_config(name: str = "calculator", **settings: Any) -> LMEnvConfig:
    """The env group with env `name` chosen and the given keys of its settings (the rest at their defaults):
    `env_config("calculator", preset="train")`."""
    cls = env_class(name)
    plugin = resolve_env(name)
    if plugin.settings is None:
        if settings:
            raise ValueError(f"env {name} has no settings, got {', '.join(settings)}")
        return cls(name=name)
    return cls(name=name, **{plugin.name: plugin.settings(**settings)})


def _restore(name: str, settings: Any) -> LMEnvConfig:
    """`LMEnvConfig.__reduce__`'s inverse."""
    cls = env_class(name)
    return cls(name=name) if settings is None else cls(name=name, **{resolve_env(name).name: settings})


def upgrade_run_settings(settings: dict) -> dict:
    """A run's stored settings (`compare`'s run file, a checkpoint's manifest) in today's shape, so a run from
    before a change of names still compares equal to the same run now: its env group as `LMEnvConfig.upgrade`
    writes it (before plug-ins), and TRACE's keys renamed when its configuration became whole
    (`update.weighting` -> `weighting`; `predictor.critic_lr` -> `predictor.lr`, unset where it held the LM
    critic's default, which an unset `lr` gives it)."""
    if not isinstance(settings, dict):
        return settings
    out = dict(settings)
    if isinstance(out.get("env"), dict):
        out["env"] = LMEnvConfig.upgrade(out["env"])
    if isinstance(out.get("update"), dict) and "weighting" in out["update"]:
        out["update"] = {k: v for k, v in out["update"].items() if k != "weighting"}
        out.setdefault("weighting", settings["update"]["weighting"])
    if isinstance(out.get("predictor"), dict) and "critic_lr" in out["predictor"]:
        from ..predictors.build import CRITIC_LR

        predictor = {k: v for k, v in out["predictor"].items() if k != "critic_lr"}
        old = settings["predictor"]["critic_lr"]
        predictor.setdefault("lr", None if old == CRITIC_LR else old)
        out["predictor"] = predictor
    return out
