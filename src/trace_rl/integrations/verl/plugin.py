"""The `verl.plugins` entry point: `import verl` loads this module in every process (driver, TaskRunner, agent-loop
workers, Ray actors) and its imports register TRACE's pieces with verl's process-local registries:
- agent loop `trace_tool_agent` (`loop.TraceToolAgentLoop`),
- trainer mode `trace` (`trainer.TraceTrainer`, V1 `register_trainer`),
- advantage estimator `trace` (`register_adv_est`): the flat form, for rows without tree metadata.
The manager is named by class path in the config, so it needs no registration.

verl 0.9.1 loads plugins at the end of its own `__init__` and logs a failing plugin at DEBUG level only, so
a broken import here would pass silently; `REGISTERED` lets a launch script (and the tests) check it worked.
`VERL_USE_EXTERNAL_PLUGINS=none` turns all plugins off.
"""

from __future__ import annotations

import numpy as np
import torch

from . import loop, trainer
from .advantage import flat_trace_advantages
from .compat import register_adv_est

ESTIMATOR_NAME = "trace"


@register_adv_est(ESTIMATOR_NAME)
def compute_trace_flat_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None, config=None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """`trace` on flat groups (every rollout of a prompt a chain): (r - mean) / (std + 1e-6) per prompt with the
    population std. Trees need `trainer.v1.trainer_mode=trace`, which reads the tree metadata."""
    scores = token_level_rewards.sum(dim=-1).detach().cpu().numpy()
    index = np.arange(len(scores)) if index is None else index
    # verl's own switch for Dr.GRPO-style unscaled advantages applies here too
    scaled = config.get("norm_adv_by_std_in_grpo", True) if hasattr(config, "get") else True
    adv = flat_trace_advantages(scores, index, scale="std" if scaled else "none")
    adv = torch.as_tensor(adv, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


REGISTERED = {"agent_loop": loop.AGENT_NAME, "trainer": trainer.TRAINER_NAME, "adv_estimator": ESTIMATOR_NAME}
