"""The strict sandbox against what holds kernel memory or outlives its caller, judged from outside: extended
attributes and inotify are refused, files and folders in /tmp stop at the inode limit, a memory cgroup (where
one is delegated) stops what RLIMIT_AS does not count, a caller killed at any instant leaves no sandbox
process running (counted by process tree), and a signal that ends the snippet is named for what it is. Floods
are bounded by count and time."""

import os
import signal
import subprocess
import sys
import time

import pytest
from sandbox_procs import kill_callers, now_ticks

from trace_rl.envs import sandbox
from trace_rl.envs.sandbox import run_python, signal_meaning
from trace_rl.envs.sandbox_cgroup import kill_and_remove_stale, memory_cgroup_root, pids_cgroup_root
from trace_rl.envs.sandbox_host import _kill_stranded, _owner_alive, stranded_processes

WHY = sandbox.strict_unavailable()
needs_strict = pytest.mark.skipif(WHY is not None, reason=f"strict sandbox unavailable here: {WHY}")
needs_own_tmpfs = pytest.mark.skipif(
    WHY is not None or not sandbox.own_tmpfs(), reason="no util-linux unshare/setpriv or nested user namespaces"
)


@needs_strict
def test_extended_attributes_are_refused():
    res = run_python(
        "import os\nopen('f', 'w').close()\n"
        "for call in (lambda: os.setxattr('f', 'user.k', b'v' * 65000), lambda: os.setxattr('/tmp', 'user.k', b'v')):\n"
        "    try: call(); print('set')\n"
        "    except OSError as e: print('refused', e.errno)\n"
    )
    assert res.stdout.split() == ["refused", "1", "refused", "1"], res


@needs_strict
def test_inotify_and_fanotify_are_refused():
    res = run_python(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.inotify_init1(0), ctypes.get_errno(), libc.inotify_init(), libc.fanotify_init(0, 0))\n"
    )
    assert res.stdout.split() == ["-1", "1", "-1", "-1"], res


@needs_own_tmpfs
@pytest.mark.parametrize("what", ["open(name, 'w').close()", "os.mkdir(name)"])
def test_files_and_folders_in_tmp_stop_at_the_inode_limit(what):
    res = run_python(
        f"import os\nn = 0\ntry:\n    while n < 100000:\n        name = 'x' * 200 + str(n); {what}; n += 1\n"
        "except OSError as e: print(n, e.errno)\n",
        timeout_s=20,
    )
    made, errno = map(int, res.stdout.split())
    assert errno == 28 and made < sandbox.TMPFS_INODES, res  # ENOSPC: the root folder holds one inode


@needs_strict
@pytest.mark.skipif(memory_cgroup_root() is None, reason="no memory cgroup delegated here")
def test_a_memory_cgroup_holds_the_call(monkeypatch):
    # With xattrs, inotify and memfd refused and the tmpfs capped, what RLIMIT_AS misses stays within the
    # cgroup's room (KERNEL_MB + TMPFS_MB); to see that the cgroup binds, its room is made negative here, so
    # memory RLIMIT_AS allows is what the cgroup stops.
    monkeypatch.setattr(sandbox, "KERNEL_MB", -300)
    code = "x = bytearray(400 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint('held')\n"
    res = run_python(code, memory_mb=512, timeout_s=20)
    assert not res.ok and "SIGKILL" in res.observation(), res
    monkeypatch.undo()
    assert run_python(code, memory_mb=512, timeout_s=20).stdout.strip() == "held"


def test_signals_are_named_for_what_they_are():
    assert signal_meaning(signal.SIGSYS) == "SIGSYS: a forbidden system call"
    assert signal_meaning(signal.SIGBUS).startswith("SIGBUS: a bus error")
    assert "memory limit" in signal_meaning(signal.SIGKILL)
    assert signal_meaning(signal.SIGUSR1) == "SIGUSR1" and signal_meaning(200) == "signal 200"
    res = sandbox.SandboxResult("", "", -int(signal.SIGSYS))
    assert res.observation() == "Error: killed by signal 31 (SIGSYS: a forbidden system call)"


@needs_strict
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x32 system-call ABI is x86_64's")
def test_a_forbidden_system_call_is_reported_as_one():
    # an x32 system call: a foreign ABI, which the seccomp filter answers by killing the process (SIGSYS)
    res = run_python("import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\nprint('survived')")
    assert res.observation() == "Error: killed by signal 31 (SIGSYS: a forbidden system call)", res


@needs_strict
def test_a_bus_error_inside_is_reported_as_one():
    res = run_python(
        "import mmap, os\nf = open('f', 'w+b'); f.write(b'x' * 8192); f.flush()\n"
        "m = mmap.mmap(f.fileno(), 8192); os.truncate('f', 0); print(m[5000])\n"
    )
    assert "SIGBUS: a bus error" in res.observation(), res


