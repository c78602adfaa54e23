"""Property test: every environment answers every action, random or adversarial, with an observation of
bounded size; step() never raises on model text."""

import random
import urllib.error
import warnings

import pytest

from trace_rl.envs.base import MAX_OBSERVATION_CHARS, cap_observation
from trace_rl.envs.calculator import CalculatorEnv, make_tasks

DEEP = 5000
ADVERSARIAL = [
    "",
    "Action:",
    "Action: []",
    "Action: x[",
    "Action: answer[",
    "\x00",
    "\ud800",
    "Action: \ud800[1]",
    "Action: " + "x" * 100_000 + "[1]",
    "Action: {tool}[\ud800]",
    "Action: {tool}[\x00]",
    "Action: {tool}[" + "-" * DEEP + "1]",
    "Action: {tool}[" + "(" * DEEP + "1" + ")" * DEEP + "]",
    "Action: {tool}[" + "[" * DEEP + "]" * DEEP + "]",
    "Action: {tool}[" + "x" * 200_000 + "]",
    "Thought: " + "\ud800" * 50 + "\nAction: {tool}[1]",
    "Action: call[f(a=" + "-" * DEEP + "1)]",
    "Action: call[" + "ls(), " * 9999 + "ls()]",
    "Action: call[ls(a=" + "[" * DEEP + "]" * DEEP + ")]",
    "Action: call[cd(folder={{[1]: 2}})]",
    "Action: call[cd(folder='\ud800')]",
    "Action: call[__import__('os').system('true')]",
    "Action: call[ls(" + "a=1, " * 2000 + ")]",
    "Action: call[mkdir(dir_name=" + "'x' * 10**9" + ")]",
]
ALPHABET = list("()[]{},.:;=+-*/'\"\\ \n\tabcxyz0123456789_") + ["\ud800", "\udfff", "\x00", "\u202e", "é", "🙂"]


def random_actions(rng: random.Random, tools: tuple[str, ...], n: int) -> list[str]:
    out = [a.format(tool=t) for a in ADVERSARIAL for t in tools]
    for _ in range(n):
        arg = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 60)))
        if rng.random() < 0.2:
            arg = rng.choice("([{-") * rng.randint(100, 3000) + arg
        tool = rng.choice([*tools, "bogus", "", "Action"])
        out.append(rng.choice([f"Action: {tool}[{arg}]", f"Thought: {arg}\nAction: {tool}[{arg}]", arg]))
    rng.shuffle(out)
    return out


def drive(env, reset, actions: list[str], cap: int) -> int:
    """Step through `actions`, resetting after each episode; every step must return a bounded observation."""
    reset()
    steps = 0
    for action in actions:
        obs, reward, done, info = env.step(action)
        assert isinstance(obs, str) and isinstance(reward, float) and isinstance(info, dict)
        assert len(obs) <= cap, f"{len(obs)} characters for {action[:60]!r}"
        steps += 1
        if done:
            reset()
    return steps


def test_cap_observation_keeps_the_head_and_says_what_was_cut():
    assert cap_observation("abc", 10) == "abc"
    capped = cap_observation("x" * 1000, 100)
    assert len(capped) == 100 and capped.startswith("xxx") and "more characters cut" in capped


def test_calculator_never_raises():
    env, task = CalculatorEnv(), make_tasks(1, seed=0)[0]
    actions = random_actions(random.Random(0), ("calc", "answer"), 300)
    assert drive(env, lambda: env.reset(task), actions, MAX_OBSERVATION_CHARS + 40) == len(actions)


class DownRetriever:
    """A retriever whose server is down, after whatever retries it makes."""

    def search(self, queries, k):
        raise urllib.error.URLError("[Errno 111] Connection refused")


class BuggyRetriever:
    def search(self, queries, k):
        return [[("not a passage", 1.0)]]


@pytest.mark.parametrize("retriever", [DownRetriever(), BuggyRetriever()], ids=["down", "buggy"])
def test_qa_never_raises_and_a_failed_search_is_an_observation(retriever):
    from trace_rl.envs.qa_env import QAEnv

    env = QAEnv(retriever)
    task = {"question": "Where?", "answer": ["Cincinnati"]}
    env.reset(task)
    obs, reward, done, info = env.step("Action: search[director of Jaws]")
    assert not done and reward == 0.0 and obs.startswith("Error:")
    if isinstance(retriever, DownRetriever):
        assert "search failed" in obs and "URLError" in obs
    else:
        assert info["tool_error"] == "AttributeError"
    actions = random_actions(random.Random(1), ("search", "answer"), 200)
    assert drive(env, lambda: env.reset(task), actions, MAX_OBSERVATION_CHARS + 40) == len(actions)


def test_qa_with_a_real_index_never_raises(tmp_path):
    pytest.importorskip("bm25s")
    import json

    from trace_rl.envs.qa_env import QAEnv
    from trace_rl.envs.retrieval import BM25Retriever, load_corpus

    path = tmp_path / "corpus.json"
    path.write_text(json.dumps({"Jaws": ["Jaws is a film by Steven Spielberg."], "Ohio": ["Ohio is a state."]}))
    env = QAEnv(BM25Retriever(load_corpus(path)))
    task = {"question": "Where?", "answer": "Ohio"}
    actions = random_actions(random.Random(2), ("search", "answer"), 200)
    assert drive(env, lambda: env.reset(task), actions, MAX_OBSERVATION_CHARS + 40) == len(actions)


def test_math_never_raises():
    pytest.importorskip("math_verify")
    from trace_rl.envs import sandbox
    from trace_rl.envs.math_env import MathEnv

    mode = "strict" if sandbox.strict_unavailable() is None else "weak"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        env = MathEnv(max_turns=4, timeout_s=2, sandbox=mode)
        rng = random.Random(3)
        # every adversarial action, but few random ones: each python[...] is a sandboxed process
        actions = random_actions(rng, ("python", "answer"), 30)
        # math-verify may spend its 5 s parsing timeout on a deeply nested answer: slow, not a crash; kept short here
        actions = [a for a in actions if "answer[" not in a or len(a) < 120]
        actions += [
            "Action: python[print('\ud800')]",
            "Action: python[s = '\ud800'\nprint(len(s))]",
            "Action: python[print('x' * 10**6)]",
            "Action: answer[\ud800]",
        ]
        task = {"question": "2+2?", "answer": "4"}
        assert drive(env, lambda: env.reset(task), actions, MAX_OBSERVATION_CHARS + 40) == len(actions)


def test_bfcl_never_raises_and_caps_ten_thousand_calls():
    pytest.importorskip("bfcl_eval")
    from trace_rl.envs.bfcl_env import BFCLEnv, load_bfcl

    task = load_bfcl("multi_turn_base", limit=1)[0]
    env = BFCLEnv(steps_per_turn=50)
    env.reset(task)
    obs = env.step("Action: call[" + "ls(), " * 9999 + "ls()]")[0]
    assert 50_000 < len(obs) <= env.max_observation_chars and "more characters cut" in obs
    obs, _, _, info = env.step("Action: call[ls(a=" + "-" * DEEP + "1)]")
    assert obs.startswith("Error: could not parse") and not info["valid_action"]
    actions = random_actions(random.Random(4), ("call", "done"), 200)
    cap = env.max_observation_chars + 2000  # the next user message is appended after the cap
    assert drive(env, lambda: env.reset(task), actions, cap) == len(actions)
