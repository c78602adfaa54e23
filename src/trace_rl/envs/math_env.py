"""Math with a Python tool: the agent may run code (`python[...]`) any number of turns, then `answer[...]`.

Reward: math-verify's equivalence of the answer with the ground truth (LaTeX, fractions, sets, intervals...).
The check runs in a bounded copy of a small worker process (`envs.bounded`), limited in CPU time (CHECK_S) and
memory (CHECK_MB), on whatever thread the step runs: math-verify's own timeout is SIGALRM, which works in the
main thread only, and the engine's env workers are threads (an answer such as `10^{10^{10}}` kept one busy for
minutes). A check past its limits scores 0 and says so in info["answer_check"]. Code runs in `envs.sandbox`:
`sandbox="strict"` (the default) in kernel namespaces, refused at construction where they are unavailable;
`sandbox="weak"` is the in-process audit hook, chosen by name only.

The plug-in `MATH` (the settings group `env.math.*`: where code runs) trains on the math training set and evaluates
on the five usual benchmarks (`envs.data`); a strict sandbox that cannot run here stops the command when the spec
is built, before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..errors import ConfigError
from .base import ToolEnv
from .bounded import run_bounded
from .data import load_tasks
from .registry import EnvPlugin, EnvSpec, sample_rows
from .sandbox import SandboxUnavailable, check_mode, require, run_python

TOOLS = ("python", "answer")
SYSTEM = (
    "Solve the problem. You may run Python to compute.\n"
    "Tools: python[code] runs the code and shows what it prints; answer[result] submits the final answer.\n"
    "Example:\nWhat is the sum of the first 100 positive integers?\n"
    "Action: python[print(sum(range(1, 101)))]\nObservation: 5050\nAction: answer[5050]"
)
MAX_VERIFY_CHARS = 400
CHECK_S = 5.0  # CPU seconds one answer check may take
CHECK_MB = 768  # and memory it may add (sympy on a LaTeX bomb took 771 MiB and 12.7 s for 2^{2^{30}})


def _verify(tick, pred_text: str, golds: list[str]) -> float:
    """Run in a bounded copy, whose limits stop it, so math-verify's own (SIGALRM) timeouts are off."""
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call that its timeout is off

    wrap = lambda s: s if "$" in s or "\\boxed" in s else f"${s}$"
    pred = parse(wrap(pred_text), parsing_timeout=None)
    for gold in golds:
        g = parse(wrap(gold.strip()), parsing_timeout=None)
        if g and pred and verify(g, pred, timeout_seconds=None):
            return 1.0
    return 0.0


def warm_checker() -> None:
    """Called once in each worker before it forks: math-verify's first check fills caches (compiled patterns,
    sympy's) that took each cold copy about 120 ms; every copy forked after it inherits them."""
    _verify(lambda: None, "1/2", ["0.5"])


def check_answer(prediction: str, ground_truth) -> tuple[float, str]:
    """(reward, how the check ended: "ok", "timeout" or "error: ..."); reward 1.0 when math-verify finds
    `prediction` equivalent to any of the ground-truth forms. Bounded on any thread (see the module docstring)."""
    golds = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    pred_text = str(prediction)[:MAX_VERIFY_CHARS]
    if not pred_text.strip():
        return 0.0, "ok"
    args = (pred_text, [str(g) for g in golds])
    warm = ("trace_rl.envs.math_env:warm_checker",)
    status, value, _ = run_bounded(_verify, args, CHECK_S, preload=warm, cpu=True, memory_mb=CHECK_MB)
    if status == "ok":
        return float(value), "ok"
    return 0.0, status if status == "timeout" else f"error: {value}"


def math_reward(prediction: str, ground_truth) -> float:
    """1.0 when math-verify finds `prediction` equivalent to any of the ground-truth forms, else 0.0."""
    return check_answer(prediction, ground_truth)[0]


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
            reward, check = check_answer(parsed.argument, self.task["answer"])
            info = {"valid_action": True} if check == "ok" else {"valid_action": True, "answer_check": check}
            return "Submitted.", reward, info
        code = parsed.argument.strip().removeprefix("```python").removeprefix("```").removesuffix("```")
        res = run_python(code, self.timeout_s, self.memory_mb, self.max_output, mode=self.sandbox)
        return res.observation(), 0.0, {"valid_action": True, "sandbox_ok": res.ok}


BENCHMARKS = ("aime24", "amc23", "math500", "minerva", "olympiadbench")


@dataclass
class MathSettings:
    """Where the math env runs the model's code."""

    sandbox: str = "strict"  # strict: kernel namespaces | weak: an in-process audit hook (opt-in, by name)

    def __post_init__(self):
        check_mode(self.sandbox)


def math_spec(settings: MathSettings) -> EnvSpec:
    try:
        require(settings.sandbox)
    except SandboxUnavailable as err:
        raise ConfigError(f"env.math.sandbox: {err} (env.math.sandbox=weak opts in)") from None
    return EnvSpec(
        partial(MathEnv, sandbox=settings.sandbox),
        {b: (lambda n, b=b: load_tasks(b, n)) for b in BENCHMARKS},
        sample_rows(lambda: load_tasks("math-train")),
        max_new_tokens=512,
    )


MATH = EnvPlugin("math", math_spec, MathSettings)
