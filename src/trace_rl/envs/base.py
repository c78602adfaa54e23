"""The environment protocol every rollout engine speaks, and the ReAct action format the built-ins share.

`reset(task) -> observation`, `step(action_text) -> (observation, reward, done, info)`, `fork()` for branching:
a fork continues from the exact state after the last step, and steps taken in it never touch the parent or
another fork. Bad model output is never an exception: it becomes an observation that says what was wrong,
and the episode goes on until its turn limit. A tool that fails anyway (a bug, a backend that is down) gives
an observation naming the error, with the exception's type in info["tool_error"] so it is still seen; every
observation is capped at MAX_OBSERVATION_CHARS, keeping its head, so no action can flood the context.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Protocol

MAX_OBSERVATION_CHARS = 8000
# "Action:", the tool's name and the opening bracket, without the argument: a search for it is linear (the
# name scans of two "Action:" never overlap); the argument's end is found apart, as the text's last "]"
_ACTION_HEAD = re.compile(r"Action:\s*([A-Za-z_][\w\-]*)\s*\[")


class AgentEnv(Protocol):
    max_turns: int

    def system_prompt(self) -> str: ...

    def reset(self, task: dict) -> str: ...

    def step(self, action: str) -> tuple[str, float, bool, dict]: ...

    def fork(self) -> AgentEnv: ...


@dataclass(frozen=True)
class ParsedAction:
    thought: str
    tool: str | None  # None when the text could not be parsed
    argument: str
    error: str = ""


def parse_action(text: str, tools: tuple[str, ...]) -> ParsedAction:
    """'Thought: ...\\nAction: tool[argument]' -> its parts, or an error that names the expected format.

    The action is the first "Action:" followed by `tool[`, whose argument runs to the text's last "]" (only
    whitespace may follow it); the thought is what precedes the first "Action:". Linear in the text (one regex
    searching for the whole pattern, argument included, was quadratic: 200 KB of "Action: x[" took a minute)."""
    text = text.strip()
    head, sep, _ = text.partition("Action:")
    thought = head.replace("Thought:", "", 1).strip() if sep else ""
    expected = " or ".join(f"{t}[...]" for t in tools)
    # the "[" found is never the text's last character, which is the closing "]"
    m = _ACTION_HEAD.search(text, len(head)) if sep and text.endswith("]") else None
    if m is None:
        return ParsedAction(thought, None, "", f"Invalid action format. Write: Action: {expected}")
    tool, arg = m.group(1), text[m.end() : -1].strip()
    if tool not in tools:
        return ParsedAction(thought, None, arg, f"Unknown tool '{tool[:40]}'. Available: {expected}")
    return ParsedAction(thought, tool, arg)


def cap_observation(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    """`text` cut to `limit` characters (its head), saying how much was cut."""
    if len(text) <= limit:
        return text
    note = f"\n[... {len(text) - limit} more characters cut]"
    return text[: max(0, limit - len(note))] + note


def tool_failure(err: BaseException) -> tuple[str, dict]:
    """The observation and info for a tool that raised: the episode goes on, the error stays visible."""
    return f"Error: the tool failed ({type(err).__name__}: {str(err)[:200]})", {"tool_error": type(err).__name__}


class ToolEnv:
    """Shared bookkeeping of the ReAct tool environments: parse, count turns, enforce the turn limit.

    Subclasses set `tools` and `system` and implement `act(parsed) -> (observation, reward, info)`, setting
    `self.done` when the action ends the episode. State is plain values, so a shallow copy is a fork;
    subclasses holding mutable state override `fork`.
    """

    tools: tuple[str, ...] = ()
    system: str = ""
    max_observation_chars: int = MAX_OBSERVATION_CHARS

    def __init__(self, max_turns: int = 6):
        self.max_turns = max_turns
        self.task: dict | None = None
        self.turn = 0
        self.done = True

    def system_prompt(self) -> str:
        """The env's tool instructions, after the task row's own system message when it has one (kept from
        verl / SkyRL / Search-R1 rows); the env's format comes last, so its action syntax is what the model
        reads most recently."""
        row = (self.task or {}).get("system") if isinstance(self.task, dict) else None
        return f"{row}\n\n{self.system}" if row else self.system

    def reset(self, task: dict) -> str:
        self.task, self.turn, self.done = task, 0, False
        return task["question"]

    def act(self, parsed: ParsedAction) -> tuple[str, float, dict]:
        raise NotImplementedError

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.done or self.task is None:
            raise RuntimeError("step() after the episode ended; call reset() first")
        self.turn += 1
        parsed = parse_action(action, self.tools)
        if parsed.tool is None:
            obs, reward, info = parsed.error, 0.0, {"valid_action": False}
        else:
            try:
                obs, reward, info = self.act(parsed)
            except Exception as err:  # noqa: BLE001  model text must never crash the trainer; a bug still shows in info
                obs, info = tool_failure(err)
                reward, info["valid_action"] = 0.0, False
        obs = cap_observation(obs, self.max_observation_chars)
        if not self.done and self.turn >= self.max_turns:
            self.done, obs = True, obs + "\nTurn limit reached."
        return obs, reward, self.done, info

    def fork(self) -> ToolEnv:
        return copy.copy(self)
