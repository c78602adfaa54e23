"""`TraceGRPOTrainer`: TRL's `GRPOTrainer` (1.16) training on per-token tree advantages.

GRPOTrainer computes one advantage per row from the rewards of G consecutive rows, then its loss reads
`inputs["advantages"]` and accepts a (rows, tokens) tensor ("to support subclasses", in its own comment). This
subclass lets TRL do everything else (log-probs, importance ratios, KL, logging), then replaces the
advantages with those the `TraceRolloutFunc` computed from the trees, right-padded to TRL's completion width.
It must be built with a `TraceRolloutFunc` as `rollout_func`.
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from .rollout import TraceRolloutFunc


class TraceGRPOTrainer(GRPOTrainer):
    accepts_token_advantages = True  # TraceRolloutFunc refuses a trainer without this

    def __init__(self, *args, rollout_func: TraceRolloutFunc, **kwargs):
        if not isinstance(rollout_func, TraceRolloutFunc):
            raise TypeError(f"rollout_func must be a TraceRolloutFunc, got {type(rollout_func).__name__}")
        super().__init__(*args, rollout_func=rollout_func, **kwargs)

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        rows = self.rollout_func.last_advantages
        ids = out["completion_ids"]
        if len(rows) != ids.size(0):
            raise RuntimeError(f"{len(rows)} tree rows for {ids.size(0)} completions")
        adv = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
        for i, row in enumerate(rows):
            row = row[: ids.size(1)]
            adv[i, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
        out["advantages"] = adv
        return out
