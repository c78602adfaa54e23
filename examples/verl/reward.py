"""Math reward for verl (`reward.custom_reward_function.path`): 1 when the last \\boxed{...} of the response is
equivalent to the ground truth (or any form in extra_info.answers) under math-verify (trace-rl's `math_reward`),
else 0."""

from trace_rl.envs.math_env import math_reward


def last_boxed(text: str) -> str:
    start = text.rfind("\\boxed{")
    if start < 0:
        return ""
    depth, i = 0, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth < 0:
            return text[i:j]
    return ""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    # every accepted form when the row lists them (trace_rl.integrations.verl.data writes extra_info.answers)
    answers = (extra_info or {}).get("answers")
    golds = [str(a) for a in answers] if answers is not None and len(answers) else ground_truth
    return math_reward(last_boxed(solution_str), golds)
