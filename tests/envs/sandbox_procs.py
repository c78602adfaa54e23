"""Finding sandbox processes from outside, for the tests that check none is left running."""

import os
import re

SANDBOX_MARK = "trace-rl-sandbox-"  # in every sandbox process's command line (its temp dir's name)


def _boot_ticks(pid: str) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime


def _ours_or_orphaned(owner: int) -> bool:
    """A sandbox whose caller (the pid in its temp dir's name) is this process or no longer runs; one whose
    caller runs elsewhere belongs to another session on the machine, which is not ours to judge."""
    if owner == os.getpid():
        return True
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def sandbox_processes(since_ticks: int = 0) -> list[str]:
    """Command lines of the running sandbox processes (bwrap and what runs in it) started at or after
    `since_ticks` (clock ticks since boot) whose caller is this process or has died; [] where /proc is
    missing."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
            owner = re.search(SANDBOX_MARK + r"(\d+)-", cmd)
            if owner and _ours_or_orphaned(int(owner.group(1))) and _boot_ticks(pid) >= since_ticks:
                found.append(f"{pid}: {cmd[:200]}")
        except (OSError, IndexError, ValueError):
            pass
    return found


def now_ticks() -> int:
    with open("/proc/uptime") as fh:
        return int(float(fh.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


def kill_callers(caller: str, env: dict, latest: float, trials: int = 20, within: float = 60.0) -> tuple[int, list]:
    """Start `caller` (python -c code that prints 'go' once warmed up, then makes a sandbox call) and kill it a
    random 0-`latest` seconds after 'go', up to `trials` times within `within` seconds; then wait up to 5 s for
    what the calls left to end, kill what is still there, and return (callers killed, pids that were left)."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from trace_rl.envs.sandbox_host import stranded_processes

    rng, start, stop, done = random.Random(0), now_ticks(), time.monotonic() + within, 0
    while done < trials and time.monotonic() < stop:
        proc = subprocess.Popen([sys.executable, "-c", caller], env=env, stdout=subprocess.PIPE)
        assert proc.stdout.readline() == b"go\n"
        time.sleep(rng.uniform(0, latest))
        proc.kill()
        proc.wait()
        proc.stdout.close()
        done += 1
    deadline = time.monotonic() + 5
    while (left := stranded_processes(start)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return done, left
