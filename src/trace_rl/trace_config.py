"""One TRACE configuration: the method, the advantage estimator, the rollout budget, the predictor (its kind,
prefix share and learning rate, and the calibration layers around it: `flip_model`, `flip_prior`,
`root_model`), and how a node shared by several leaves is weighted, with one set of names, one set of defaults
and the one place that checks them.

Every entry point reads TRACE's settings through here, under one key path each: the command line (`trace-rl
train`, `rollout`, `simulate`, `compare`: `method` (`methods` where several run), `advantage`, `budget.*`,
`predictor.kind`, `predictor.prefix_share`, `predictor.lr`, `predictor.flip_model`, `predictor.flip_prior`,
`predictor.root_model`, `weighting`; each builds a `TraceConfig` from them), verl's plugin (the `trace_rl` block
of its YAML, `TraceConfig.from_settings`) and TRL's rollout function (its keyword arguments, the same names).
Names used before (`update.weighting`, `predictor.critic_lr`; the integrations' `estimator`, `light_text`, a
flat `branch_factor`, ...) are refused in one line that names the new key (`RENAMED`), so a config written for
the old names never silently changes meaning.

Also here, because the configuration is made of them: the method table (`Method`, `METHODS`, `get_method`,
defined in `method_table` and re-exported here and by `methods.py`, whose allocators read a method's strategies)
and `BudgetPlan`. The module is plain data and the standard library (no numpy): only the advantage-name check
imports the estimator table (`advantages`, numpy), when a name is checked.

Limits: checks cover names, ranges and types of these settings; whether a budget fits a framework's batch
(verl's mini-batches) is the framework module's check, and whether an LM critic's weights load is the
predictor builder's (`predictors.build`).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from .method_table import METHODS, STATUSES, Method, get_method, method_spec, register_method
from .paths import check_weighting
from .registry import ADVANTAGES, PREDICTORS

__all__ = [  # the method table's names are re-exported: callers import them from here
    "CALIBRATION_MODES",
    "METHODS",
    "PREDICTOR_RENAMED",
    "PREFIX_SHARE",
    "RENAMED",
    "STATUSES",
    "BudgetPlan",
    "Method",
    "PredictorGroup",
    "PredictorSettings",
    "TraceConfig",
    "check_advantage",
    "check_layer",
    "check_lr",
    "check_method",
    "check_methods",
    "check_predictor_kind",
    "check_prefix_share",
    "get_method",
    "method_spec",
    "predictor_kinds",
    "register_method",
]

PREFIX_SHARE = 0.5  # share of prefix examples in a predictor batch (paper: about 6%; docs/predictors.md)
PREDICTOR_RENAMED = {"light_text": "light"}  # a predictor.kind used before, refused with the name to set
CALIBRATION_MODES = ("raw", "calibrated")  # predictor.flip_model and root_model (experimental.flip, root_calibration)
# keys named otherwise before one concept had one name across commands, in any reader (command line, simulate,
# verl, TRL): refused in one line naming the new key, so a config written for them never silently changes meaning
RENAMED = {"update.weighting": "weighting", "predictor.critic_lr": "predictor.lr", "samples": "eval_samples"}


@dataclass(frozen=True)
class BudgetPlan:
    """How many rollouts one step buys, and how a tree method splits them."""

    prompts: int = 32  # P: prompts a flat method trains on per step
    rollouts_per_prompt: int = 8  # n: GRPO group size
    branch_factor: int = 1  # N: continuations per bare rollout for tree methods
    pool_factor: int = 4  # candidate pool = pool_factor * P prompts
    max_per_prompt: int = 8  # m_max for the root allocators

    def __post_init__(self):
        for name in ("prompts", "rollouts_per_prompt", "pool_factor", "branch_factor", "max_per_prompt"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in ("prompts", "rollouts_per_prompt", "pool_factor"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.branch_factor < 0:
            raise ValueError(f"branch_factor must be >= 0, got {self.branch_factor}")
        if self.max_per_prompt < 2:
            raise ValueError(f"max_per_prompt must be >= 2, got {self.max_per_prompt}")

    @property
    def total(self) -> int:
        return self.prompts * self.rollouts_per_prompt

    @property
    def pool(self) -> int:
        return self.prompts * self.pool_factor

    def root_budget(self, method: Method) -> int:
        return self.total // (1 + self.branch_factor) if method.branches else self.total


# ---- the checks: each names its key (the last name, which the command line's loader qualifies with its group)


def _allowed(oracle: bool) -> list[str]:
    return [m for m in METHODS if oracle or not METHODS[m].needs_exact_value]


def check_method(name: Any, key: str = "method", oracle: bool = True) -> Method:
    """A known method (a name, module:attr or a `Method`); `oracle=False` where no exact V exists (LM agents, verl,
    TRL)."""
    try:
        method = METHODS.resolve(name)
    except ValueError:
        raise ValueError(
            f"{key}: unknown {name!r}; choose from {', '.join(_allowed(oracle))}, or module:attr"
        ) from None
    if not oracle and method.needs_exact_value:
        raise ValueError(
            f"{key}: unknown {name!r} (it needs the exact V that only the testbed has: trace-rl simulate); choose "
            f"from {', '.join(_allowed(oracle))}"
        )
    return method


def check_methods(names: Sequence[str], key: str = "methods", oracle: bool = True) -> None:
    """A non-empty list of known, distinct methods (a repeat would run, and be reported, twice)."""
    if not names:
        raise ValueError(f"{key}: none given; choose from {', '.join(METHODS)}")
    unknown = [m for m in names if m not in METHODS or not (oracle or not METHODS[m].needs_exact_value)]
    if unknown:
        why = " (oracle methods need the exact V of the testbed)" if any(m in METHODS for m in unknown) else ""
        raise ValueError(f"{key}: unknown {unknown}{why}; choose from {', '.join(_allowed(oracle))}")
    repeated = sorted({m for m in names if list(names).count(m) > 1})
    if repeated:
        raise ValueError(f"{key}: {', '.join(repeated)} given more than once; list each method once")


def check_advantage(name: str, key: str = "advantage") -> None:
    """An advantage estimator by name or module:attr, or '' for the method's own."""
    if not name:
        return
    try:
        ADVANTAGES.resolve(name)
    except ValueError:
        raise ValueError(
            f"{key}: unknown {name!r}; choose from {', '.join(ADVANTAGES)}, module:attr (or '' for the method's own)"
        ) from None


