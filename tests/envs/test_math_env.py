"""The math environment: answer checking (math-verify) and the sandboxed Python tool behind it. The stdlib-only
sandbox tests live in test_sandbox_math.py, which runs without math-verify."""

import threading
import time
import warnings

import pytest

pytest.importorskip("math_verify")

from trace_rl.envs import math_env, sandbox  # noqa: E402
from trace_rl.envs.math_env import MathEnv, math_reward  # noqa: E402

WHY = sandbox.strict_unavailable()
needs_strict = pytest.mark.skipif(WHY is not None, reason=f"strict sandbox unavailable here: {WHY}")


def test_math_reward_equivalences_and_off_main_thread():
    assert math_reward("\\frac{1}{2}", "0.5") == 1.0
    assert math_reward("204", ["204"]) == 1.0
    assert math_reward("3", "4") == 0.0
    assert math_reward("", "4") == 0.0
    out = []
    t = threading.Thread(target=lambda: out.append(math_reward("0.5", "\\frac12")))
    t.start()
    t.join()
    assert out == [1.0]  # no "signal only works in main thread"


def test_math_env_sandbox_setting():
    with pytest.raises(ValueError, match="sandbox must be one of"):
        MathEnv(sandbox="none")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        env = MathEnv(sandbox="weak")
    env.reset({"question": "q", "answer": "1"})
    assert env.step("Action: python[print(6 * 7)]")[0] == "42"


@needs_strict
def test_math_env_runs_code_forks_and_scores():
    env = MathEnv(max_turns=3)
    env.reset({"question": "2*3?", "answer": "6"})
    obs, _, done, info = env.step("Action: python[print(2*3)]")
    assert obs == "6" and not done and info["sandbox_ok"]
    twin = env.fork()
    assert twin.step("Action: answer[7]")[1] == 0.0 and twin.done and not env.done
    assert env.step("Action: answer[6]")[1:3] == (1.0, True)
    env.reset({"question": "q", "answer": "1"})
    obs, *_ = env.step("calc(1)")
    assert obs.startswith("Invalid action format")


def test_latex_bombs_answered_in_a_thread_return_within_a_bound(monkeypatch):
    # env workers run steps in threads, where math-verify's SIGALRM timeout cannot fire; the check's own limit
    # (lowered here to keep the test light) must bind there. 10^{10^{10}} alone ran past 90 s before.
    monkeypatch.setattr(math_env, "CHECK_S", 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        env = MathEnv(sandbox="weak")
    out: list = []

    def steps():
        for answer in ("10^{10^{10}}", "100000000!", "\\frac{1}{2}"):
            env.reset({"question": "q", "answer": "0.5"})
            start = time.monotonic()
            _, reward, done, info = env.step(f"Action: answer[{answer}]")
            out.append((answer, reward, done, info.get("answer_check", "ok"), time.monotonic() - start))

    worker = threading.Thread(target=steps)
    worker.start()
    worker.join(120)
    assert not worker.is_alive()
    for answer, reward, done, check, took in out[:2]:
        assert reward == 0.0 and done and check != "ok" and took < 30, (answer, check, took)
    assert out[2][1:4] == (1.0, True, "ok")  # an ordinary answer still scores on the same thread
