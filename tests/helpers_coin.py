"""A plug-in env for command tests: two turns of a coin the sampled tokens toss (`env_module` writes it)."""

# An env whose reward is a coin the sampled tokens toss, so that a random model's trees are mixed: two turns, and
# the episode succeeds when the last turn's text has an even length.
COIN = """
from trace_rl.envs.base import ToolEnv
from trace_rl.envs.registry import EnvSpec, env_plugin


class Coin(ToolEnv):
    system = "Say anything."

    def step(self, action):
        self.turn += 1
        self.done = self.turn >= 2
        return "Go on.", float(self.done and len(action) % 2 == 0), self.done, {"valid_action": True}


def tasks(count, seed):
    return [{"index": i, "question": f"Toss {seed}-{i}.", "answer": ""} for i in range(count)]


@env_plugin("coin")
def coin():
    return EnvSpec(make=Coin, benchmarks={"coin": lambda n: tasks(n or 4, 0)}, train=tasks, max_new_tokens=6)
"""
