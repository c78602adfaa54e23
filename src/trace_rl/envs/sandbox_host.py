"""What the host keeps bounded and clean around each strict sandbox call (see `envs.sandbox`).

- Threads: as root, RLIMIT_NPROC does not bind (the uid inside the user namespace maps to root outside, which
  the kernel exempts), so where the host delegates a pids cgroup (cgroup v1 `pids`, or v2 with `pids` enabled,
  writable by this process) each call runs in a cgroup of its own whose pids.max bounds every thread. Where
  none is delegated, a root caller's snippet is bounded in threads only by RLIMIT_AS (each thread's stack) and
  the wall clock; a caller that is not root needs no cgroup (RLIMIT_NPROC binds).
- Output: stdout's head and stderr's head and tail are kept, at most a fixed number of bytes each, whatever
  flows through the pipes, so an error after a flood of output still shows its exception line.
- Leftovers: temp dirs (and cgroups) are named after the owning pid, and the first call of a process removes
  those whose owner no longer runs (a trainer killed mid-call cannot remove its own).
"""

from __future__ import annotations

import functools
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time

TMP_PREFIX = "trace-rl-sandbox-"  # + the owner's pid + "-": a sweep can tell a dead owner's dirs


# -- processes: a pids cgroup where RLIMIT_NPROC cannot bind ----------------------------------------------------
@functools.cache
def pids_cgroup_root() -> str | None:
    """The pids cgroup folder this process may create children in, when the caller is root and the host
    delegates one (a writable cgroup v1 `pids` hierarchy, or cgroup v2 with `pids` enabled); else None.

    As root, RLIMIT_NPROC does not bind (the uid inside maps to root outside, which the kernel exempts), so a
    per-call cgroup with pids.max is what bounds threads. A caller that is not root needs none."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/cgroup") as fh:
            own = [line.rstrip("\n").split(":", 2) for line in fh]
        with open("/proc/self/mounts") as fh:
            mounts = [line.split() for line in fh]
    except OSError:
        return None
    candidates = []
    for _, controllers, path in own:
        for _, point, fstype, options, *_ in mounts:
            if controllers and "pids" in controllers.split(",") and fstype == "cgroup" and "pids" in options:
                candidates.append(point + path)
            elif not controllers and fstype == "cgroup2":
                candidates.append(point + path)
    for base in candidates:
        probe = os.path.join(base, f"trace-rl-{os.getpid()}-probe")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            with open(os.path.join(probe, "pids.max"), "w") as fh:
                fh.write("64")
            return base
        except OSError:
            continue
        finally:
            os.rmdir(probe)
    return None


class PidsCgroup:
    """A cgroup of its own for one call, entered by a shell that then execs bubblewrap, so every thread the
    snippet makes is counted from the first (moving bwrap in after it started would race its clone)."""

    def __init__(self, root: str, limit: int):
        self.path = os.path.join(root, f"trace-rl-{os.getpid()}-{os.urandom(6).hex()}")
        os.mkdir(self.path)
        with open(os.path.join(self.path, "pids.max"), "w") as fh:
            fh.write(str(limit))

    @classmethod
    def make(cls, limit: int) -> PidsCgroup | None:
        """A cgroup allowing `limit` tasks, or None where no pids cgroup can be made (see pids_cgroup_root)."""
        root = pids_cgroup_root()
        try:
            return cls(root, limit) if root else None
        except OSError:  # the hierarchy went away or is full: the snippet runs, bounded by seccomp and RLIMIT_AS
            return None

    def wrap(self, cmd: list[str]) -> list[str]:
        return ["/bin/sh", "-c", 'echo 0 > "$0" && exec "$@"', os.path.join(self.path, "cgroup.procs"), *cmd]

    def remove(self) -> None:
        for _ in range(50):  # the last tasks may take a moment to leave after the sandbox is reaped
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)
        # still busy: the next process's sweep removes it


def _owner_alive(name: str, prefix: str) -> bool:
    pid = name[len(prefix) :].split("-", 1)[0]
    if not pid.isdigit():
        return True  # not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.cache
def sweep_stale() -> int:
    """Remove what a killed trainer left: sandbox temp dirs (and per-call cgroups) named after a pid that no
    longer runs and owned by this uid. Runs once per process, before its first call; returns how many went.
    A pid reused since by another process keeps its dirs until that process ends too."""
    removed = 0
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        names = []
    for name in names:
        path = os.path.join(tmp, name)
        if not name.startswith(TMP_PREFIX) or _owner_alive(name, TMP_PREFIX):
            continue
        try:
            if os.lstat(path).st_uid != os.geteuid():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += not os.path.exists(path)
    root = pids_cgroup_root()
    for name in os.listdir(root) if root else []:
        if name.startswith("trace-rl-") and not _owner_alive(name, "trace-rl-"):
            try:
                os.rmdir(os.path.join(root, name))
                removed += 1
            except OSError:
                pass
    return removed


class Kept:
    """One pipe's bytes as the host keeps them: the first `head` bytes and the last `tail`, whatever flows."""

    def __init__(self, head: int, tail: int):
        self.head, self.tail, self.head_cap, self.tail_cap, self.total = bytearray(), bytearray(), head, tail, 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if self.tail_cap and chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:  # trimmed in batches: linear in what flows
                del self.tail[: -self.tail_cap]

    def text(self, limit: int) -> str:
        """The head, cut to `limit` characters; with a tail kept, the head's start and the tail's end around a
        marker, so an error's last lines (the exception) survive any amount of output before them."""
        head = self.head.decode("utf-8", "replace")
        if not self.tail_cap:
            return head[:limit]
        gap = self.total - len(self.head) - len(self.tail[-self.tail_cap :])
        whole = head + self.tail[-self.tail_cap :].decode("utf-8", "replace") if gap <= 0 else None
        if whole is not None and len(whole) <= limit:
            return whole
        marker = "\n[... middle cut ...]\n"
        keep_head = limit // 4
        keep_tail = max(0, limit - keep_head - len(marker))
        tail = (whole if whole is not None else self.tail.decode("utf-8", "replace"))[-keep_tail:] if keep_tail else ""
        return head[:keep_head] + marker + tail


def collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[Kept, Kept, bool]:
    """Read both pipes as data comes, keeping at most `cap` bytes of stdout's head and of stderr's head and
    tail (the rest is read and dropped); True when the deadline passed."""
    out, err = Kept(cap, 0), Kept(cap, cap)
    bufs = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    timed_out = False
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                bufs[key.fd].add(chunk)
    if not timed_out:  # both pipes closed; the process may still run
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    return out, err, timed_out
