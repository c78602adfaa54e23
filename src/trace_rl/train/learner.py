"""The LM learner of `train`'s run loop (`rollout.run_loop.Learner`): after each TRACE step, the step's rate from
the schedule, the tree-packed policy update on the step's trees with the method's advantages (`update`), and the
weight sync to the backend that samples the next step."""

from __future__ import annotations

from ..advantages import batch_advantages
from ..rollout.engine import StepResult
from ..trace_config import TraceConfig
from .update import UpdateConfig, schedule_lr, update_policy


class LMLearner:
    """Updates `model` (sampled through `policy`, the LM stack's `stack.build.PolicyStack`) after each step."""

    def __init__(
        self,
        model,
        optimizer,
        policy,
        cfg: UpdateConfig,
        steps: int,
        trace: TraceConfig,
        ref_model=None,
        temperature: float = 1.0,
    ):
        """`trace`: the run's TRACE configuration (its advantage estimator and the weighting of shared turns)."""
        self.model, self.optimizer, self.policy, self.cfg = model, optimizer, policy, cfg
        self.steps, self.trace, self.ref_model, self.temperature = steps, trace, ref_model, temperature

    def begin_step(self) -> None:
        """A step never depends on what earlier steps or evaluations left cached; it samples with dropout off."""
        self.policy.backend.clear_cache()
        self.model.eval()

    def update(self, result: StepResult, step: int) -> dict[str, float]:
        """One update of `steps` on the step's trees at the scheduled rate (a function of the step alone, so a
        resumed run trains at the rate an uninterrupted one had); returns its metrics and `lr`."""
        self.model.train()
        lr = schedule_lr(self.optimizer, self.cfg, step, self.steps)
        active = result.active
        stats = update_policy(
            self.model,
            self.optimizer,
            active,
            batch_advantages(self.trace.advantage_name, active),
            self.cfg,
            ref_model=self.ref_model,
            temperature=self.temperature,  # log-probs of the distribution the rollouts sampled
            weighting=self.trace.weighting,
        )
        self.model.eval()
        self.policy.sync_weights()  # the backend samples the new weights; no cached KV of the old ones
        return {**{k.split("/", 1)[1]: v for k, v in stats.items()}, "lr": lr}
