"""What the host keeps bounded and clean around each sandbox call (see `envs.sandbox`), and how it reports it.

- Results: SandboxResult and the observation the agent reads, a signal named for what it means here.

- Threads and kernel memory: per-call cgroups where the host delegates them (`envs.sandbox_cgroup`).
- Output: stdout's head and stderr's head and tail are kept, at most a fixed number of bytes each, whatever
  flows through the pipes, so an error after a flood of output still shows its exception line.
- Leftovers: temp dirs (and cgroups) are named after the owning pid, and the first call of a process removes
  those whose owner no longer runs (a trainer killed mid-call cannot remove its own), ending any task still
  in such a cgroup first, and ends any sandbox process stranded by a dead caller (`stranded_processes`: found
  by process tree, a last line of defence behind the parent-death signals).
"""

from __future__ import annotations

import functools
import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from .sandbox_cgroup import PREFIX as CGROUP_PREFIX
from .sandbox_cgroup import kill_and_remove_stale, pids_cgroup_root

__all__ = [
    "ENV",
    "FSIZE_MB",
    "NOFILE",
    "TMP_PREFIX",
    "Kept",
    "SandboxResult",
    "collect",
    "finish",
    "pids_cgroup_root",
    "signal_meaning",
    "stranded_processes",
    "sweep_stale",
    "write_code",
]

TMP_PREFIX = "trace-rl-sandbox-"  # + the owner's pid + "-": a sweep can tell a dead owner's dirs
FSIZE_MB = 16
NOFILE = 64
ENV = {  # the snippet's whole environment
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def observation(self) -> str:
        """What the agent sees: output, or the error's last line, or what stopped the run."""
        if self.timed_out:
            return f"Error: the code ran past the time limit and was stopped.\n{self.stdout}".strip()
        if self.returncode not in (0, None):
            lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
            last = lines[-1] if lines else f"exit status {self.returncode}"
            if self.returncode < 0:
                last = f"killed by signal {-self.returncode} ({signal_meaning(-self.returncode)})"
            return f"{self.stdout}\nError: {last}".strip()
        return self.stdout.strip() or "(no output; use print() to see values)"


# What a signal that ended the snippet means here; the rlimits and the seccomp filter send the first four.
_SIGNALS = {
    "SIGKILL": "killed: the memory limit (a memory cgroup) or the CPU time limit",
    "SIGXCPU": "the CPU time limit",
    "SIGXFSZ": "the file size limit",
    "SIGSYS": "a forbidden system call",
    "SIGBUS": "a bus error: a memory-mapped file read past its end, or /tmp full",
    "SIGSEGV": "a segmentation fault",
    "SIGABRT": "aborted",
    "SIGFPE": "an arithmetic fault",
    "SIGILL": "an illegal instruction",
}


def signal_meaning(signum: int) -> str:
    """ "SIGSYS: a forbidden system call" and the like; the signal's name alone for one not listed."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    return f"{name}: {_SIGNALS[name]}" if name in _SIGNALS else name


def finish(proc: subprocess.Popen, deadline: float, max_output: int, kill) -> SandboxResult:
    try:
        out, err, timed_out = collect(proc, deadline, 4 * max_output)
    finally:
        kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    code = proc.returncode
    if code is not None and code > 128 and not err.total:  # bwrap reports a child killed by signal N as 128+N
        code = 128 - code
    return SandboxResult(out.text(max_output), err.text(max_output), None if timed_out else code, timed_out)


def write_code(work: str, code: str) -> str:
    path = os.path.join(work, "main.py")
    with open(path, "wb") as fh:  # surrogatepass: model text may hold lone surrogates; Python reports them inside
        fh.write(code.encode("utf-8", "surrogatepass"))
    os.chmod(path, 0o644)
    return path


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


_MARKS = (re.compile(rf"{TMP_PREFIX}(\d+)-".encode()), re.compile(rf"/{CGROUP_PREFIX}(\d+)-".encode()))


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _process_table() -> dict[int, tuple[int, int, int | None]]:
    """pid -> (parent pid, start in clock ticks since boot, the caller's pid in its sandbox mark or None) for
    every process /proc shows that is not a zombie (a zombie holds nothing but its pid)."""
    table = {}
    for name in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
        try:
            fields = _read(f"/proc/{name}/stat").rsplit(b")", 1)[1].split()
            if fields[0] in (b"Z", b"X"):
                continue
            marks = (_read(f"/proc/{name}/cmdline"), _read(f"/proc/{name}/cgroup"))
        except (OSError, IndexError):
            continue
        found = [m for mark, text in zip(_MARKS, marks) if (m := mark.search(text))]
        table[int(name)] = (int(fields[1]), int(fields[19]), int(found[0].group(1)) if found else None)
    return table


def _stranded(since_ticks: int) -> dict[int, int]:
    """Stranded sandbox processes (see stranded_processes) -> the caller's pid in the mark of their tree's top."""
    table = _process_table()
    todo = [
        (pid, owner)
        for pid, (parent, start, owner) in table.items()
        if owner is not None and start >= since_ticks and parent != owner and table.get(parent, (0, 0, None))[2] is None
    ]
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: dict[int, int] = {}
    while todo:
        pid, owner = todo.pop()
        if pid not in found:
            found[pid] = owner
            todo += [(child, owner) for child in children.get(pid, [])]
    return found


def stranded_processes(since_ticks: int = 0) -> list[int]:
    """Sandbox processes whose caller is gone, found by process tree rather than by name: a process marked as
    a sandbox's (its command line holds a call's temp dir name, TMP_PREFIX + the caller's pid, or it runs in a
    per-call cgroup) whose parent is neither a sandbox process nor that caller, which is to say the kernel
    handed it to init (or a subreaper) when its parent died, and every live process below it, whatever it is
    called. Only tops started at or after `since_ticks` (clock ticks since boot) count; [] without /proc."""
    return sorted(_stranded(since_ticks))


def _kill_stranded() -> int:
    """End the stranded sandbox processes of this uid whose tree's caller no longer runs; how many."""
    killed = 0
    for pid, owner in _stranded(0).items():
        try:
            if _owner_alive(f"{TMP_PREFIX}{owner}-", TMP_PREFIX) or os.stat(f"/proc/{pid}").st_uid != os.geteuid():
                continue
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            pass
    return killed


@functools.cache
def sweep_stale() -> int:
    """Remove what a killed trainer left: sandbox temp dirs named after a pid that no longer runs and owned by
    this uid, per-call cgroups of such pids, after ending any task still in them, and stranded sandbox
    processes of such pids. Runs once per process,
    before its first call; returns how many went. A pid reused since by another process keeps its dirs until
    that process ends too."""
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
    return removed + kill_and_remove_stale(_owner_alive) + _kill_stranded()


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
