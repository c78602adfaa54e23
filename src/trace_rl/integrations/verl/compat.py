"""Every name the verl plugin takes from verl, and every reach into verl's private state, in one module, behind a
version check: on any verl but the one it is written against, importing it fails in one line.

The plugin is written against verl 0.9.1's V1 trainer and agent-loop API (alpha: it moved in every minor
release). What it uses beyond the public API, all of it here:
- the agent-loop registry (`_agent_loop_registry`), read to build an agent loop as verl's worker does;
- the class under verl's `@ray.remote` agent-loop worker (`AgentLoopWorkerTQ.__ray_actor_class__`), subclassed;
- private methods it overrides or calls (`PRIVATE_SEAMS`): the worker's `_run_prompt`, `_compute_score`,
  `_agent_loop_postprocess`; the tool loop's state handlers and its multi-modal keyword helper; the trainer's
  `_compute_advantage`; checked to exist when this module loads, so a verl that renamed one fails here, not in
  the middle of a run;
- private attributes it writes: `AgentData._active_tools` / `_active_tool_schemas` (per-sample tool selection)
  and the trainer's `_pending_sync_metrics` (metrics logged after the weight sync).
The other modules of `integrations/verl` import verl only through here (a test checks it).

Limits: the check is by version string and by the names' presence, not by behaviour: a verl build that kept
0.9.1's version string and changed what a seam does is not caught here (the live tests are what catch that).
verl logs a plugin that fails to load at DEBUG level only, so the version error shows when a launch script
checks `plugin.REGISTERED` or when verl loads the manager class by path, which imports this module again.
"""

from __future__ import annotations

import verl

VERL_VERSION = "0.9.1"  # the verl this plugin is written against (scripts/install_verl_env.sh installs it)


def check_version(found: str | None) -> None:
    """One line when `found` is not the verl this plugin is written against."""
    if found != VERL_VERSION:
        raise ImportError(
            f"trace-rl's verl plugin is written against verl {VERL_VERSION} (it reaches into private parts of "
            f"verl's agent loop and V1 trainer), found verl {found}; install verl=={VERL_VERSION} "
            "(scripts/install_verl_env.sh)"
        )


check_version(getattr(verl, "__version__", None))

# the public and private names the plugin uses, imported only after the version check
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
    register,
)
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop  # noqa: E402
from verl.trainer.ppo.core_algos import register_adv_est  # noqa: E402
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import register_trainer  # noqa: E402
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402
from verl.workers.utils.padding import response_to_nested  # noqa: E402

AgentLoopWorkerBase = AgentLoopWorkerTQ.__ray_actor_class__  # the class under verl's @ray.remote, to subclass

PRIVATE_SEAMS: dict[type, tuple[str, ...]] = {
    AgentLoopWorkerBase: ("_run_prompt", "_compute_score", "_agent_loop_postprocess"),
    ToolAgentLoop: (
        "_handle_pending_state",
        "_handle_generating_state",
        "_handle_processing_tools_state",
        "_get_mm_processor_kwargs",
    ),
    PPOTrainerSync: ("_compute_advantage",),
}


def check_seams(seams: dict[type, tuple[str, ...]] = PRIVATE_SEAMS) -> None:
    """One line naming the first private method this verl lacks."""
    for cls, names in seams.items():
        for name in names:
            if not callable(getattr(cls, name, None)):
                raise ImportError(
                    f"trace-rl's verl plugin needs {cls.__name__}.{name} of verl {VERL_VERSION}; this verl has none"
                )


check_seams()


# ---- the private reaches, one function each
def agent_loop_config(name: str | None):
    """The registered config of agent loop `name` (what verl's worker instantiates), or None."""
    return _agent_loop_registry.get(name) if name is not None else None


def set_active_tools(data: AgentData, tools: dict, schemas: list) -> None:
    """The tools one sample may call, as `ToolAgentLoop.run` selects them (verl 0.9.1 keeps them private)."""
    data._active_tools, data._active_tool_schemas = tools, schemas


def mm_processor_kwargs(loop: ToolAgentLoop, audios):
    return loop._get_mm_processor_kwargs(audios)


async def handle_pending(loop: ToolAgentLoop, data: AgentData, sampling_params: dict):
    return await loop._handle_pending_state(data, sampling_params)


async def handle_generating(loop: ToolAgentLoop, data: AgentData, sampling_params: dict):
    return await loop._handle_generating_state(data, sampling_params)


async def handle_processing_tools(loop: ToolAgentLoop, data: AgentData):
    return await loop._handle_processing_tools_state(data)


async def compute_score(worker, outputs: list, kwargs: dict) -> None:
    """verl's worker scores finished outputs in place (`reward_score`)."""
    await worker._compute_score(outputs, kwargs=kwargs)


async def postprocess(worker, output, validate: bool, **kwargs) -> None:
    """verl's worker hands a finished session to TransferQueue."""
    await worker._agent_loop_postprocess(output, validate, **kwargs)


def add_sync_metrics(trainer, metrics: dict) -> None:
    """Metrics the V1 trainer logs with the step, after the weight sync."""
    pending = getattr(trainer, "_pending_sync_metrics", None) or {}
    trainer._pending_sync_metrics = {**pending, **metrics}


__all__ = [
    "AgentData",
    "AgentLoopManagerTQ",
    "AgentLoopOutput",
    "AgentLoopWorkerBase",
    "AgentLoopWorkerTQ",
    "AgentState",
    "DictConfigWrap",
    "PPOTrainerSync",
    "ToolAgentLoop",
    "ToolListWrap",
    "register",
    "register_adv_est",
    "register_trainer",
    "response_to_nested",
]
