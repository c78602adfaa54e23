"""The math environment: answer checking (math-verify) and the sandboxed Python tool behind it. The stdlib-only
sandbox tests live in test_sandbox_math.py, which runs without math-verify."""

import threading
import warnings

import pytest

pytest.importorskip("math_verify")

from trace_rl.envs import sandbox  # noqa: E402
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
