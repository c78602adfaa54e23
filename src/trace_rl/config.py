"""Typed command configs: each command's settings are one dataclass (defaults and one-line docs live there and
nowhere else), loaded as an OmegaConf structured config.

`trace-rl CMD [--config FILE.yaml] [key=value ...]`: the file is merged over the defaults, then the dotted
overrides (`budget.prompts=16`, `methods=grpo,trace`: a comma list fills a list setting). The older flag
spellings still work: `--prefix-share 0.1` is the setting whose last name is `prefix_share`, `--ablation`
alone means true. An unknown key or a bad value stops the command before any work with one line that names
the key (`ConfigError`); the dataclasses' own checks (`__post_init__`) name the key they reject, and this
module adds the group it sits in. `help_text` lists every key with its default and its doc, read from the
comment beside the field.

Some checks are the loader's, for every command at once: each setting named `seed` or `seeds` is a seed
(`seeding.check_seed`) before any config is built; an argument that is not valid UTF-8 is refused naming its
key; a key a command sets itself for each of its runs (`SET_PER_RUN` on the config class, e.g. compare's
`train.out`) is refused, not silently overridden, and is left out of --help.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .seeding import check_seed

# old flag spellings whose last name is not the new key's
FLAG_ALIASES = {
    "mix": "env.difficulty_mix",
    "predictor_warmup": "predictor.warmup",
    "predictor": "predictor.kind",
    "minutes": "sft.max_minutes",
    "max_steps": "steps",
}


def check_count(key: str, value: int, most: int, low: int = 1, why: str = "") -> None:
    """A count setting within low..most: the bound keeps a typo (1000000000000) from allocating terabytes or
    running for days; `why` says what the upper bound stands for."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= most:
        extra = f" ({why})" if why else ""
        raise ConfigError(f"{key} must be an integer in {low}..{most:_}{extra}, got {value!r}".replace("_", ","))


def _set_per_run(cls) -> dict[str, str]:
    """Dotted key -> why: keys the command sets itself for each run, so that a value given would be ignored."""
    return dict(getattr(cls, "SET_PER_RUN", {}))


def _fields(cls) -> list[dataclasses.Field]:
    """The settings of `cls`, its own before those it inherits (`train` lists out, seed, ... before the LM stack)."""
    own = inspect.get_annotations(cls)
    return sorted((f for f in dataclasses.fields(cls) if f.init), key=lambda f: f.name not in own)


def _nested(cls) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in _fields(cls)}


def _leaves(cls, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> annotated type, for every setting of `cls`."""
    out = {}
    for name, typ in _nested(cls).items():
        if dataclasses.is_dataclass(typ):
            out.update(_leaves(typ, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = typ
    return out


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


def help_text(cls, command: str) -> str:
    """Every key with its default and doc, grouped as in the dataclass."""
    lines = [f"usage: trace-rl {command} [--config FILE.yaml] [key=value ...]", "", (cls.__doc__ or "").strip(), ""]

    hidden = _set_per_run(cls)

    def walk(c, prefix: str, group=None) -> None:
        docs = _docs(c)
        for f in _fields(c):
            if f"{prefix}{f.name}" in hidden:
                continue
            # the field's own default, not an instance: a command whose defaults need a value (a run
            # directory to read) cannot be built empty, but its help must still list every key; inside a
            # group, the value the command's default gives it (train's budget is not rollout's)
            if group is not None:
                value = getattr(group, f.name)
            else:
                value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if dataclasses.is_dataclass(value):
                lines.append(f"  {prefix}{f.name}.*   {(type(value).__doc__ or '').strip().splitlines()[0]}")
                walk(type(value), f"{prefix}{f.name}.", value)
            else:
                shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else repr(value)
                lines.append(f"    {prefix}{f.name}={shown}".ljust(44) + f"  {docs.get(f.name, '')}")

    walk(cls, "")
    return "\n".join(lines)


def _overrides(cls, argv: list[str]) -> tuple[str | None, list[str]]:
    """(--config file, dotted key=value overrides) from the command line, old flag spellings resolved."""
    leaves = _leaves(cls)
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
            raise ConfigError(f"{key}: unknown setting; settings are {', '.join(sorted(leaves))}")
        if _is_list(leaves[key]) and not value.strip().startswith("["):
            value = "[" + ",".join(v.strip() for v in value.split(",") if v.strip()) + "]"
        fixed.append(f"{key}={value}")
    return config_file, fixed


def _is_list(typ) -> bool:
    """list[...] or tuple[...], also inside Optional[...]."""
    origin = typing.get_origin(typ)
    if origin is typing.Union:
        return any(_is_list(arg) for arg in typing.get_args(typ))
    return origin in (list, tuple)


def _qualify(message: str, cls) -> str:
    """Prefix a dataclass check's message ("steps must be ...") with the group path of the key it names."""
    first = re.split(r"[\s:]", message.strip(), maxsplit=1)[0]
    hits = [k for k in _leaves(cls) if k.rsplit(".", 1)[-1] == first]
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


def load_config(cls, argv: list[str]):
    """(the config object, its resolved YAML) from defaults, an optional file and overrides."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    config_file, dotlist = _overrides(cls, argv)
    try:
        cfg = OmegaConf.structured(cls)
        if config_file:
            loaded = _read_yaml(config_file)
            for key in _set_per_run(cls):
                if OmegaConf.select(loaded, key, default=None) is not None:
                    raise ConfigError(f"{key}: not a setting here; {_set_per_run(cls)[key]} (in {config_file})")
            cfg = OmegaConf.merge(cfg, loaded)
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotlist))
        _check_seeds(OmegaConf.to_container(cfg))
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or _failing_key(cls, dotlist) or "config"
        msg = str(getattr(err, "msg", None) or err).strip().splitlines()[0]
        raise ConfigError(f"{key}: {msg}") from None
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(_qualify(str(err), cls)) from None
    return obj, OmegaConf.to_yaml(_in_order(OmegaConf.structured(obj), cls))


def _check_seeds(node, prefix: str = "") -> None:
    """Every setting named seed or seeds, in any group, through the one seed check (ConfigError naming it)."""
    for key, value in node.items() if isinstance(node, dict) else ():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            _check_seeds(value, f"{name}.")
        elif key in ("seed", "seeds"):
            for seed in value if isinstance(value, list) else [value]:
                try:
                    check_seed(seed, name)
                except ValueError as err:
                    raise ConfigError(str(err)) from None


def _failing_key(cls, dotlist: list[str]) -> str | None:
    """The first override that fails on its own (OmegaConf names no key for some errors, e.g. a tuple of the
    wrong length)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for item in dotlist:
        try:
            OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.from_dotlist([item]))
        except OmegaConfBaseException:
            return item.partition("=")[0]
    return None


def _in_order(node, cls) -> dict:
    """A resolved config as nested dicts in `_fields` order, so config.yaml reads like --help (OmegaConf writes
    inherited settings first)."""
    return {
        name: _in_order(node[name], typ) if dataclasses.is_dataclass(typ) else node[name]
        for name, typ in _nested(cls).items()
    }


def write_config(yaml_text: str, out_dir: str | Path) -> Path:
    """The resolved config of a run, as `config.yaml` in its directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml_text)
    return path
