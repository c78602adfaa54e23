"""A scripted calculator agent for tests: solves the chain from the prompt text, wrong on purpose sometimes."""

import re

from trace_rl.envs.calculator import OPS


def scripted_calc(prompt: str, index: int, wrong_every: int = 0) -> str:
    rest = prompt.split("<|im_start|>user\n", 1)[1]  # skip the system prompt's worked example
    q = rest.split("<|im_end|>")[0]
    value = int(re.match(r"Compute (-?\d+) ", q).group(1))
    ops = [(op, int(b)) for op, b in re.findall(r" ([-+*])(\d+)", q)]
    done = rest.count("Observation: ")
    for op, b in ops[:done]:
        value = OPS[op][1](value, b)
    if done < len(ops):
        op, b = ops[done]
        return f"Action: calc[{value}{op}{b}]"
    wrong = wrong_every and (index + len(prompt)) % wrong_every == 0
    return f"Action: answer[{value + 1 if wrong else value}]"
