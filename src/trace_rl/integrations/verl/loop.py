"""verl's multi-turn tool agent loop, turn by turn: `TraceToolAgentLoop` (registered as `trace_tool_agent`) opens
`ToolLoopSession`s that the tree worker steps, forks and finishes.

Written against verl 0.9.1's `ToolAgentLoop` (an alpha API): it reuses the loop's own state handlers
(`_handle_pending_state`, `_handle_generating_state`, `_handle_processing_tools_state`, reached through
`compat`, like every private name of verl) and repeats the
opening and closing of `run()` (building `AgentData`, per-sample tool selection; assembling the
`AgentLoopOutput`), which are inline there. A verl upgrade must re-check those two copies.

Every session of a tree sends the same sticky `request_id` (`trace-<uid>`), so verl's load balancer keeps the
tree on one vLLM replica and its prefix cache serves the branches; vLLM itself still gets a fresh id per turn.
As a plain agent loop (`run`) it behaves exactly as `tool_agent`, so validation and flat methods can use it.
"""

from __future__ import annotations

import copy
from typing import Any, Awaitable, Callable

from . import compat
from .compat import AgentData, AgentLoopOutput, AgentState, ToolAgentLoop, register

AGENT_NAME = "trace_tool_agent"
# AgentData fields that a fork must not share with its source; the rest (tools, images, kwargs) are shared.
_OWN_FIELDS = (
    "messages",
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "turn_scores",
    "tool_rewards",
    "tool_calls",
    "metrics",
    "extra_fields",
)


def copy_agent_data(data: AgentData) -> AgentData:
    """A fork of a session's state: its own token history and messages, the same tool objects."""
    twin = copy.copy(data)
    for name in _OWN_FIELDS:
        setattr(twin, name, copy.deepcopy(getattr(data, name)))
    return twin


@register(AGENT_NAME)
class TraceToolAgentLoop(ToolAgentLoop):
    def session(
        self,
        sampling_params: dict[str, Any],
        request_id: str,
        score: Callable[[AgentLoopOutput], Awaitable[float | None]],
        **kwargs,
    ) -> "ToolLoopSession":
        return ToolLoopSession(self, sampling_params, request_id, score, kwargs)

    async def _open(self, request_id: str, **kwargs) -> AgentData:
        """`ToolAgentLoop.run` up to its state machine (verl 0.9.1), with the tree's request id."""
        messages = list(kwargs["raw_prompt"])
        multi_modal_data = await self.process_multi_modal_info(messages)
        audios = multi_modal_data.get("audios")
        data = AgentData(
            messages=messages,
            image_data=multi_modal_data.get("images"),
            video_data=multi_modal_data.get("videos"),
            audio_data=audios,
            mm_processor_kwargs=compat.mm_processor_kwargs(self, audios),
            metrics={},
            request_id=request_id,
            tools_kwargs=kwargs.get("tools_kwargs", {}),
        )
        selection = (kwargs.get("extra_info", {}) or {}).get("tool_selection")
        if selection and self.tools:
            chosen = {name: self.tools[name] for name in selection if name in self.tools}
            schemas = [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in chosen.values()]
            compat.set_active_tools(data, chosen, schemas)
        else:
            compat.set_active_tools(data, self.tools, self.tool_schemas)
        return data

    def _close(self, data: AgentData) -> AgentLoopOutput:
        """`ToolAgentLoop.run` after its state machine (verl 0.9.1)."""
        n = len(data.response_mask)
        response_ids = data.prompt_ids[-n:] if n else []
        prompt_ids = data.prompt_ids[: len(data.prompt_ids) - n]
        mm = {}
        for key, value in (("images", data.image_data), ("videos", data.video_data), ("audios", data.audio_data)):
            if value is not None:
                mm[key] = value
        out = AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[: self.response_length],
            response_mask=data.response_mask[: self.response_length],
            multi_modal_data=mm,
            mm_processor_kwargs=data.mm_processor_kwargs,
            mm_processor_output=data.mm_processor_output,
            response_logprobs=data.response_logprobs[: self.response_length] if data.response_logprobs else None,
            num_turns=data.user_turns + data.assistant_turns + 1,
            metrics=data.metrics,
            routed_experts=(
                data.routed_experts[: len(prompt_ids) + self.response_length]
                if data.routed_experts is not None
                else None
            ),
            extra_fields=data.extra_fields,
        )
        out.extra_fields.update({"turn_scores": data.turn_scores, "tool_rewards": data.tool_rewards})
        return out


class ToolLoopSession:
    """One rollout of the tool loop, one turn (a generation and its tool calls) per `step()`."""

    def __init__(
        self,
        loop: TraceToolAgentLoop,
        sampling_params: dict,
        request_id: str,
        score: Callable[[AgentLoopOutput], Awaitable[float | None]],
        kwargs: dict,
    ):
        self.loop, self.sampling_params, self.request_id, self.score, self.kwargs = (
            loop,
            sampling_params,
            request_id,
            score,
            kwargs,
        )
        self.data: AgentData | None = None
        self.state = AgentState.PENDING
        self.done, self.reward, self.output = False, None, None

    async def step(self) -> dict:
        if self.done:
            raise RuntimeError("step() on a finished session")
        loop = self.loop
        if self.state == AgentState.PENDING:
            self.data = await loop._open(self.request_id, **self.kwargs)
            self.state = await compat.handle_pending(loop, self.data, self.sampling_params)
        data = self.data
        before_ids, before_resp = list(data.prompt_ids), len(data.response_mask)
        self.state = await compat.handle_generating(loop, data, self.sampling_params)
        if self.state == AgentState.PROCESSING_TOOLS:
            self.state = await compat.handle_processing_tools(loop, data)
        if data.prompt_ids[: len(before_ids)] != before_ids:
            # the tree stores each turn's tokens once, below its prefix: a rewritten prefix would break that
            raise RuntimeError("the agent loop rewrote earlier tokens of the history; a tree cannot hold it")
        token_ids = data.prompt_ids[len(before_ids) :]
        mask = list(data.response_mask[before_resp:])
        if len(mask) != len(token_ids):
            raise RuntimeError(f"turn of {len(token_ids)} tokens came with a response mask of {len(mask)}")
        lps = list(data.response_logprobs[before_resp:]) if data.response_logprobs else []
        policy_lps = [lp for lp, m in zip(lps, mask) if m] if len(lps) == len(mask) else []
        tok = loop.tokenizer
        turn = {
            "token_ids": token_ids,
            "loss_mask": mask,
            "logprobs": policy_lps,
            "action": tok.decode([t for t, m in zip(token_ids, mask) if m], skip_special_tokens=True),
            "observation": tok.decode([t for t, m in zip(token_ids, mask) if not m], skip_special_tokens=True),
        }
        if self.state == AgentState.TERMINATED:
            self.output = loop._close(data)
            reward = await self.score(self.output)
            if reward is None:
                raise RuntimeError(
                    "TRACE's tree worker needs each rollout's reward before it branches: use verl's "
                    "streaming reward loop (a rule-based reward, or reward_model.enable_resource_pool)"
                )
            self.done, self.reward = True, float(reward)
        return turn

    def fork(self) -> "ToolLoopSession":
        twin = ToolLoopSession(self.loop, self.sampling_params, self.request_id, self.score, self.kwargs)
        twin.state, twin.done, twin.reward, twin.output = self.state, self.done, self.reward, self.output
        twin.data = copy_agent_data(self.data) if self.data is not None else None
        return twin