def check_prefix_share(value: float, key: str = "prefix_share") -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"{key} must be in [0, 1), got {value!r}")


def predictor_kinds() -> list[str]:
    """The registered V~ that `predictor.kind` takes by name (the others are a method's own: VIP's GP, the oracle)."""
    return [name for name in PREDICTORS if PREDICTORS[name].kind]


def check_predictor_kind(kind: str, key: str = "kind", critics: Sequence[str] | None = None) -> None:
    """A registered kind (light | history | one registered) or module:attr, or with `critics` (the named LM critic
    backbones of the command line) also one of them, an existing path or a hub id (org/name); None: no LM critic
    here (verl, TRL)."""
    kinds = predictor_kinds()
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{key}: must be a name ({', '.join(kinds)}), got {kind!r}")
    if kind in PREDICTOR_RENAMED:  # the integrations' names before one configuration
        raise ValueError(
            f"{key}: {kind!r} is now called {PREDICTOR_RENAMED[kind]!r}; set {key}={PREDICTOR_RENAMED[kind]}"
        )
    if kind in PREDICTORS and PREDICTORS[kind].kind:
        return
    if ":" in kind and ":/" not in kind:  # module:attr of one's own: its error names the module or the attribute
        try:
            entry = PREDICTORS.resolve(kind)
        except ValueError as err:
            raise ValueError(f"{key}: {err}") from None
        if not entry.kind:
            raise ValueError(f"{key}: {kind!r} is a method's own predictor, not a choice of {key}")
        return
    if critics is not None and (kind in critics or Path(kind).exists() or str(kind).count("/") == 1):
        return
    shown = f", an LM critic backbone ({', '.join(critics)}, an existing path or a hub id org/name)" if critics else ""
    raise ValueError(f"{key}: {kind!r} is not {' or '.join(kinds)}{shown} (or module:attr)")


def check_layer(value: Any, key: str) -> None:
    """A calibration layer's setting (`flip_model`, `root_model`): raw (V~ as is) or calibrated (the layer)."""
    if value not in CALIBRATION_MODES:
        raise ValueError(f"{key} must be one of {', '.join(CALIBRATION_MODES)}, got {value!r}")


