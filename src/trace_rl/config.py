"""Typed command configs: each command's settings are one dataclass (defaults and one-line docs live there and
nowhere else), loaded as an OmegaConf structured config.

`trace-rl CMD [--config FILE.yaml] [key=value ...]`: the file is merged over the defaults, then the dotted
overrides (`budget.prompts=16`, `methods=grpo,trace`: a comma list fills a list setting). The older flag
spellings still work: `--prefix-share 0.1` is the setting whose last name is `prefix_share`, `--ablation`
alone means true. An unknown key or a bad value stops the command before any work with one line that names
the key (`ConfigError`); the dataclasses' own checks (`__post_init__`) name the key they reject, and this
module adds the group it sits in. `help_text` lists every key with its default and its doc, read from the
comment beside the field.

A choice group is a group whose class depends on a value inside it: `env`, where `env.name` picks an environment
plug-in whose own settings are the group `env.<name>.*` (`stack/env_config.py`). The loader reads the choice first
(command line, then --config file), types the group as the choice's class, and only then checks keys, so --help,
the key check, error messages and config.yaml show the chosen environment's keys and no other's. The cost is a
second read of the --config file.

A command may choose its whole class the same way, by a key at its top (`ROOT_CHOICE` on the config class, and
`choose_class(value)`: compare's `command`, whose chosen command's settings are the group `train.*` or
`rollout.*`): the loader reads that value first (command line, then --config file) and from there on works on
the chosen class, so --help and config.yaml show the chosen command's group and no other.

Some checks are the loader's, for every command at once: each setting named `seed` or `seeds` is a seed
(`seeding.check_seed`) before any config is built; an argument that is not valid UTF-8 is refused naming its
key; a key a command sets itself for each of its runs (`SET_PER_RUN` on the config class, e.g. compare's
`train.out`) is refused, not silently overridden, and is left out of --help. Bounds, on the command line and in a
--config file alike (`setting_bounds.check_values`): a value of at most MAX_VALUE_CHARS characters, a list of at most
MAX_LIST_ITEMS items, finite numbers only (a run writes its settings as strict JSON), the counts in COUNT_BOUNDS
(by the setting's last name: `steps`, the budget's sizes, ...) within their bound, so a typo (steps=10**12) never
starts a run that cannot end. `${...}` interpolation (`${oc.env:NAME}`) is refused wherever it appears: OmegaConf
would resolve it, and the run's config.yaml would hold the environment variable's value (a secret, say).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .setting_bounds import MAX_LIST_ITEMS, check_seeds, check_text, check_values
from .setting_bounds import check_count as check_count  # re-exported: commands import it from here

# old flag spellings whose last name is not the new key's
_ABSENT = object()  # OmegaConf.select's default: tells a key set to null from a key not there
FLAG_ALIASES = {
    "mix": "env.difficulty_mix",
    "predictor_warmup": "predictor.warmup",
    "predictor": "predictor.kind",
    "minutes": "sft.max_minutes",
    "max_steps": "steps",
}


def _set_per_run(cls) -> dict[str, str]:
    """Dotted key -> why: keys the command sets itself for each run, so that a value given would be ignored."""
    return dict(getattr(cls, "SET_PER_RUN", {}))


def _fields(cls) -> list[dataclasses.Field]:
    """The settings of `cls`, its own before those it inherits (`train` lists out, seed, ... before the LM stack)."""
    own = inspect.get_annotations(cls)
    return sorted((f for f in dataclasses.fields(cls) if f.init), key=lambda f: f.name not in own)


def _is_choice(typ) -> bool:
    """A group whose class depends on a choice made inside it (`env`: `env.name` picks the env, whose own settings
    are the group `env.<name>.*`): a dataclass with `CHOICE` (the key that chooses) and `choose(value)` (the group
    with that value chosen, at its defaults; a ValueError line for a value it does not know)."""
    return dataclasses.is_dataclass(typ) and isinstance(typ, type) and hasattr(typ, "choose") and hasattr(typ, "CHOICE")


def _default(f: dataclasses.Field, group):
    """The command's default of field `f`: the value inside `group` (the enclosing group's default instance, whose
    values a command may set: train's budget is not rollout's), else the field's own default."""
    if group is not None:
        return getattr(group, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _nested(cls, group=None, prefix: str = "", choices: dict[str, str] | None = None) -> dict[str, tuple[type, Any]]:
    """Field name -> (its type, the command's default instance where the field is a group that needs one, else
    None). A choice group's type is the class of the choice made (`choices`: dotted group -> value; unset: the
    command's default), so the chosen env's keys are the keys."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in _fields(cls):
        typ, value = hints[f.name], None
        if _is_choice(typ) or (group is not None and dataclasses.is_dataclass(typ)):
            value = _default(f, group)
            wanted = (choices or {}).get(prefix + f.name)
            if _is_choice(typ) and wanted is not None and getattr(value, typ.CHOICE, None) != wanted:
                value = typ.choose(wanted)
            if dataclasses.is_dataclass(value):
                typ = type(value)
        out[f.name] = (typ, value)
    return out


def _leaves(cls, choices: dict[str, str] | None = None, prefix: str = "", group=None) -> dict[str, Any]:
    """Dotted key -> annotated type, for every setting of `cls` (with the choices made in choice groups)."""
    out = {}
    for name, (typ, value) in _nested(cls, group, prefix, choices).items():
        if dataclasses.is_dataclass(typ):
            out.update(_leaves(typ, choices, f"{prefix}{name}.", value))
        else:
            out[f"{prefix}{name}"] = typ
    return out


def _choice_groups(cls, prefix: str = "") -> dict[str, type]:
    """Dotted path -> class of every choice group in `cls` (compare's `train.env` as well as `env`)."""
    out = {}
    for f in _fields(cls):
        typ = typing.get_type_hints(cls)[f.name]
        if _is_choice(typ):
            out[prefix + f.name] = typ
        elif dataclasses.is_dataclass(typ):
            out.update(_choice_groups(typ, f"{prefix}{f.name}."))
    return out


def _choices(cls, argv: list[str]) -> dict[str, str]:
    """Dotted choice group -> the value chosen on the command line (`env=math`, `env.name=math`, `--env.name math`)
    or, failing that, in its --config file; groups where neither chooses are left out (the default holds)."""
    groups = _choice_groups(cls)
    if not groups:
        return {}
    given: dict[str, str] = {}
    loaded = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            loaded = _read_yaml(argv[i + 1])
            continue
        key, eq, value = arg.removeprefix("--").partition("=")
        if not eq and arg.startswith("--") and i + 1 < len(argv):
            value = argv[i + 1]
        for path, typ in groups.items():
            if key in (path, f"{path}.{typ.CHOICE}") and (eq or arg.startswith("--")):
                given[path] = value
    out = {}
    for path, typ in groups.items():
        if path in given:
            out[path] = given[path]
        elif loaded is not None:
            from omegaconf import OmegaConf

            chosen = OmegaConf.select(loaded, f"{path}.{typ.CHOICE}", default=None)
            if chosen is not None:
                out[path] = str(chosen)
    return out


def _chosen(cls, choices: dict[str, str]) -> None:
    """Each choice made names something its group knows, or one ConfigError naming the key."""
    groups = _choice_groups(cls)
    for path, value in choices.items():
        try:
            groups[path].choose(value)
        except ValueError as err:
            raise ConfigError(f"{path}.{groups[path].CHOICE}: {err}") from None


def _root_class(cls, argv: list[str]) -> type:
    """The class of a command whose settings depend on a key at its top (`ROOT_CHOICE`; compare's `command`): the
    value on the command line (`command=rollout`, `--command rollout`) or, failing that, in its --config file, through
    `cls.choose_class` (None: the default; a ValueError line for a value it does not know). Other commands: `cls`."""
    key = getattr(cls, "ROOT_CHOICE", None)
    if key is None:
        return cls
    given = config_file = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            config_file = argv[i + 1]
            continue
        name, eq, value = arg.removeprefix("--").partition("=")
        if name == key and eq:
            given = value
        elif arg == f"--{key}" and i + 1 < len(argv):
            given = argv[i + 1]
    if given is None and config_file is not None:
        from omegaconf import OmegaConf

        chosen = OmegaConf.select(_read_yaml(config_file), key, default=None)
        given = None if chosen is None else str(chosen)
    try:
        return cls.choose_class(given)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _docs(cls) -> dict[str, str]:
    """Field name -> the comment beside it in the body of the class that declares it (`cls` or a base)."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        docs.update(
            {m.group(1): m.group(2).strip() for m in re.finditer(r"^\s+(\w+)\s*:[^#\n]*#\s*(.*)$", source, re.M)}
        )
    return docs


def help_text(cls, command: str, argv: list[str] | None = None) -> str:
    """Every key with its default and doc, grouped as in the dataclass; a choice group (env) shows the keys of the
    choice `argv` makes (`trace-rl train env=math --help`), else of the command's default."""
    cls = _root_class(cls, list(argv or []))
    lines = [f"usage: trace-rl {command} [--config FILE.yaml] [key=value ...]", "", (cls.__doc__ or "").strip(), ""]

    hidden = _set_per_run(cls)
    choices = _choices(cls, list(argv or []))
    _chosen(cls, choices)

    def walk(c, prefix: str, group=None) -> None:
        docs = _docs(c)
        nested = _nested(c, group, prefix, choices)
        for f in _fields(c):
            if f"{prefix}{f.name}" in hidden:
                continue
            # the field's own default, not an instance: a command whose defaults need a value (a run
            # directory to read) cannot be built empty, but its help must still list every key; inside a
            # group, the value the command's default gives it (train's budget is not rollout's)
            typ, value = nested[f.name]
            if value is None:
                value = _default(f, group)
            if dataclasses.is_dataclass(value):
                lines.append(f"  {prefix}{f.name}.*   {(type(value).__doc__ or '').strip().splitlines()[0]}")
                walk(type(value), f"{prefix}{f.name}.", value)
            else:
                shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else repr(value)
                lines.append(f"    {prefix}{f.name}={shown}".ljust(44) + f"  {docs.get(f.name, '')}")

    walk(cls, "")
    return "\n".join(lines)


def _overrides(cls, argv: list[str], choices: dict[str, str] | None = None) -> tuple[str | None, list[str]]:
    """(--config file, dotted key=value overrides) from the command line, old flag spellings resolved; keys are
    those of the choices made (`choices`; None: read from `argv`)."""
    if choices is None:
        choices = _choices(cls, argv)
        _chosen(cls, choices)
    leaves = _leaves(cls, choices)
    by_last: dict[str, list[str]] = {}
    for key in leaves:
        by_last.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    for arg in argv:  # an undecodable byte arrives as a surrogate (PEP 383), which nothing downstream can print
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            key, eq, _ = arg.partition("=")
            shown = key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"{shown}: a setting name that is not valid UTF-8; see --help") from None
            where = f"{key}: the value is" if eq else f"the argument {shown} is"
            raise ConfigError(f"{where} not valid UTF-8; give text in UTF-8") from None
    config_file, out, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config: needs a YAML file")
            config_file, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--"):
            name, _, value = arg[2:].partition("=")
            name = name.replace("-", "_")
            key = FLAG_ALIASES.get(name, name)
            if key not in leaves:
                hits = by_last.get(name, [])
                if len(hits) != 1:
                    raise ConfigError(f"--{arg[2:].split('=')[0]}: unknown setting; see `trace-rl ... --help`")
                key = hits[0]
            if not value:
                takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--") and "=" not in argv[i + 1]
                if leaves[key] is bool and not takes_value:
                    value, i = "true", i + 1
                elif i + 1 < len(argv):
                    value, i = argv[i + 1], i + 2
                else:
                    raise ConfigError(f"{key}: needs a value")
            else:
                i += 1
            out.append(f"{key}={value}")
            continue
        if "=" not in arg:
            raise ConfigError(f"{arg!r}: expected key=value (see --help)")
        out.append(arg)
        i += 1
    fixed = []
    for item in out:
        key, _, value = item.partition("=")
        if key not in leaves and f"{key}.name" in leaves:  # `env=math` names the env group's choice
            key = f"{key}.name"
        if key in _set_per_run(cls):
            raise ConfigError(f"{key}: not a setting here; {_set_per_run(cls)[key]}")
        if key not in leaves:
            _moved(cls, key)
            _renamed(key, leaves)
            raise ConfigError(f"{key}: unknown setting; settings are {', '.join(sorted(leaves))}")
        check_text(key, value)
        if _is_list(leaves[key]) and value.count(",") >= MAX_LIST_ITEMS:  # before YAML expands it (10,000 nodes)
            raise ConfigError(f"{key}: {value.count(',') + 1:,} items; a list setting holds at most {MAX_LIST_ITEMS:,}")
        if _is_list(leaves[key]) and not value.strip().startswith("["):
            value = "[" + ",".join(v.strip() for v in value.split(",") if v.strip()) + "]"
        fixed.append(f"{key}={value}")
    return config_file, fixed


def _renamed(key: str, leaves, where: str = "") -> None:
    """One line naming the new key of a TRACE setting renamed when its configuration became whole
    (`trace_config.RENAMED`: `update.weighting` is `weighting`), where this command has the new key."""
    from .trace_config import RENAMED

    if key in RENAMED and RENAMED[key] in leaves:
        raise ConfigError(f"{key}: renamed; set {RENAMED[key]}{where}")


def _moved(cls, key: str) -> None:
    """One line naming the new place of a key a choice group has moved (`env.chain_steps`, before each env had
    its own group, is `env.calculator.chain_steps`)."""
    for path, typ in _choice_groups(cls).items():
        rest = key.removeprefix(path + ".")
        if rest != key and rest in getattr(typ, "MOVED", {}):
            raise ConfigError(f"{key}: now {path}.{typ.MOVED[rest]} (see --help)")


def _is_list(typ) -> bool:
    """list[...] or tuple[...], also inside Optional[...]."""
    origin = typing.get_origin(typ)
    if origin is typing.Union:
        return any(_is_list(arg) for arg in typing.get_args(typ))
    return origin in (list, tuple)


def _qualify(message: str, cls, choices: dict[str, str] | None = None) -> str:
    """Prefix a dataclass check's message ("steps must be ...") with the group path of the key it names."""
    first = re.split(r"[\s:]", message.strip(), maxsplit=1)[0]
    hits = [k for k in _leaves(cls, choices) if k.rsplit(".", 1)[-1] == first]
    if len(hits) != 1 or hits[0] == first:
        return message
    if message.strip().startswith(first + ":"):  # "device: ..." -> "policy.device: ...", not the name twice
        return hits[0] + message.strip()[len(first) :]
    return f"{hits[0]}: {message}"


def _read_yaml(config_file: str):
    """The settings of a --config file, or one ConfigError naming the file, the line and what is wrong."""
    import yaml
    from omegaconf import DictConfig, OmegaConf

    path = Path(config_file)
    if not path.is_file():
        raise ConfigError(f"--config: no file {config_file}")
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as err:  # a syntax error, a recursive alias, a tag it cannot build
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(err, "problem", None) or str(err).strip().splitlines()[0]
        raise ConfigError(f"--config: {config_file} is not valid YAML{where}: {what}") from None
    except (OSError, UnicodeDecodeError, RecursionError) as err:
        raise ConfigError(f"--config: cannot read {config_file} ({type(err).__name__}: {err})") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"--config: {config_file} must hold `key: value` settings, not a list")
    return loaded


