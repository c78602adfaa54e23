"""Math with a Python tool: the agent may run code (`python[...]`) any number of turns, then `answer[...]`.

Reward: math-verify's equivalence of the answer with the ground truth (LaTeX, fractions, sets, intervals...).
math-verify times out with SIGALRM, which only works in the main thread; off the main thread we pass no
timeout and cap the input length instead, so a worker thread never crashes on "signal only works in main
thread".
"""

from __future__ import annotations

import copy
import threading

from .base import parse_action
from .sandbox import run_python

TOOLS = ("python", "answer")
SYSTEM = (
    "Solve the problem. You may run Python to compute.\n"
    "Tools: python[code] runs the code and shows what it prints; answer[result] submits the final answer.\n"
    "Example:\nWhat is the sum of the first 100 positive integers?\n"
    "Action: python[print(sum(range(1, 101)))]\nObservation: 5050\nAction: answer[5050]"
)
MAX_VERIFY_CHARS = 400


def math_reward(prediction: str, ground_truth) -> float:
    """1.0 when math-verify finds `prediction` equivalent to any of the ground-truth forms, else 0.0."""
    from math_verify import parse, verify

    golds = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None
    pred_text = str(prediction)[:MAX_VERIFY_CHARS]
    if not pred_text.strip():
        return 0.0
    wrap = lambda s: s if "$" in s or "\\boxed" in s else f"${s}$"
    pred = parse(wrap(pred_text), parsing_timeout=timeout)
    for gold in golds:
        g = parse(wrap(str(gold).strip()), parsing_timeout=timeout)
        if g and pred and verify(g, pred, timeout_seconds=timeout):
            return 1.0
    return 0.0


class MathEnv:
    """reset/step/fork; the task dict needs 'question' and 'answer' (a string or a list of accepted forms)."""

    def __init__(self, max_turns: int = 6, timeout_s: float = 5.0, memory_mb: int = 1024, max_output: int = 1000):
        self.max_turns, self.timeout_s, self.memory_mb, self.max_output = max_turns, timeout_s, memory_mb, max_output
        self.task: dict | None = None
        self.turn = 0
        self.done = True

    def system_prompt(self) -> str:
        return SYSTEM

    def reset(self, task: dict) -> str:
        self.task, self.turn, self.done = task, 0, False
        return task["question"]

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.done or self.task is None:
            raise RuntimeError("step() after the episode ended; call reset() first")
        self.turn += 1
        parsed = parse_action(action, TOOLS)
        reward, info = 0.0, {"valid_action": parsed.tool is not None}
        if parsed.tool is None:
            obs = parsed.error
        elif parsed.tool == "python":
            code = parsed.argument.strip().removeprefix("```python").removeprefix("```").removesuffix("```")
            res = run_python(code, self.timeout_s, self.memory_mb, self.max_output)
            obs, info["sandbox_ok"] = res.observation(), res.ok
        else:
            self.done = True
            reward = math_reward(parsed.argument, self.task["answer"])
            obs = "Submitted."
        if not self.done and self.turn >= self.max_turns:
            self.done, obs = True, obs + "\nTurn limit reached."
        return obs, reward, self.done, info

    def fork(self) -> "MathEnv":
        return copy.copy(self)
