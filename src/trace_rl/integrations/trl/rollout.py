"""A `rollout_func` for TRL's `GRPOTrainer` (TRL 1.16) that grows TRACE trees and returns their leaves.

TRL's contract (trl/trainer/grpo_trainer.py, `_generate`): `rollout_func(prompts, trainer) -> dict` receives
this process's prompts, each repeated `num_generations` (G) times in a row by TRL's `RepeatSampler`, and must
return one row per received prompt: `prompt_ids`, `completion_ids` and `logprobs` (lists per row); any other
key is forwarded to the reward functions per row; `env_mask` (1 policy token, 0 environment token) becomes
the loss mask when the trainer has no `tools` of its own.

Here the P distinct prompts of the slice are one step's candidate pool: the core engine allocates P x G
rollouts across them (stage 1), branches from the allocated prefixes (stage 2) and updates the predictor,
in this process, on the LM agent stack (`rollout.lm_actor`: a token-in/token-out backend and an `AgentEnv`).
Each leaf becomes a row (`integrations.rows`): its path's tokens, mask and log-probs, and the per-token tree
advantages (shared-prefix tokens weighted 1/leaves), kept on `last_advantages` for `TraceGRPOTrainer`.

Limits:
- Rows are leaves, not the input prompts: row i does not belong to received prompt i, and trees have
  unequal leaf counts, so TRL's own advantage (reward minus the mean of G consecutive rows) would be wrong.
  `TraceGRPOTrainer` replaces it with the tree advantages; with the plain `GRPOTrainer` this function
  refuses to run. Reward functions see `trace_reward` per row (`tree_reward` returns it), for logging.
- When the leaves fall short of P x G (a prompt with no anchor to branch from, or P x G not divisible by
  1 + branch_factor) the rest are filler rows with mask 0 and advantage 0: they cost a forward pass, no
  gradient. Use a loss that sums tokens (`loss_type="dapo"` or `"bnpo"`) so a shared node counts once.
- Each process grows and trains its own predictor on its own slice (no cross-process sync).
- Generation uses this project's backends (the HF backend on the trainer's model by default), not TRL's vLLM.
- Evaluation (`trainer.evaluate()`, model in eval mode) is plain: G independent rollouts per eval prompt, in
  prompt order, no allocation, no branching, and no predictor update (eval prompts must not train it).

Settings: the keyword arguments are TRACE's one configuration (`trace_config.TraceConfig`), with the command
line's names and defaults: `method`, `advantage`, `budget` (its `branch_factor` and `max_per_prompt`; TRL
decides the prompts and the group size, and the slice is the pool), `predictor` (`kind`, `prefix_share`, `lr`,
and the calibration layers `flip_model`, `flip_prior`, `root_model`, kept across calls as the predictor is; or a
`Predictor` object of one's own) and `weighting`. The names used before (`estimator`, a flat `branch_factor` or
`max_per_prompt`, `predictor.critic_lr`) are refused in one line that names the new one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from ...backends.base import PolicyBackend, SamplingParams
from ...envs.base import AgentEnv
from ...methods import BudgetPlan
from ...predictors.base import Predictor
from ...predictors.build import build_predictor
from ...rollout.engine import StepResult, TreeRolloutEngine, calibration_layers
from ...rollout.lm_actor import LMActor
from ...trace_config import PredictorSettings, TraceConfig
from ..rows import PathRow, batch_rows

REQUIRED = ("prompt_ids", "completion_ids", "logprobs")
WHERE = "TraceRolloutFunc"
# keyword arguments named otherwise before TRACE had one configuration: refused, naming the new one
RENAMED = {"estimator": "advantage", "branch_factor": "budget.branch_factor", "max_per_prompt": "budget.max_per_prompt"}
SET_BY_TRL = {
    "budget.prompts": "the distinct prompts TRL hands over are the pool",
    "budget.rollouts_per_prompt": "TRL's num_generations sets it",
    "budget.pool_factor": "the slice TRL hands over is the candidate pool (pool factor 1)",
}


def trace_config(method: str, advantage: str, budget, predictor, weighting: str, old: Mapping) -> TraceConfig:
    """TRACE's configuration from `TraceRolloutFunc`'s keyword arguments (one line naming a bad or renamed one)."""
    for key in old:
        if key in RENAMED:
            new, _, sub = RENAMED[key].partition(".")
            hint = f"{new}={{'{sub}': ...}}" if sub else f"{new}=..."
            raise TypeError(f"{WHERE}({key}=...): renamed; pass {hint}")
        raise TypeError(f"{WHERE}() got an unexpected keyword argument {key!r}")
    settings: dict[str, Any] = {"method": method, "advantage": advantage, "weighting": weighting}
    if isinstance(budget, BudgetPlan):  # only what TRL leaves to us may differ from the defaults
        default = BudgetPlan()
        budget = {k: v for k, v in dataclasses.asdict(budget).items() if v != getattr(default, k)}
    if budget is not None:
        settings["budget"] = budget
    if isinstance(predictor, PredictorSettings):
        predictor = dataclasses.asdict(predictor)
    if predictor is not None:
        settings["predictor"] = predictor
    config = TraceConfig.from_settings(settings, WHERE, fixed=SET_BY_TRL)
    if not config.method_spec.fixed_rows:  # TRL takes one row per received prompt, no more
        raise ValueError(
            f"{WHERE}(method={method!r}): it spends a cost budget, so its leaves vary in number and may exceed "
            "the prompts x num_generations rows TRL takes; choose a method counted in rollouts such as trace"
        )
    return config


def hf_backend(trainer) -> PolicyBackend:
    """The project's HF backend on the trainer's own (unwrapped) model; its training mode is left as it was."""
    from ...backends.hf import HFBackend

    model = trainer.accelerator.unwrap_model(trainer.model)
    was_training = model.training
    backend = HFBackend(model, trainer.processing_class)
    model.train(was_training)  # HFBackend puts the model in eval mode; TRL reads model.training for its mode
    return backend


def tree_reward(completions, trace_reward: Sequence[float], **kwargs) -> list[float]:
    """A TRL reward function returning each row's leaf reward (for TRL's reward logging; filler rows get 0)."""
    return [float(r) for r in trace_reward]


class TraceRolloutFunc:
    def __init__(
        self,
        env_factory: Callable[[], AgentEnv],
        backend: PolicyBackend | Callable[[Any], PolicyBackend] = hf_backend,
        task_from_prompt: Callable[[Any], dict] | None = None,
        method: str = TraceConfig.method,
        advantage: str = TraceConfig.advantage,
        budget: BudgetPlan | Mapping | None = None,
        predictor: PredictorSettings | Mapping | Predictor | None = None,
        weighting: str = TraceConfig.weighting,
        params: SamplingParams | None = None,
        seed: int = 0,
        **renamed,
    ):
        self.env_factory, self.backend, self.task_from_prompt = env_factory, backend, task_from_prompt
        own = predictor if hasattr(predictor, "predict") and hasattr(predictor, "update") else None
        self.config = trace_config(method, advantage, budget, None if own else predictor, weighting, renamed)
        # one's own V~ object, or the one builder's from the settings (the method's own where it has one)
        self.predictor = (
            own if own is not None else build_predictor(self.config.predictor, self.config.method_spec, seed)
        )
        # the calibration layers (predictor.flip_model, root_model) live as long as the predictor: one engine per
        # call reads and updates the same ones
        self.layers = calibration_layers(self.config)
        self.params = params or SamplingParams(max_new_tokens=64)
        self.seed = seed
        self._backend: PolicyBackend | None = None
        self.last_rows: list[PathRow | None] = []
        self.last_advantages: list[list[float]] = []
        self.last_result: StepResult | None = None

    def _policy(self, trainer) -> PolicyBackend:
        if self._backend is None:
            self._backend = self.backend(trainer) if callable(self.backend) else self.backend
        self._backend.invalidate()  # the weights moved since the last call: no cached KV may survive
        return self._backend

    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        if not getattr(trainer, "accepts_token_advantages", False):
            raise TypeError(
                "TRACE rows carry per-token tree advantages that GRPOTrainer would overwrite with its "
                "own group baseline; use trace_rl.integrations.trl.TraceGRPOTrainer"
            )
        g = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        if len(prompts) % g:
            raise ValueError(f"{len(prompts)} prompts is not a multiple of num_generations={g}")
        unique = [prompts[i] for i in range(0, len(prompts), g)]
        for i, p in enumerate(unique):
            if any(q != p for q in prompts[i * g : (i + 1) * g]):
                raise ValueError(
                    "rollout_func expects each prompt repeated num_generations times in a row (TRL's RepeatSampler)"
                )
        tasks = [self.task_from_prompt(p) if self.task_from_prompt else p for p in unique]
        training = bool(trainer.model.training)
        # evaluation: GRPO's uniform plan (g bare rollouts per prompt), no branching, predictor left as it was
        config = self.config if training else dataclasses.replace(self.config, method="grpo", advantage="")
        plan = config.batch_plan(len(tasks), g)
        actor = LMActor(self._policy(trainer), self.env_factory, self.params)
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        engine = TreeRolloutEngine.from_config(
            actor, self.predictor, config, seed=self.seed, plan=plan, update_predictor=training, layers=self.layers
        )
        result = engine.grow(tasks, config.method_spec, step)
        self.last_result = result
        rows = batch_rows(result.active, config.advantage_name, config.weighting)
        return self.rows_to_output(rows, len(prompts))

    def rows_to_output(self, rows: list[PathRow], total: int) -> dict[str, list]:
        """TRL's output dict for `rows`, topped up with filler rows (mask 0, advantage 0) to `total` rows."""
        if len(rows) > total:
            raise RuntimeError(f"{len(rows)} leaves for {total} rows: the budget was overspent")
        if not rows:
            raise RuntimeError("the step grew no leaf (every prompt was skipped)")
        filler = [None] * (total - len(rows))
        self.last_rows = list(rows) + filler
        out = {k: [] for k in (*REQUIRED, "env_mask", "trace_reward", "trace_tree", "trace_leaf")}
        self.last_advantages = []
        for row in self.last_rows:
            src = row or rows[0]  # a filler row repeats a real one with nothing to learn from it
            out["prompt_ids"].append(list(src.prompt_ids))
            out["completion_ids"].append(list(src.completion_ids))
            out["logprobs"].append(list(src.logprobs) if src.logprobs is not None else [0.0] * len(src.completion_ids))
            out["env_mask"].append(list(src.loss_mask) if row else [0] * len(src.completion_ids))
            out["trace_reward"].append(src.reward if row else 0.0)
            out["trace_tree"].append(src.root_id if row else "")
            out["trace_leaf"].append(src.leaf_id if row else "")
            self.last_advantages.append(row.weighted_advantages if row else [0.0] * len(src.completion_ids))
        return out
