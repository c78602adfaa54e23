"""Math with a Python tool: the agent may run code (`python[...]`) any number of turns, then `answer[...]`.

Reward: math-verify's equivalence of the answer with the ground truth (LaTeX, fractions, sets, intervals...).
math-verify times out with SIGALRM, which only works in the main thread; off the main thread we pass no
timeout and cap the input length instead, so a worker thread never crashes on "signal only works in main
thread". Code runs in `envs.sandbox`: `sandbox="strict"` (the default) in kernel namespaces, refused at
construction where they are unavailable; `sandbox="weak"` is the in-process audit hook, chosen by name only.
"""

from __future__ import annotations

import threading

from .base import ToolEnv
from .sandbox import require, run_python

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


class MathEnv(ToolEnv):
    """reset/step/fork; the task dict needs 'question' and 'answer' (a string or a list of accepted forms)."""

    tools, system = TOOLS, SYSTEM

    def __init__(
        self,
        max_turns: int = 6,
        timeout_s: float = 5.0,
        memory_mb: int = 1024,
        max_output: int = 1000,
        sandbox: str = "strict",
    ):
        super().__init__(max_turns)
        self.timeout_s, self.memory_mb, self.max_output = timeout_s, memory_mb, max_output
        self.sandbox = require(sandbox)  # fail here, not at the first python[...] of a run

    def act(self, parsed) -> tuple[str, float, dict]:
        if parsed.tool == "answer":
            self.done = True
            return "Submitted.", math_reward(parsed.argument, self.task["answer"]), {"valid_action": True}
        code = parsed.argument.strip().removeprefix("```python").removeprefix("```").removesuffix("```")
        res = run_python(code, self.timeout_s, self.memory_mb, self.max_output, mode=self.sandbox)
        return res.observation(), 0.0, {"valid_action": True, "sandbox_ok": res.ok}