def _structured(cls, choices: dict[str, str]):
    """The OmegaConf node of `cls`'s defaults, each choice group replaced by the group of the choice made."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(cls)
    groups = _choice_groups(cls)
    for path, value in choices.items():
        if OmegaConf.select(cfg, f"{path}.{groups[path].CHOICE}") != value:
            parent, _, last = path.rpartition(".")
            setattr(
                OmegaConf.select(cfg, parent) if parent else cfg, last, OmegaConf.structured(groups[path].choose(value))
            )
    return cfg


def _upgraded(cls, loaded, choices: dict[str, str]):
    """A --config file with each choice group in today's shape (`upgrade`: an env group written before each env
    had its own group, as an old run's config.yaml holds it), and without the group of a choice the command line
    changed (`--config RUN/config.yaml env=math` on a calculator run: the calculator's settings do not apply)."""
    from omegaconf import OmegaConf

    for path, typ in _choice_groups(cls).items():
        node = OmegaConf.select(loaded, path, default=None)
        if node is None:
            continue
        if path in choices and OmegaConf.select(node, typ.CHOICE, default=None) not in (None, choices[path]):
            parent, _, last = path.rpartition(".")
            (OmegaConf.select(loaded, parent) if parent else loaded).pop(last)
            continue
        if hasattr(typ, "upgrade"):
            values = OmegaConf.to_container(node)
            new = typ.upgrade(values)
            if new != values:
                OmegaConf.update(loaded, path, new, merge=False)
    return loaded


def load_config(cls, argv: list[str]):
    """(the config object, its resolved YAML) from defaults, an optional file and overrides."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cls = _root_class(cls, argv)

    choices = _choices(cls, argv)
    _chosen(cls, choices)
    config_file, dotlist = _overrides(cls, argv, choices)
    try:
        cfg = _structured(cls, choices)
        if config_file:
            loaded = _read_yaml(config_file)
            for key in _set_per_run(cls):
                if OmegaConf.select(loaded, key, default=None) is not None:
                    raise ConfigError(f"{key}: not a setting here; {_set_per_run(cls)[key]} (in {config_file})")
            from .trace_config import RENAMED

            for key in RENAMED:
                if OmegaConf.select(loaded, key, default=_ABSENT) is not _ABSENT:
                    _renamed(key, _leaves(cls, choices), f" (in {config_file})")
            cfg = OmegaConf.merge(cfg, _upgraded(cls, loaded, choices))
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotlist))
        check_values(OmegaConf.to_container(cfg, resolve=False))  # before anything resolves an interpolation
        check_seeds(OmegaConf.to_container(cfg))
        obj = OmegaConf.to_object(cfg)
    except (OmegaConfBaseException, yaml.YAMLError) as err:  # YAML: a value it cannot build (20,000 nodes, say)
        key = getattr(err, "full_key", None) or _failing_key(cls, dotlist, choices) or "config"
        msg = str(getattr(err, "msg", None) or err).strip().splitlines()[0]
        raise ConfigError(f"{key}: {msg}") from None
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(_qualify(str(err), cls, choices)) from None
    return obj, OmegaConf.to_yaml(_in_order(OmegaConf.structured(obj), obj))


def _failing_key(cls, dotlist: list[str], choices: dict[str, str] | None = None) -> str | None:
    """The first override that fails on its own (OmegaConf names no key for some errors, e.g. a tuple of the
    wrong length)."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for item in dotlist:
        try:
            OmegaConf.merge(_structured(cls, choices or {}), OmegaConf.from_dotlist([item]))
        except (OmegaConfBaseException, yaml.YAMLError):
            return item.partition("=")[0]
    return None


def _in_order(node, obj) -> dict:
    """A resolved config as nested dicts in `_fields` order, so config.yaml reads like --help (OmegaConf writes
    inherited settings first); groups in the class of the object's own value (a choice group's, the chosen)."""
    return {
        f.name: _in_order(node[f.name], getattr(obj, f.name))
        if dataclasses.is_dataclass(getattr(obj, f.name))
        else node[f.name]
        for f in _fields(type(obj))
    }


def write_config(yaml_text: str, out_dir: str | Path) -> Path:
    """The resolved config of a run, as `config.yaml` in its directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml_text)
    return path