def check_lr(value: Any, key: str = "lr") -> None:
    """A predictor's learning rate: a positive number, or None for the predictor's own default."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{key} must be > 0 (or unset: the predictor's own default), got {value!r}")


@dataclass(frozen=True)
class PredictorSettings:
    """Which V~ scores roots and prefixes, how it learns, and the calibration layers around it: the share of
    prefixes among its training examples, its learning rate (None: the predictor's own default: 0.3 for `light`,
    `predictors.build.CRITIC_LR` for an LM critic, 0.2 for the testbed's logistic; `history` learns no weights and
    reads none), stage 2's flip model (raw: q from V~; calibrated: `experimental.flip`, around `flip_prior`, a prior
    file, or "" for q/2) and the root model (raw: TRACE's root allocator reads V~; calibrated:
    `experimental.root_calibration`). Whether a prior file reads is checked where the layer is built."""

    kind: str = "light"  # light (hashed n-grams + logistic) | history (reward history) | an LM critic (CLI)
    prefix_share: float = PREFIX_SHARE  # share of prefix examples in a predictor batch
    lr: Optional[float] = None  # the predictor's learning rate; unset: its own default
    flip_model: str = "raw"  # stage 2's flip probability: raw (from V~ alone) | calibrated (fitted on flips)
    flip_prior: str = ""  # the calibrated flip layer's prior file (lab/scripts/fit_flip_prior.py); "": q/2
    root_model: str = "raw"  # what TRACE's root allocator reads: raw (V~) | calibrated (V~ through a fitted layer)

    def __post_init__(self):
        check_prefix_share(self.prefix_share)
        check_lr(self.lr, "predictor.lr")  # the full key: a command's update group has an lr too
        check_layer(self.flip_model, "flip_model")
        check_layer(self.root_model, "root_model")
        if not isinstance(self.flip_prior, str):
            raise ValueError(f"flip_prior must be a file path or '', got {self.flip_prior!r}")
        if self.flip_prior and self.flip_model != "calibrated":
            raise ValueError(
                f"predictor.flip_prior: only predictor.flip_model=calibrated reads it (it is {self.flip_model})"
            )


@dataclass
class PredictorGroup:
    """The `predictor.*` group of a command's settings (the command line's LM commands, `simulate`): TRACE's
    predictor settings as keys to set, with the same names and defaults; `settings()` is their checked, frozen
    form. A command's group adds its own keys after these (the LM critic's epochs, VIP's encoder, warm-up trees)."""

    kind: str = PredictorSettings.kind  # light (hashed n-grams + logistic) | history | an LM critic (name, path, id)
    prefix_share: float = PredictorSettings.prefix_share  # share of prefix examples in a predictor batch
    lr: Optional[float] = PredictorSettings.lr  # the predictor's learning rate; unset: its own default
    # raw: q = r(1 - V~) + (1 - r)V~; calibrated: a layer fitted online on the flips continuations realised, per
    # bare outcome and depth (experimental/flip.py)
    flip_model: str = PredictorSettings.flip_model  # stage 2's flip probability: raw (from V~) | calibrated (fitted)
    # the calibrated layer's prior: "" is q/2 (task-agnostic); a JSON file of lab/scripts/fit_flip_prior.py is a fit on
    # earlier runs' flips, which carries the first steps (lab/notes/2026-12-02-flip-prior.md)
    flip_prior: str = PredictorSettings.flip_prior  # a flip prior file (lab/scripts/fit_flip_prior.py), calibrated only
    # raw: TRACE's root allocator reads V~; calibrated: V~ through a logistic layer fitted online on the roots' bare
    # outcomes (experimental/root_calibration.py)
    root_model: str = PredictorSettings.root_model  # raw | calibrated

    def __post_init__(self):
        self.settings()  # the one check of prefix share, lr and the layers (a kind is the command's to check)

    def settings(self) -> PredictorSettings:
        """This group's part of TRACE's one configuration."""
        return PredictorSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PredictorSettings)})


