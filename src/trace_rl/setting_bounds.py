"""The bounds the config loader (`config.load_config`) holds every setting to, on the command line and in a
--config file alike: a value of at most MAX_VALUE_CHARS characters and no `${...}` interpolation (`check_text`:
OmegaConf would resolve it, and the run's config.yaml would hold an environment variable's value, a secret say),
a list of at most MAX_LIST_ITEMS items, finite numbers only (a run writes its settings as strict JSON), the
counts in COUNT_BOUNDS (by the setting's last name) within their bound, so a typo (steps=10**12) never starts a
run that cannot end (`check_values`), and every setting named `seed` or `seeds` a seed (`check_seeds`). A
command's own count settings use `check_count`. Standard library only; each refusal is one ConfigError naming
the key.
"""

from __future__ import annotations

import math

from .errors import ConfigError
from .seeding import check_seed

MAX_VALUE_CHARS = 65_536  # a path is at most 4,096 bytes (PATH_MAX); no setting's value comes near this
MAX_LIST_ITEMS = 1_000  # seeds, methods, loggers, trees files...: each item is a run, a file or a name
# Upper bounds on counts, by the setting's last name (every command's `steps`, the budget's sizes): far above any
# real run, far below what would allocate terabytes or run for years. Lower bounds are the dataclasses' own checks.
COUNT_BOUNDS = {
    "steps": (1_000_000, "a million steps: years of training at a minute a step"),
    "prompts": (100_000, "prompts per step"),
    "rollouts_per_prompt": (10_000, "rollouts per prompt"),
    "max_per_prompt": (10_000, "rollouts per prompt"),
    "branch_factor": (1_000, "continuations per rollout"),
    "pool_factor": (1_000, "candidate prompts per prompt"),
    "eval_tasks": (1_000_000, "tasks per evaluation"),
    "eval_samples": (10_000, "samples per task"),
    "samples": (10_000, "samples per task"),
    "workers": (1_024, "processes"),
    "env_workers": (1_024, "threads"),
    "epochs": (10_000, "passes over a step's data"),
    "critic_epochs": (10_000, "passes over a step's data"),
    "minibatches": (10_000, "minibatches per epoch"),
}


def check_count(key: str, value: int, most: int, low: int = 1, why: str = "") -> None:
    """A count setting within low..most: the bound keeps a typo (1000000000000) from allocating terabytes or
    running for days; `why` says what the upper bound stands for."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= most:
        extra = f" ({why})" if why else ""
        raise ConfigError(f"{key} must be an integer in {low:,}..{most:,}{extra}, got {value!r}")


def check_text(key: str, value: str) -> None:
    """A value as written (command line or --config file): bounded in length, and no `${...}` interpolation."""
    if len(value) > MAX_VALUE_CHARS:
        raise ConfigError(f"{key}: a value of {len(value):,} characters; a value is at most {MAX_VALUE_CHARS:,}")
    if "${" in value:
        raise ConfigError(
            f"{key}: ${{...}} interpolation is not read (it would copy environment variables, secrets too, into the "
            "run's config.yaml); write the value itself"
        )


def check_values(node, prefix: str = "") -> None:
    """Every value of the merged, unresolved settings (nested dicts and lists) within the bounds above."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        name = f"{prefix}{key}" if isinstance(node, dict) else prefix.rstrip(".")
        if isinstance(value, (dict, list)):
            if isinstance(value, list) and len(value) > MAX_LIST_ITEMS:
                raise ConfigError(f"{name}: {len(value):,} items; a list setting holds at most {MAX_LIST_ITEMS:,}")
            check_values(value, f"{name}.")
        elif isinstance(value, str):
            check_text(name, value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name}: {value} is not a finite number (a run writes its settings as strict JSON)")
        elif isinstance(value, int) and not isinstance(value, bool) and str(key) in COUNT_BOUNDS:
            most, why = COUNT_BOUNDS[str(key)]
            if value > most:
                raise ConfigError(f"{name} must be at most {most:,} ({why}), got {value:,}")


def check_seeds(node, prefix: str = "") -> None:
    """Every setting named seed or seeds, in any group, through the one seed check (ConfigError naming it)."""
    for key, value in node.items() if isinstance(node, dict) else ():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            check_seeds(value, f"{name}.")
        elif key in ("seed", "seeds"):
            for seed in value if isinstance(value, list) else [value]:
                try:
                    check_seed(seed, name)
                except ValueError as err:
                    raise ConfigError(str(err)) from None
