import warnings

import pytest

from trace_rl.envs import sandbox
from trace_rl.envs.sandbox import SandboxUnavailable, run_python

WHY = sandbox.strict_unavailable()
needs_strict = pytest.mark.skipif(WHY is not None, reason=f"strict sandbox unavailable here: {WHY}")


def weak(code: str, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return run_python(code, mode="weak", **kw)


@pytest.mark.parametrize("mode", [pytest.param("strict", marks=needs_strict), "weak"])
def test_ordinary_code_loops_allocations_and_errors_in_both_modes(mode):
    run = run_python if mode == "strict" else weak
    r = (
        run("import numpy as np\nprint(sum(range(10)), int(np.arange(4).sum()))", mode=mode)
        if mode == "strict"
        else run("print(sum(range(10)), 6)")
    )
    assert r.ok and r.observation() == "45 6"
    assert "use print()" in run("x = 1").observation()
    r = run("while True: pass", timeout_s=1)
    assert r.timed_out and "time limit" in r.observation()
    r = run("x = bytearray(10 * 1024**3)", memory_mb=512)
    assert not r.ok and "MemoryError" in r.observation()
    assert len(run("print('x' * 100000)", max_output=500).stdout) == 500
    assert "SyntaxError" in run("print(1").observation()
    inside = run("open('note.txt', 'w').write('hi'); print(open('note.txt').read())")
    assert inside.ok and inside.observation() == "hi"
    assert not run("s = '\\ud800' + chr(0xD800); print(s)").ok  # a lone surrogate is the snippet's error


@needs_strict
@pytest.mark.parametrize(
    "code, seen",
    [
        ("import os; os.fork()", "Operation not permitted"),
        ("import subprocess; subprocess.run(['true'])", "Operation not permitted"),
        ("import os; print(os.system('echo ran'))", "32512"),  # glibc: spawn failed, status 127, and nothing ran
        ("import socket; socket.socket()", "Operation not permitted"),
    ],
)
def test_strict_refuses_processes_and_sockets(code, seen):
    obs = run_python(code).observation()
    assert seen in obs and "ran" not in obs


def test_unknown_mode_and_missing_bwrap_are_refused_and_weak_warns_once(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="sandbox must be one of 'strict', 'weak'; got 'off'"):
        run_python("print(1)", mode="off")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    sandbox.strict_unavailable.cache_clear()
    sandbox._bwrap_base.cache_clear()
    try:
        assert "bwrap" in sandbox.strict_unavailable()
        with pytest.raises(SandboxUnavailable, match="sandbox='weak'"):
            run_python("print(1)")
        monkeypatch.setattr(sandbox, "_warned_weak", False)
        with pytest.warns(RuntimeWarning, match="audit hook only"):
            assert run_python("print(1)", mode="weak").observation() == "1"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a second weak call must not warn again
            assert run_python("print(2)", mode="weak").observation() == "2"
    finally:
        monkeypatch.undo()
        sandbox.strict_unavailable.cache_clear()
        sandbox._bwrap_base.cache_clear()


@pytest.mark.parametrize(
    "code, what",
    [
        ("import os; os.fork()", "os.fork"),
        ("import subprocess; subprocess.run(['true'])", "subprocess.Popen"),
        ("import os; os.system('true')", "os.system"),
        ("import socket; socket.socket()", "socket"),
    ],
)
def test_weak_refuses_process_creation_and_network(code, what):
    r = weak(code)
    assert not r.ok and "PermissionError" in r.observation() and what in r.observation()


@pytest.mark.parametrize("mode", [pytest.param("strict", marks=needs_strict), "weak"])
def test_writes_stay_inside_the_working_directory(tmp_path, mode):
    run = run_python if mode == "strict" else weak
    target = tmp_path / "outside.txt"
    r = run(f"open({str(target)!r}, 'w').write('x')")
    assert not r.ok and not target.exists()
    r = run(f"import os; os.rmdir({str(tmp_path)!r})")
    assert not r.ok and tmp_path.exists()
