"""Property test: every environment answers every action, random or adversarial (up to 1 MB), with an
observation of bounded size, within a bounded time; step() never raises on model text.

The time bound is generous (STEP_BOUND_S, plus the sandbox's own limit for python[...]) and is not a speed
claim: the cases it guards took 70 s (200 KB of "Action: x[" in a quadratic parser) or minutes (a BFCL call
of unbounded cost) before, and take milliseconds now."""

import random
import time
import urllib.error
import warnings

import pytest

from trace_rl.envs.base import MAX_OBSERVATION_CHARS, ParsedAction, cap_observation, parse_action
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
MB = 1_000_000
HUGE = [  # about 1 MB each
    "Action: x[" * (MB // 10),  # the quadratic parser's worst case
    "Action:" * (MB // 7) + "]",
    ("Action: x " * (MB // 10)) + "]",
    "Action: " + " " * MB + "x]",
    "Thought: " + "x" * MB + "\nAction: {tool}[1]",
    "Action: {tool}[" + "(" * MB + "]",
    "Action: {tool}[" + "[" * (MB // 2) + "]" * (MB // 2) + "]",
    "Action: {tool}[" + "1+" * (MB // 2) + "1]",
    "Action: {tool}[" + "9" * MB + "]",
    "Action: {tool}[" + "x " * (MB // 2) + "]",
    "Action: {tool}[" + "\ud800" * (MB // 4) + "]",
    "Action: call[" + "pwd(), " * (MB // 20) + "pwd()]",
    "Action: call[power(base=10, exponent=10000000)]",  # 21 s in one step before the per-call limit
    "Action: call[power(base=10, exponent=" + "9" * 50 + ")]",
]
STEP_BOUND_S = 5.0
ALPHABET = list("()[]{},.:;=+-*/'\"\\ \n\tabcxyz0123456789_") + ["\ud800", "\udfff", "\x00", "\u202e", "é", "🙂"]


def random_actions(rng: random.Random, tools: tuple[str, ...], n: int) -> list[str]:
    out = [a.replace("{tool}", t) for a in ADVERSARIAL + HUGE for t in tools]
    for _ in range(n):
        arg = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 60)))
        if rng.random() < 0.2:
            arg = rng.choice("([{-") * rng.randint(100, 3000) + arg
        tool = rng.choice([*tools, "bogus", "", "Action"])
        out.append(rng.choice([f"Action: {tool}[{arg}]", f"Thought: {arg}\nAction: {tool}[{arg}]", arg]))
    rng.shuffle(out)
    return out


def drive(env, reset, actions: list[str], cap: int, bound_s: float = STEP_BOUND_S) -> int:
    """Step through `actions`, resetting after each episode; every step must return a bounded observation
    within `bound_s` seconds."""
    reset()
    steps = 0
    for action in actions:
        start = time.monotonic()
        obs, reward, done, info = env.step(action)
        took = time.monotonic() - start
        assert isinstance(obs, str) and isinstance(reward, float) and isinstance(info, dict)
        assert len(obs) <= cap, f"{len(obs)} characters for {action[:60]!r}"
        assert took < bound_s, f"{took:.1f} s for {action[:60]!r} ({len(action)} characters)"
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
        bound = STEP_BOUND_S + env.timeout_s  # a python[...] step may use the sandbox's whole limit
        assert drive(env, lambda: env.reset(task), actions, MAX_OBSERVATION_CHARS + 40, bound) == len(actions)


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
    # a step that ends the episode also scores it, and the checker runs the episode's calls again
    assert drive(env, lambda: env.reset(task), actions, cap, 2 * STEP_BOUND_S) == len(actions)


def test_the_parser_is_linear_on_a_megabyte_of_hostile_text():
    """Every HUGE action parses; the bound is generous (the quadratic parser took minutes on the first)."""
    for action in HUGE:
        start = time.monotonic()
        parsed = parse_action(action.replace("{tool}", "calc"), ("calc", "answer"))
        assert time.monotonic() - start < 1.0, action[:40]
        assert parsed.tool is None or parsed.tool == "calc"
    assert parse_action("Thought: t\nAction: calc[a[1]] \n", ("calc",)) == ParsedAction("t", "calc", "a[1]")
