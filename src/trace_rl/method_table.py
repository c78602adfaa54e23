"""The method table: a `Method` is one row of a comparison (root strategy x prefix strategy x advantage estimator x
the method's own predictor, each a registered name), `METHODS` the registry of the built-in ones (stable first;
the experimental variants named by `module:attr` and imported only when chosen), `get_method`,
`register_method` and compare's `method[:advantage]` spec. Part of TRACE's one configuration (`trace_config`,
which re-exports these names, as `methods` does); plain data and the standard library (the registries resolve
an entry's module only when it is used).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .registry import (
    ADVANTAGES,
    PREDICTORS,
    PREFIXES,
    ROOTS,
    Estimator,
    PredictorEntry,
    PrefixStrategy,
    Registry,
    RootStrategy,
)

STATUSES = ("stable", "experimental")  # stable: the paper's methods and baselines; experimental: research variants


@dataclass(frozen=True)
class Method:
    """One row of a comparison: root strategy x prefix strategy x advantage estimator x predictor, each a registered
    name (`registry.ROOTS`, `PREFIXES`, `ADVANTAGES`, `PREDICTORS`), a `module:attr` or the entry itself; with
    its status and, for `trace-rl methods` and the README's table, what it changes and when to use it."""

    name: str
    root: Any
    prefix: Any
    advantage: Any
    predictor: Any = ""  # the method's own V~ (PREDICTORS: history, gp, oracle); '' reads predictor.kind
    status: str = "experimental"  # stable | experimental (STATUSES)
    changes: str = ""  # what it changes, one line
    use: str = ""  # when to use it, one line

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"method {self.name}: status must be one of {', '.join(STATUSES)}, got {self.status!r}")

    @property
    def root_strategy(self) -> RootStrategy:
        return ROOTS.resolve(self.root)

    @property
    def prefix_strategy(self) -> PrefixStrategy:
        return PREFIXES.resolve(self.prefix)

    @property
    def estimator(self) -> Estimator:
        return ADVANTAGES.resolve(self.advantage)

    @property
    def own_predictor(self) -> PredictorEntry | None:
        """The V~ the method reads whatever `predictor.kind` says (None: the kind's)."""
        return PREDICTORS.resolve(self.predictor) if self.predictor else None

    @property
    def branches(self) -> bool:
        return self.prefix_strategy.branches

    @property
    def pools_stage2(self) -> bool:
        """Whether stage 2 is one allocation over the step's prompts (`trace_mix`), not one per prompt."""
        return self.prefix_strategy.pooled

    @property
    def fixed_rows(self) -> bool:
        """Whether a step's leaves never exceed its rollouts count. Under a cost budget (`trace_cost`) the count of
        continuations varies with their prices, so frameworks whose batches have a fixed number of rows refuse it."""
        return not self.prefix_strategy.priced

    @property
    def roots_on_value(self) -> bool:
        """Whether TRACE's root allocator (on V~, or on V~ recalibrated: predictor.root_model) picks the roots."""
        return self.root_strategy.reads_value

    @property
    def needs_exact_value(self) -> bool:
        """Whether it reads the exact V that only the testbed has (`trace_oracle`)."""
        own = self.own_predictor
        return own is not None and own.exact


def _stable(name: str, root: str, prefix: str, advantage: str, changes: str, use: str, predictor: str = "") -> Method:
    return Method(name, root, prefix, advantage, predictor, "stable", changes, use)


_BASELINE = "a baseline as its authors' code computes it (docs/baselines.md)"
_ABLATION = "an ablation of TRACE: what this stage buys"
_X = "trace_rl.experimental.methods"
# stable first (the paper's TRACE, its ablations, the testbed oracle, the baselines); the experimental variants are
# imported only when one is chosen or listed
METHODS: Registry[Method] = Registry(
    "method",
    Method,
    {
        **{
            m.name: m
            for m in [
                _stable(
                    "trace",
                    "active",
                    "active",
                    "trace",
                    "V~ picks the roots, stage 2 branches where an outcome may flip, tree advantages",
                    "the default: TRACE as the paper states it",
                ),
                _stable(
                    "trace_uniform",
                    "uniform",
                    "random",
                    "trace",
                    "TRACE's tree and advantages with uniform roots and random branch points",
                    _ABLATION,
                ),
                _stable(
                    "trace_root_only", "active", "random", "trace", "TRACE's roots, random branch points", _ABLATION
                ),
                _stable("trace_prefix_only", "uniform", "active", "trace", "uniform roots, TRACE's stage 2", _ABLATION),
                _stable(
                    "trace_oracle",
                    "active",
                    "active",
                    "trace",
                    "TRACE on the exact V instead of V~",
                    "the testbed only: the ceiling a perfect predictor gives",
                    predictor="oracle",
                ),
                _stable("grpo", "uniform", "none", "grpo", "flat groups of n rollouts per prompt", _BASELINE),
                _stable("pcl", "pcl", "none", "grpo", "flat groups on the prompts with V~ nearest 1/2", _BASELINE),
                _stable(
                    "knapsack_rl",
                    "knapsack",
                    "none",
                    "grpo",
                    "Knapsack RL's rollouts per prompt on each prompt's reward history",
                    _BASELINE,
                    predictor="history",
                ),
                # VIP's allocator (its trainer's RLOO rule, 1 <= n <= 32) on its Gaussian-process predictor; trained
                # with the GRPO estimator, as the other flat baselines are, so the rows differ in allocation only
                _stable(
                    "vip",
                    "vip",
                    "none",
                    "grpo",
                    "VIP's rollouts per prompt on its Gaussian-process predictor",
                    _BASELINE,
                    predictor="gp",
                ),
                _stable("treepo", "uniform", "random", "treepo", "TreePO's random branching and advantages", _BASELINE),
                _stable(
                    "tree_grpo",
                    "uniform",
                    "random",
                    "tree_grpo",
                    "Tree-GRPO's random branching and advantages",
                    _BASELINE,
                ),
            ]
        },
        **{
            name: f"{_X}:{name.upper()}"
            for name in (
                "knapsack_rl_repaired",
                "trace_pcl_root",
                "trace_rows",
                "trace_grad",
                "trace_grad_unscaled",
                "trace_cost",
                "trace_mix",
            )
        },
    },
)


def get_method(name: Any) -> Method:
    """The method `name` stands for (a registered name, module:attr, or a `Method`), or one ValueError line."""
    return METHODS.resolve(name)


def register_method(method: Method, name: str | None = None) -> Method:
    """Make `method` selectable by name in this process (`method=NAME`); returns it, so it can decorate."""
    return METHODS.register(method, name)


def method_spec(spec: str) -> tuple[str, str]:
    """(method, advantage) of compare's `method[:advantage]`, where the method may be `module:attr`: the part
    before the first ':' is a method name when the registry knows it, else a module (`mod:attr[:advantage]`)."""
    head, _, rest = spec.partition(":")
    if head in METHODS or not rest:
        return head, rest
    attr, _, advantage = rest.partition(":")
    return f"{head}:{attr}", advantage
