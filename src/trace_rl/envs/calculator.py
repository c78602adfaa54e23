"""The built-in task: arithmetic chains solved turn by turn with a calculator tool, exactly verified.

"Compute 17 +25 *3 left to right." The agent calls calc[17+25] and reads "42. Next: *3", calls calc[42*3],
reads "126. Next: answer", then answers answer[126]. The model never does arithmetic; it
must copy the last result and the next operation into well-formed calls (the environment names the next
operation after each valid call, counting calls, so a wrong copy is never corrected), and errors compound
with chain length: `steps` (1-5) and `digits` (1-3) are the difficulty knobs. A scripted solver writes
demonstrations for the warm start.
"""

from __future__ import annotations

import ast
import operator
import warnings

import numpy as np

from .base import ToolEnv

OPS = {"+": ("Add", operator.add), "-": ("Subtract", operator.sub), "*": ("Multiply by", operator.mul)}
TOOLS = ("calc", "answer")
SYSTEM = (
    "Tools: calc[expression], answer[number]. One calc per step.\n"
    "Example: Compute 4 +5 *2 left to right.\nAction: calc[4+5]\nObservation: 9. Next: *2\n"
    "Action: calc[9*2]\nObservation: 18. Next: answer\nAction: answer[18]"
)


def make_task(rng: np.random.Generator, steps: int, digits: int, index: int = 0) -> dict:
    hi = 10**digits
    start = int(rng.integers(1, hi))
    ops = []
    for _ in range(steps):
        op = str(rng.choice(["+", "-", "*"] if digits == 1 else ["+", "-", "+", "-", "*"]))
        ops.append((op, int(rng.integers(2, 10)) if op == "*" else int(rng.integers(1, hi))))
    value = start
    for op, b in ops:
        value = OPS[op][1](value, b)
    text = f"Compute {start} " + " ".join(f"{op}{b}" for op, b in ops) + " left to right."
    return {
        "index": index,
        "question": text,
        "answer": str(value),
        "start": start,
        "ops": ops,
        "steps": steps,
        "digits": digits,
        "data_source": "calculator",
    }


# The warm start sees demonstrations of chains up to 4 steps of up to 2-digit numbers; the RL mix (the default of
# make_tasks) also holds 5-step chains and 3-digit numbers, beyond the demonstrations, where the warm-started policy
# rarely or never succeeds. So a candidate pool holds near-certain, mixed and hopeless prompts, as real RL data does.
DEMO_MIX = {"steps": (1, 2, 3, 4), "digits": (1, 2)}
RL_MIX = {"steps": (1, 2, 3, 4, 5), "digits": (1, 2, 3)}
# What `trace-rl train` learns by default: 3-5-step chains of 2-digit numbers. The warm start solves 1-2-step
# chains almost always and 3-digit chains almost never (its report: 0.00-0.04), so a third of the RL mix gives
# groups without a success and another third groups without a failure: little to learn from, and a 40-step run moves
# a few points. On this mix it starts near 0.7 and most prompts are learnable.
TRAIN_MIX = {"steps": (3, 4, 5), "digits": (2,)}


def make_tasks(count: int, seed: int, steps=RL_MIX["steps"], digits=RL_MIX["digits"]) -> list[dict]:
    """A difficulty mix: steps and digits drawn uniformly from the given choices (default: the RL mix)."""
    rng = np.random.default_rng(seed)
    return [make_task(rng, int(rng.choice(steps)), int(rng.choice(digits)), index=i) for i in range(count)]


def solve(task: dict) -> list[str]:
    """The scripted solver: the assistant turns of a correct episode."""
    turns, value = [], task["start"]
    for op, b in task["ops"]:
        turns.append(f"Action: calc[{value}{op}{b}]")
        value = OPS[op][1](value, b)
    turns.append(f"Action: answer[{value}]")
    return turns


def safe_eval(expr: str) -> int:
    """Integer arithmetic (+ - * and parentheses) only; anything else raises ValueError."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult):
            a, b = ev(node.left), ev(node.right)
            out = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}[type(node.op)](a, b)
            if abs(out) > 10**12:
                raise ValueError("number too large")
            return out
        raise ValueError("only integers with + - * and parentheses are allowed")

    if len(expr) > 64:
        raise ValueError("expression too long")
    try:
        with warnings.catch_warnings():  # model text such as "12x": the parser's warning is not the user's business
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expr.strip(), mode="eval")
        return ev(tree)
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None


class CalculatorEnv(ToolEnv):
    """reset/step/fork over one arithmetic chain; reward 1 for the right answer, else 0."""

    tools, system = TOOLS, SYSTEM

    def __init__(self, extra_turns: int = 2):
        super().__init__(max_turns=0)
        self.extra_turns = extra_turns
        self.calls = 0  # valid calc calls so far: which operation comes next

    def reset(self, task: dict) -> str:
        self.calls, self.max_turns = 0, task["steps"] + 1 + self.extra_turns
        return super().reset(task)

    def act(self, parsed) -> tuple[str, float, dict]:
        if parsed.tool == "answer":
            self.done = True
            reward = float(parsed.argument.strip() == self.task["answer"])
            return ("Correct." if reward else "Wrong."), reward, {"valid_action": True}
        try:
            value = safe_eval(parsed.argument)
        except ValueError as err:
            return f"Error: {err}", 0.0, {"valid_action": False}
        self.calls += 1
        ops = self.task["ops"]
        nxt = "".join(map(str, ops[self.calls])) if self.calls < len(ops) else "answer"
        return f"{value}. Next: {nxt}", 0.0, {"valid_action": True}
