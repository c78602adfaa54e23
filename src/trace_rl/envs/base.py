"""The environment protocol every rollout engine speaks, and the ReAct action format the built-ins share.

`reset(task) -> observation`, `step(action_text) -> (observation, reward, done, info)`, `fork()` for branching:
a fork continues from the exact state after the last step, and steps taken in it never touch the parent or
another fork. Bad model output is never an exception: it becomes an observation that says what was wrong,
and the episode goes on until its turn limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

ACTION_RE = re.compile(r"Action:\s*([A-Za-z_][\w\-]*)\s*\[(.*)\]\s*$", re.DOTALL)


class AgentEnv(Protocol):
    max_turns: int

    def system_prompt(self) -> str: ...

    def reset(self, task: dict) -> str: ...

    def step(self, action: str) -> tuple[str, float, bool, dict]: ...

    def fork(self) -> "AgentEnv": ...


@dataclass(frozen=True)
class ParsedAction:
    thought: str
    tool: str | None  # None when the text could not be parsed
    argument: str
    error: str = ""


def parse_action(text: str, tools: tuple[str, ...]) -> ParsedAction:
    """'Thought: ...\\nAction: tool[argument]' -> its parts, or an error that names the expected format."""
    text = text.strip()
    thought = ""
    if "Action:" in text:
        head, _, _ = text.partition("Action:")
        thought = head.replace("Thought:", "", 1).strip()
        text = "Action:" + text.split("Action:", 1)[1]
    m = ACTION_RE.search(text)
    expected = " or ".join(f"{t}[...]" for t in tools)
    if not m:
        return ParsedAction(thought, None, "", f"Invalid action format. Write: Action: {expected}")
    tool, arg = m.group(1), m.group(2).strip()
    if tool not in tools:
        return ParsedAction(thought, None, arg, f"Unknown tool '{tool}'. Available: {expected}")
    return ParsedAction(thought, tool, arg)
