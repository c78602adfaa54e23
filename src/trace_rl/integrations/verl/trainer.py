"""verl's synchronous V1 trainer with tree advantages and the predictor update (`trainer.v1.trainer_mode=trace`).

`_compute_advantage` first lets verl compute its configured estimator (so rollout correction, returns and the
fields verl writes stay verl's), then overwrites the advantages of every row that carries a tree record with
the core estimator's (`advantage.merge_tree_advantages`: trees rebuilt from the rows, `trace` by default,
shared-prefix tokens weighted 1/leaves). `on_step_end` updates weights as verl's sync trainer does, then fits
the shared predictor on the step's trees (roots and branched anchors, `training_examples`), which the
manager sends to the workers before the next batch.

The example's python tool (examples/verl/python_tool.py) takes its sandbox mode from TRACE_SANDBOX; every step's
metrics carry `trace/sandbox_weak` (1 when the weaker in-process mode was chosen), read from the same variable
in this process (Ray's local workers inherit the driver's environment; set it in `runtime_env` otherwise).

Limits: KL-in-reward (`algorithm.use_kl_in_reward`) is refused, because the tree estimators read one scalar
reward per leaf; KL as a loss term works. Use `actor.loss_agg_mode=token-mean` so that a shared node's
split weights add up to one count (see `integrations.rows`).
"""

from __future__ import annotations

import os

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta

from ...predictors.base import training_examples
from ...rollout.engine import observe_layers
from ...seeding import derive_rng
from . import compat
from .advantage import merge_tree_advantages
from .budgets import CONFIG_KEY, TraceSettings
from .compat import PPOTrainerSync, register_trainer, response_to_nested
from .predictor_state import shared_layers, shared_predictor

TRAINER_NAME = "trace"


def _rows(nested: torch.Tensor) -> list[torch.Tensor]:
    return list(nested.unbind()) if getattr(nested, "is_nested", False) else list(nested)


@register_trainer(TRAINER_NAME)
class TraceTrainer(PPOTrainerSync):
    def __init__(self, config):
        super().__init__(config)
        if config.algorithm.use_kl_in_reward:
            raise ValueError(
                "trainer_mode=trace reads one reward per leaf; set algorithm.use_kl_in_reward=False "
                "(KL as a loss term, actor.use_kl_loss, is fine)"
            )
        self.trace = TraceSettings.from_config(config.get(CONFIG_KEY, None))
        self.predictor = shared_predictor(self.trace.config, self.trace.seed)  # the manager's object
        self.layers = shared_layers(self.trace.config, self.trace.seed)  # the manager's (flip, root) layers
        self._step_trees: list = []

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_advantage(batch, metrics)
        metrics["trace/sandbox_weak"] = float(os.environ.get("TRACE_SANDBOX", "strict") == "weak")
        data = tq.kv_batch_get(
            keys=batch.keys,
            partition_id=batch.partition_id,
            select_fields=["response_mask", "rm_scores", "advantages", "extra_fields"],
        )
        mask = data["response_mask"]
        lengths = [int(n) for n in mask.offsets().diff().tolist()]
        scores = [float(r.sum()) for r in _rows(data["rm_scores"])]
        base = [a.float().cpu().numpy() for a in _rows(data["advantages"])]
        extra = [getattr(e, "data", e) for e in list(data["extra_fields"])]
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        advs, trees = merge_tree_advantages(
            extra, scores, lengths, padding, base, self.trace.advantage, self.trace.config.weighting
        )
        if not trees:
            return batch
        self._step_trees.extend(trees)
        width = max(lengths, default=0)
        padded = torch.zeros(len(advs), width, dtype=torch.float32)
        for i, a in enumerate(advs):
            padded[i, : len(a)] = torch.as_tensor(a, dtype=torch.float32)
        nested = response_to_nested(padded, mask)
        out = TensorDict({"advantages": nested, "returns": nested.clone()}, batch_size=len(batch))
        metrics.update(tree_metrics(trees, extra, padding))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)

    def on_step_end(self):
        super().on_step_end()
        trees, self._step_trees = self._step_trees, []
        rng = derive_rng(self.trace.seed, "predictor-examples", self.global_steps)
        examples, targets = training_examples(trees, self.trace.config.predictor.prefix_share, rng)
        if examples:
            loss = float(self.predictor.update(examples, targets))
            metrics = {"trace/predictor_loss": loss, "trace/predictor_examples": float(len(examples))}
            compat.add_sync_metrics(self, metrics)
        if trees:  # as the engine fits them after its predictor update (`rollout.engine.observe_layers`)
            observe_layers(*self.layers, trees, self.trace.method_spec)


def tree_metrics(trees: list, extra: list, padding: list) -> dict[str, float]:
    """What a step's trees looked like: leaves per tree, branched anchors, mixed trees, unspent budget."""
    leaves = [len(t.leaves()) for t in trees]
    anchors = [sum(1 for n in t.turns() if len(n.children) >= 2) for t in trees]
    unspent = {}
    for ef, pad in zip(extra, padding):
        if not pad and isinstance(ef, dict) and "trace" in ef:
            unspent[ef["trace"]["root_id"]] = float(ef["trace"].get("unspent", 0))
    return {
        "trace/trees": float(len(trees)),
        "trace/leaves_per_tree": float(np.mean(leaves)),
        "trace/branched_anchors_per_tree": float(np.mean(anchors)),
        "trace/mixed_tree_share": float(np.mean([t.is_mixed() for t in trees])),
        "trace/unspent_prefix_budget": float(sum(unspent.values())),
    }
