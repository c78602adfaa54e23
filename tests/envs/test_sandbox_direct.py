"""The strict sandbox where bwrap runs directly (no util-linux unshare/setpriv, or user namespaces that do not
nest; forced here by `own_tmpfs` False and no cgroup): its warden (`envs.sandbox_warden`) stops a snippet past
/tmp's inode limit, and a caller killed in bwrap's first milliseconds leaves no process behind. The warden's own
mechanisms (the caller check, adopting orphans, ending all on the caller's death) are checked with plain shells,
without bwrap."""

import os
import signal
import subprocess
import sys
import time

import pytest
from sandbox_procs import kill_callers

from trace_rl.envs import sandbox, sandbox_warden
from trace_rl.envs.sandbox import run_python

WHY = sandbox.strict_unavailable()
needs_strict = pytest.mark.skipif(WHY is not None, reason=f"strict sandbox unavailable here: {WHY}")


@pytest.fixture
def direct(monkeypatch):
    monkeypatch.setattr(sandbox, "own_tmpfs", lambda: False)
    monkeypatch.setattr(sandbox.CallCgroup, "make", classmethod(lambda cls, *a: None))


@needs_strict
@pytest.mark.parametrize("what", ["open(name, 'w').close()", "os.mkdir(name)"])
def test_files_and_folders_past_the_inode_limit_stop_the_snippet(direct, what):
    # 100,000 files take about 1.5 s here without the warden; with it the snippet never prints "done"
    res = run_python(
        f"import os\nfor n in range(100000):\n    name = 'x' * 200 + str(n); {what}\nprint('done')\n", timeout_s=20
    )
    assert not res.ok and not res.timed_out and "done" not in res.stdout, res
    assert res.observation() == (
        f"Error: the sandbox stopped the code: /tmp held more than {sandbox.TMPFS_INODES} files and folders"
    ), res


@needs_strict
def test_files_within_the_limit_are_left_alone(direct):
    res = run_python(
        "import os\nos.mkdir('d')\nfor n in range(3000): open('d/f%d' % n, 'w').close()\nprint(len(os.listdir('d')))",
        timeout_s=20,
    )
    assert res.ok and res.stdout.strip() == "3000", res


_CALLER = (
    "import sys; from trace_rl.envs import sandbox\n"
    # no sweep: a caller's first call would end what the callers before it left, which is counted at the end
    "sandbox.own_tmpfs = lambda: False; sandbox.sweep_stale = lambda: 0\n"
    "sandbox.require('strict'); print('go', flush=True)\n"  # warmed up: the call starts now
    "sandbox.run_python('import time; time.sleep(600)', 600)\n"
)


@needs_strict
def test_a_caller_killed_in_bwraps_first_milliseconds_leaves_no_process_behind(tmp_path):
    # before the warden, 28 of 30 callers killed 0-10 ms into a call left bwrap's half-made child running
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    trials, left = kill_callers(_CALLER, env, 0.04)  # the warden starts (~10 ms), then bwrap, and bwrap sets up
    assert trials >= 5 and not left, left


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _alive(pid)


def test_the_warden_refuses_a_caller_that_is_not_its_parent():
    cmd = sandbox_warden.command(["/bin/sh", "-c", "echo ran"], 10)
    cmd[cmd.index(str(os.getpid()))] = "1"  # as if the caller had died and the warden were handed to init
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert res.returncode == sandbox_warden.CALLER_GONE and res.stdout == "", res


def test_the_warden_passes_the_exit_status_and_ends_what_was_left_to_it():
    # the shell leaves a sleep behind (handed to the warden, a subreaper) and exits 3
    cmd = sandbox_warden.command(["/bin/sh", "-c", "sleep 60 & echo $!; exit 3"], 10)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert res.returncode == 3, res
    assert _gone_within(int(res.stdout), 5)


def test_the_warden_ends_everything_when_its_caller_dies():
    # a middle process starts the warden (its caller) and is killed; the warden's command has a child and a
    # grandchild that its death orphans
    middle_code = (
        "import subprocess, sys, time\nfrom trace_rl.envs import sandbox_warden\n"
        "cmd = ['/bin/sh', '-c', 'sh -c \"$0\" & echo shell $!; wait', 'sleep 60 & echo sleep $!; wait']\n"
        "p = subprocess.Popen(sandbox_warden.command(cmd, 10), stdout=sys.stdout)\ntime.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    middle = subprocess.Popen([sys.executable, "-c", middle_code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = dict(middle.stdout.readline().split() for _ in range(2))
        os.kill(int(pids["shell"]), signal.SIGKILL)  # the inner shell dies: its sleep is handed to the warden
        time.sleep(0.2)
        middle.kill()
        middle.wait()
        assert _gone_within(int(pids["sleep"]), 5), "the sleep outlived the warden's caller"
    finally:
        middle.kill()
        middle.wait()
        middle.stdout.close()
