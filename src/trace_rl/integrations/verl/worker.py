"""verl's V1 agent-loop worker with TRACE trees: each training prompt grows one tree, each leaf is a session.

`TraceAgentLoopWorker` subclasses verl 0.9.1's `AgentLoopWorkerTQ` (the class under its `@ray.remote`) and
replaces `_run_prompt`, the per-prompt method that starts `__rollout_n__` independent sessions. Here that
count is the tree's number of bare rollouts; stage 2 (V~ of each prefix from the manager's predictor, the
exact prefix allocation, the continuations) runs in `tree_actor.grow_prompt_tree`, i.e. in the core engine.
Every leaf then goes into TransferQueue as its own session `{uid}_{leaf index}_0` (integers, as verl
expects), with its leaf record in `extra_fields["trace"]`: the leaf's path in tree.py's own format
(`advantage.leaf_record`, `RolloutTree.path_dict`) plus the tree's unspent prefix budget.

The prompt group's status protocol is verl's: `running` when the prompt starts, then `finished`, or
`failure` if anything raised (no leaf of a failed tree is written, so the trainer never sees half a tree).
Validation, and any prompt without a tree method's agent loop, takes verl's own path unchanged.
"""

from __future__ import annotations

import logging
import math

import hydra
import ray
import transfer_queue as tq

from ...predictors.build import build_predictor
from ...rollout.engine import calibration_layers
from ...seeding import derive_seed
from . import compat
from .advantage import TRACE_FIELD, leaf_record
from .budgets import CONFIG_KEY, ROLLOUT_N_KEY, TraceSettings, prompt_text
from .compat import DictConfigWrap, ToolListWrap
from .loop import TraceToolAgentLoop
from .predictor_state import load_bytes, load_layer
from .tree_actor import grow_prompt_tree

logger = logging.getLogger(__name__)
VALUE_KEY = "__trace_value__"  # V~ of the prompt from the manager (logged on the tree's root)


class _TraceAgentLoopWorker(compat.AgentLoopWorkerBase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trace = TraceSettings.from_config(self.config.get(CONFIG_KEY, None))
        # this worker's own copy (the manager sends its weights before each batch), from the one predictor builder
        self.predictor = build_predictor(self.trace.config.predictor, self.trace.method_spec, self.trace.seed)
        self.flip_model = calibration_layers(self.trace.config)[0]  # stage 2's flip layer; the manager sends its state

    def set_trace_predictor(self, blob: bytes | None, flip: bytes | None = None) -> None:
        """The manager's current predictor weights and flip layer state, sent before each training batch."""
        if blob is not None:
            load_bytes(self.predictor, blob)
        load_layer(self.flip_model, flip)

    def _agent_loop(self, agent_name: str):
        """An agent loop instance as `AgentLoopWorker._run_agent_loop` builds it (verl 0.9.1)."""
        return hydra.utils.instantiate(
            config=compat.agent_loop_config(agent_name),
            trainer_config=DictConfigWrap(config=self.config),
            server_manager=self.llm_client,
            tokenizer=self.tokenizer,
            processor=self.processor,
            hf_model_type=self.hf_model_type,
            dataset_cls=self.dataset_cls,
            data_config=DictConfigWrap(self.config.data),
            tools=ToolListWrap(self.tools),
        )

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        agent_name = prompt.get("agent_name")
        registered = compat.agent_loop_config(agent_name) is not None
        is_tree = registered and not trajectory["validate"] and ROLLOUT_N_KEY in prompt
        loop = self._agent_loop(agent_name) if is_tree else None
        if not isinstance(loop, TraceToolAgentLoop):
            return await super()._run_prompt(prompt, sampling_params, trajectory, trace)
        uid = prompt["uid"]
        await tq.async_kv_put(key=uid, partition_id="train", tag={"status": "running"})
        status = "failure"
        try:
            roots = int(prompt.pop(ROLLOUT_N_KEY))
            prompt.pop("__do_sample__", None)
            value = float(prompt.pop(VALUE_KEY, math.nan))
            if roots > 0:
                await self._grow_and_put(loop, uid, prompt, roots, value, dict(sampling_params), trajectory)
            status = "finished"
        except Exception:
            logger.exception("TRACE tree of prompt %s failed", uid)
        await tq.async_kv_put(key=uid, partition_id="train", tag={"status": status})

    async def _grow_and_put(
        self,
        loop: TraceToolAgentLoop,
        uid: str,
        prompt: dict,
        roots: int,
        value: float,
        sampling_params: dict,
        trajectory: dict,
    ) -> None:
        kwargs = {k: v for k, v in prompt.items() if k != "agent_name"}

        async def score(output) -> float | None:
            await compat.compute_score(self, [output], {**kwargs, "session_id": 0})
            return output.reward_score

        def open_sessions(k: int):
            return [loop.session(sampling_params, f"trace-{uid}", score, **kwargs) for _ in range(k)]

        step = int(trajectory["step"])
        tree, leaves, result = await grow_prompt_tree(
            uid,
            {"question": prompt_text(prompt.get("raw_prompt"))},
            roots,
            open_sessions,
            self.predictor,
            self.trace.config,
            derive_seed(self.trace.seed, "verl-tree", uid),
            step,
            self.flip_model,
        )
        if not math.isnan(value):
            tree.root.predicted = value
        tree.compute_targets()
        for index, (leaf_id, session) in enumerate(leaves):
            output = session.output
            output.extra_fields[TRACE_FIELD] = {**leaf_record(tree, leaf_id), "unspent": result.unspent_prefix_budget}
            await compat.postprocess(self, output, trajectory["validate"], session_id=index, **kwargs)


TraceAgentLoopWorker = ray.remote(_TraceAgentLoopWorker)
