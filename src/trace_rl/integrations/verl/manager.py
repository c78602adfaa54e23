"""verl's V1 agent-loop manager with TRACE's stage 1: score the batch, allocate roots, hand out the predictor.

Selected with `+actor_rollout_ref.rollout.agent.agent_loop_manager_class=
trace_rl.integrations.verl.manager.TraceAgentLoopManager`. For each training batch it scores every prompt with
the shared predictor, runs the method's root allocator (`budgets.root_counts`: the batch is the pool, the
total stays batch size x rollout.n), writes each row's count to `__rollout_n__` (which verl 0.9.1's worker
pops per prompt) and V~ to `__trace_value__`, sends the predictor's weights to every worker, then dispatches
as verl does. Validation batches pass through untouched (rollout.val_kwargs.n flat sessions).

A prompt given 0 rollouts still reaches the worker and finishes as an empty group: verl's replay buffer
samples it with no rows, so the step trains on the prompts the allocator chose.
"""

from __future__ import annotations

import numpy as np
import ray
import torch
from tensordict import TensorDict

from .budgets import CONFIG_KEY, ROLLOUT_N_KEY, TraceSettings, prompt_trees, root_counts
from .compat import AgentLoopManagerTQ
from .predictor_state import layer_bytes, shared_layers, shared_predictor, to_bytes
from .worker import VALUE_KEY, TraceAgentLoopWorker


def _column(batch: TensorDict, key: str) -> list:
    value = batch.get(key)
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _scalar(batch: TensorDict, key: str, default):
    if key not in batch.keys():
        return default
    value = batch[key]
    return getattr(value, "data", value)


class TraceAgentLoopManager(AgentLoopManagerTQ):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = TraceAgentLoopWorker  # AgentLoopManagerTQ set verl's; the trees need ours
        self.trace = TraceSettings.from_config(self.config.get(CONFIG_KEY, None))
        self.predictor = shared_predictor(self.trace.config, self.trace.seed)  # the trainer updates this one
        self.flip_model, self.root_model = shared_layers(self.trace.config, self.trace.seed)  # the trainer fits them
        # refuse at start-up, not at the first batch, a budget verl's mini-batches cannot take
        batch = int(self.config.data.get("gen_batch_size", None) or self.config.data.train_batch_size)
        root_counts(np.full(batch, 0.5), int(self.rollout_config.n), self.trace)

    def allocate(self, prompts: TensorDict) -> np.ndarray:
        """Write the batch's root counts and V~ into `prompts`; returns the counts."""
        trees = prompt_trees(_column(prompts, "uid"), _column(prompts, "raw_prompt"))
        values = self.predictor.predict([(t, t.root_id) for t in trees])
        step = int(_scalar(prompts, "global_steps", 0))
        read = values  # TRACE's root allocator reads V~ through the root layer (predictor.root_model=calibrated)
        if self.root_model is not None and self.trace.method_spec.roots_on_value:
            read = self.root_model.predict(values)
        counts = root_counts(read, int(self.rollout_config.n), self.trace, step=step)
        prompts[ROLLOUT_N_KEY] = torch.as_tensor(counts, dtype=torch.int64)
        prompts[VALUE_KEY] = torch.as_tensor(values, dtype=torch.float32)
        return counts

    def generate_sequences(self, prompts: TensorDict) -> None:
        if not bool(_scalar(prompts, "validate", False)):
            self.allocate(prompts)
            blob, flip = to_bytes(self.predictor), layer_bytes(self.flip_model)
            ray.get([w.set_trace_predictor.remote(blob, flip) for w in self.agent_loop_workers])
        super().generate_sequences(prompts)
