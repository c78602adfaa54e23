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