_CALLER = (
    "import sys; from trace_rl.envs import sandbox; from trace_rl.envs.sandbox_host import sweep_stale\n"
    "sandbox.require('strict'); sweep_stale(); print('go', flush=True)\n"  # warmed up: the call starts now
    "sandbox.run_python('import time; time.sleep(600)', 600)\n"
)


@needs_strict
def test_a_caller_killed_at_any_instant_leaves_no_process_behind(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    # killed from before bwrap starts, through its setup, to the snippet running
    trials, left = kill_callers(_CALLER, env, 0.12)
    assert trials >= 5
    assert not left, [_cmdline(pid) for pid in left]  # on either path: the launch chain or bwrap under its warden


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return f"{pid}: {fh.read()[:200]!r}"
    except OSError:
        return f"{pid}: gone"


def _orphan(mark: str) -> int:
    """A shell whose parent exits at once (so the kernel hands it to init), its command line holding `mark`,
    running an unmarked `sleep`. The shell's pid."""
    script = f'/bin/sh -c "sleep 30; :" "{mark}" >/dev/null 2>&1 & echo $!'
    return int(subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True).stdout)


def _with_children(pids: tuple[int, ...]) -> list[int]:
    out = list(pids)
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as fh:
                if int(fh.read().rsplit(")", 1)[1].split()[1]) in pids:
                    out.append(int(name))
        except (OSError, IndexError, ValueError):
            pass
    return out


def test_stranded_processes_are_found_by_process_tree_and_the_sweep_ends_them():
    gone = subprocess.Popen(["true"])
    gone.wait()
    start = now_ticks()
    orphan = _orphan(f"trace-rl-sandbox-{gone.pid}-x")  # its caller is dead: handed to init, a sleep below it
    unmarked = _orphan("just-a-shell")
    elsewhere = _orphan(f"trace-rl-sandbox-{os.getpid()}-x")  # its caller (this process) runs: the sweep spares it
    mine = subprocess.Popen(["/bin/sh", "-c", "sleep 30; :", f"trace-rl-sandbox-{os.getpid()}-x"])  # a live call's
    try:
        deadline = time.monotonic() + 5
        while len(found := set(stranded_processes(start))) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        below = found - {orphan, elsewhere}
        assert orphan in found and elsewhere in found and len(below) == 2, found
        assert unmarked not in found and mine.pid not in found
        assert all("sleep" in _cmdline(p) and "trace-rl" not in _cmdline(p) for p in below)  # by tree, not by name
        assert _kill_stranded() == 2  # the dead caller's shell and its sleep; the live caller's stay
        deadline = time.monotonic() + 5
        while len(left := set(stranded_processes(start))) > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert elsewhere in left and orphan not in left and len(left) == 2
    finally:
        for pid in _with_children((orphan, unmarked, elsewhere)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        mine.kill()
        mine.wait()


@pytest.mark.skipif(pids_cgroup_root() is None and memory_cgroup_root() is None, reason="no cgroup delegated here")
def test_the_sweep_ends_what_still_runs_in_a_dead_owners_cgroup(tmp_path):
    dead = subprocess.Popen(["true"])  # a pid that no longer runs: the owner killed mid-call
    dead.wait()
    root = pids_cgroup_root() or memory_cgroup_root()
    group = os.path.join(root, f"trace-rl-{dead.pid}-{os.urandom(3).hex()}")
    os.mkdir(group)
    left = subprocess.Popen(["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec sleep 60', group])
    try:
        wait_s = time.monotonic() + 5
        while time.monotonic() < wait_s and not open(os.path.join(group, "cgroup.procs")).read().strip():
            time.sleep(0.01)
        assert kill_and_remove_stale(_owner_alive) >= 1
        assert left.wait(5) == -signal.SIGKILL and not os.path.exists(group)
    finally:
        left.kill()
        left.wait()
        if os.path.exists(group):
            os.rmdir(group)


@pytest.mark.skipif(pids_cgroup_root() is None, reason="no pids cgroup delegated here")
def test_a_memory_cgroup_that_cannot_be_made_leaves_the_pids_one(monkeypatch, tmp_path):
    from trace_rl.envs import sandbox_cgroup

    monkeypatch.setattr(sandbox_cgroup, "memory_cgroup_root", lambda: str(tmp_path / "gone"))
    group = sandbox_cgroup.CallCgroup.make(64, 1 << 30)
    assert group is not None
    try:
        assert [os.path.dirname(p) for p in group.paths] == [pids_cgroup_root().rstrip("/")]
    finally:
        group.remove()
    assert not any(os.path.exists(p) for p in group.paths)