@dataclass(frozen=True)
class TraceConfig:
    """TRACE's settings, as every entry point names and defaults them."""

    method: str = "trace"  # how rollouts are allocated (METHODS)
    advantage: str = ""  # advantage estimator; '' takes the method's own
    budget: BudgetPlan = field(default_factory=BudgetPlan)  # rollouts per step and how tree methods split them
    predictor: PredictorSettings = field(default_factory=PredictorSettings)
    weighting: str = "first"  # a node shared by k leaf paths: first (once) | split (1/k per copy) | leaf (k times)

    def __post_init__(self):
        check_method(self.method)
        check_advantage(self.advantage)
        if not isinstance(self.budget, BudgetPlan):
            raise ValueError(f"budget must be a BudgetPlan, got {type(self.budget).__name__}")
        if not isinstance(self.predictor, PredictorSettings):
            raise ValueError(f"predictor must be a PredictorSettings, got {type(self.predictor).__name__}")
        # an LM critic's name is the command line's to check (it knows the backbones); here, any other name
        check_predictor_kind(self.predictor.kind, critics=[self.predictor.kind])
        check_prefix_share(self.predictor.prefix_share)
        check_weighting(self.weighting)

    @property
    def method_spec(self) -> Method:
        return METHODS.resolve(self.method)

    @property
    def advantage_name(self) -> str:
        """The estimator the rows are trained with: `advantage`, or the method's own."""
        return self.advantage or self.method_spec.advantage

    def batch_plan(self, prompts: int, rollouts_per_prompt: int, max_per_prompt: int | None = None) -> BudgetPlan:
        """The plan of a framework's batch (verl, TRL): the batch is the pool (pool factor 1), prompts x n
        rollouts, `budget.branch_factor` continuations per bare rollout when the method branches (0 otherwise)."""
        return BudgetPlan(
            prompts=prompts,
            rollouts_per_prompt=rollouts_per_prompt,
            branch_factor=self.budget.branch_factor if self.method_spec.branches else 0,
            pool_factor=1,
            max_per_prompt=self.budget.max_per_prompt if max_per_prompt is None else max_per_prompt,
        )

    @classmethod
    def from_settings(
        cls,
        settings: Mapping | None,
        where: str,
        renamed: Mapping[str, str] | None = None,
        fixed: Mapping[str, str] | None = None,
    ) -> "TraceConfig":
        """From nested plain settings (a dict, an OmegaConf node, keyword arguments): the keys are the
        dataclass's (`budget.branch_factor`, `predictor.kind`). `where` prefixes every key in an error
        (`trace_rl`); `renamed` maps an old key to the new one (refused naming it); `fixed` maps a key the
        framework sets itself to what sets it (refused naming that). Unknown keys are refused, not ignored."""
        data = _plain(settings or {}, where)
        renamed, fixed = {**RENAMED, **(renamed or {})}, dict(fixed or {})
        flat = _flatten(data)
        for key in flat:
            if key in renamed:
                raise ValueError(f"{where}.{key}: renamed; set {where}.{renamed[key]}")
            if key in fixed:
                raise ValueError(f"{where}.{key}: not a setting here; {fixed[key]}")
            if key not in _KEYS:
                raise ValueError(f"{where}.{key}: unknown setting; settings are {', '.join(sorted(_KEYS))}")
        try:
            out = cls(
                method=data.get("method", cls.method),
                advantage=data.get("advantage", cls.advantage) or "",
                budget=BudgetPlan(**data.get("budget", {})),
                predictor=PredictorSettings(**data.get("predictor", {})),
                weighting=data.get("weighting", cls.weighting),
            )
            check_predictor_kind(out.predictor.kind)  # no LM critic outside the command line
            check_method(out.method, oracle=False)  # no exact V outside the testbed
            return out
        except ValueError as err:
            raise ValueError(_qualified(str(err), where)) from None


def _field_keys(cls, prefix: str = "") -> dict[str, str]:
    """Dotted key -> its last name, for every setting of `cls`."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out.update(_field_keys(type(default), f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = f.name
    return out


_KEYS = _field_keys(TraceConfig)


def _plain(node: Any, where: str) -> Any:
    """Nested dicts of plain values from a mapping (an OmegaConf node is a Mapping too)."""
    if isinstance(node, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in node.items()}
    return node


def _flatten(data: Mapping, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value; a group given as a value that is not a mapping stays one key (refused or checked)."""
    out = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and full in ("budget", "predictor", "update"):  # update: for its renamed key
            out.update(_flatten(value, f"{full}."))
        else:
            out[full] = value
    return out


def _qualified(message: str, where: str) -> str:
    """A check's message ("prefix_share must be ...", "kind: ...") with the dotted key it names."""
    first = message.split(" ", 1)[0].rstrip(":")
    if first in _KEYS and "." in first:  # the check named the full key already
        return f"{where}.{message}"
    hits = [k for k, last in _KEYS.items() if last == first]
    if len(hits) != 1:
        return f"{where}: {message}"
    return f"{where}.{hits[0]}{message[len(first) :]}"
