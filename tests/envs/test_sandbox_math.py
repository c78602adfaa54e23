import threading

import pytest

from trace_rl.envs.sandbox import run_python


def test_ordinary_code_runs_and_prints():
    r = run_python("print(sum(range(10)))")
    assert r.ok and r.observation() == "45"
    assert "use print()" in run_python("x = 1").observation()


def test_infinite_loop_is_stopped_by_the_wall_clock():
    r = run_python("while True: pass", timeout_s=1)
    assert r.timed_out and "time limit" in r.observation()


def test_huge_allocation_is_contained():
    r = run_python("x = bytearray(10 * 1024**3)", memory_mb=512)
    assert not r.ok and "MemoryError" in r.observation()


@pytest.mark.parametrize("code, what", [
    ("import os; os.fork()", "os.fork"),
    ("import subprocess; subprocess.run(['true'])", "subprocess.Popen"),
    ("import os; os.system('true')", "os.system"),
    ("import socket; socket.socket()", "socket"),
])
def test_process_creation_and_network_are_refused(code, what):
    r = run_python(code)
    assert not r.ok and "PermissionError" in r.observation() and what in r.observation()


def test_writes_stay_inside_the_working_directory(tmp_path):
    target = tmp_path / "outside.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('x')")
    assert not r.ok and not target.exists() and "outside the working directory" in r.observation()
    r = run_python(f"import os; os.remove({str(tmp_path)!r})")
    assert "PermissionError" in r.observation() and tmp_path.exists()
    inside = run_python("open('note.txt', 'w').write('hi'); print(open('note.txt').read())")
    assert inside.ok and inside.observation() == "hi"


def test_output_is_truncated_and_syntax_errors_reported():
    assert len(run_python("print('x' * 100000)", max_output=500).stdout) == 500
    assert "SyntaxError" in run_python("print(1").observation()


math_verify = pytest.importorskip("math_verify")

from trace_rl.envs.math_env import MathEnv, math_reward  # noqa: E402


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


def test_math_env_runs_code_forks_and_scores():
    env = MathEnv(max_turns=3)
    env.reset({"question": "2*3?", "answer": "6"})
    obs, r, done, info = env.step("Action: python[print(2*3)]")
    assert obs == "6" and not done and info["sandbox_ok"]
    twin = env.fork()
    assert twin.step("Action: answer[7]")[1] == 0.0 and twin.done and not env.done
    assert env.step("Action: answer[6]")[1:3] == (1.0, True)
    env.reset({"question": "q", "answer": "1"})
    obs, *_ = env.step("calc(1)")
    assert obs.startswith("Invalid action format")
