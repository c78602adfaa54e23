"""The settings a study's run was trained with (`compare`): what a run computes from, kept as run_settings.json
in its directory, and whether a directory holds a finished run of given settings, so that a study grown over
several invocations mixes no run of other settings into its table.

What counts as a setting: the run's config without where it writes, how it reports and whether it resumes
(`NOT_SETTINGS`), and without what its method never reads (a method that never branches never reads stage 2's
settings, so one GRPO run serves a study at any branch factor, weighting or flip model; a method whose roots are not
TRACE's root allocator's never reads `predictor.root_model`). A setting added to the
code after a run was trained, which the run's file lacks, is accepted while it is at its default (a new
setting's default keeps what the code did before), so adding a setting never orphans finished runs; any other
difference is refused in one line naming the keys. Limits: a default changed after the setting was added would
be accepted for such runs too; changing a default needs the runs' files upgraded (`stack.env_config` does so
for the env group).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..errors import ConfigError
from ..methods import METHODS
from ..safe_read import read_json
from ..stack.env_config import upgrade_run_settings
from .checkpoint import setting_differences
from .trainer import TrainConfig

RUN_SETTINGS = "run_settings.json"
# settings that do not change what a run computes (where it writes, how it reports, whether it resumes)
NOT_SETTINGS = ("out", "resume", "progress", "logger", "save_every", "keep_last")


def run_settings(cfg: TrainConfig) -> dict:
    """What a run computes from: its config without where it writes and how it reports."""
    d = dataclasses.asdict(cfg)
    return _without_unread(json.loads(json.dumps({k: v for k, v in d.items() if k not in NOT_SETTINGS}, default=str)))


def _without_unread(settings: dict) -> dict:
    """A method that never branches never reads budget.branch_factor or predictor.flip_model and flip_prior
    (stage 2's), and its turns each lie on one path, so weighting (how a turn shared by k leaves is weighted)
    leaves it unchanged: one GRPO run serves a study at any N, weighting or flip model."""
    if settings.get("method") in METHODS and not METHODS[settings["method"]].branches:
        settings.get("budget", {}).pop("branch_factor", None)
        settings.pop("weighting", None)
        settings.get("predictor", {}).pop("flip_model", None)
        settings.get("predictor", {}).pop("flip_prior", None)
    if settings.get("method") in METHODS and not METHODS[settings["method"]].roots_on_value:
        settings.get("predictor", {}).pop("root_model", None)  # only TRACE's root allocator reads it
    return settings


_ABSENT = object()


def _leaf(settings: dict, key: str):
    for part in key.split("."):
        if not isinstance(settings, dict) or part not in settings:
            return _ABSENT
        settings = settings[part]
    return settings


def _default_setting(key: str):
    """The declared default of a dotted TrainConfig key, as run_settings writes it (JSON types)."""
    cls = TrainConfig
    for i, part in enumerate(parts := key.split(".")):
        field = next((f for f in dataclasses.fields(cls) if f.name == part), None)
        if field is None:
            return _ABSENT
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            return _ABSENT
        if dataclasses.is_dataclass(value) and i < len(parts) - 1:
            cls = type(value)
            continue
        value = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        return json.loads(json.dumps(value, default=str)) if i == len(parts) - 1 else _ABSENT
    return _ABSENT


def _added_since_at_default(key: str, stored: dict, current: dict) -> bool:
    """A setting the run's file does not hold (added to the code after the run) whose value now is its default:
    a new setting's default keeps what the code did before it, so the run is one of these settings."""
    default = _default_setting(key)
    return _leaf(stored, key) is _ABSENT and default is not _ABSENT and _leaf(current, key) == default


def finished(run: Path, cfg: TrainConfig) -> bool:
    """True if `run` holds a finished run of `cfg`; ConfigError (a ValueError, one line) if it holds a run of
    other settings."""
    path = run / RUN_SETTINGS
    if not path.exists():
        return False
    stored = _without_unread(upgrade_run_settings(read_json(path, strict=False)))
    current = run_settings(cfg)
    diff = [k for k in setting_differences(stored, current) if not _added_since_at_default(k, stored, current)]
    if diff:
        raise ConfigError(
            f"out: {run} holds a run with other settings (differs in {', '.join(diff)}); "
            "use another out, or the settings it was run with"
        )
    summary = run / "train_summary.json"
    return summary.exists() and read_json(summary, strict=False).get("steps") == cfg.steps


def start_settings(cfg: TrainConfig) -> dict:
    """What the evaluation before training computes from: the start policy, the held-out tasks (seed, env,
    count) and the sampling; not the method, its budget or its update."""
    d = run_settings(cfg)
    return {k: d[k] for k in ("seed", "eval_tasks", "eval_samples", "policy", "env", "engine")}
