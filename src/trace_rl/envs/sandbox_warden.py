"""The warden of a strict sandbox call where bwrap runs directly (`sandbox.own_tmpfs()` False: util-linux's
unshare or setpriv missing, or user namespaces that do not nest). The caller runs it as a script,
`python -I -S sandbox_warden.py CALLER_PID MAX_INODES -- bwrap ...` (`command`), between itself and bwrap; it
imports the standard library only. It closes the two gaps that path had:

- A caller killed at any instant. The warden's parent-death signal (SIGTERM) is set before bwrap starts and
  checked against the caller's pid (a caller gone before that: exit 97, nothing started). The warden is a child
  subreaper, so bwrap's child, orphaned when bwrap dies while still setting the sandbox up (before bwrap's own
  --die-with-parent reaches that child, which then waits forever for a parent that is gone), is handed to the
  warden, not to the host's init. On the caller's death the warden kills bwrap and everything handed to it and
  exits once none is left; when bwrap ends normally it does the same for anything left.
- /tmp's inodes. bwrap can cap its tmpfs in bytes only (`--size`); files and folders hold kernel memory the size
  misses. Once the snippet runs (bwrap's child has exec'd: until then /proc/PID/root is the host's root), the
  warden reads the snippet's /tmp every POLL_S (statvfs through /proc/PID/root) and kills the snippet when it
  holds more than MAX_INODES files and folders, saying so on stderr (the call's last error line).

Limits, stated: the inode cap is checked from outside, not refused by the kernel: a snippet may overshoot it by
what it makes within one poll (plus any time the warden waits for a CPU; 0-128 files over here, under load), and
the snippet is stopped rather than given ENOSPC; on a kernel without pidfds (before Linux 5.3) the check is off,
as the snippet could not be signalled without risking a reused pid. The warden is one more process per call on
this path: about 20 ms of CPU a call here (Python's start, ctypes, the polls), and a few to tens of ms of wall
time on a loaded machine. A warden killed by SIGKILL (the caller's last resort after 5 s) cleans nothing up
itself: bwrap's --die-with-parent, set long before, and the next process's sweep (`sandbox_host.sweep_stale`) do.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time

POLL_S = 0.005  # how often /tmp's inodes are read: ~90 files a ms at most here, so a few hundred over the cap
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
CALLER_GONE = 97  # the warden's exit status when the caller was gone before anything started


class _CallerGone(Exception):
    pass


def command(cmd: list[str], max_inodes: int) -> list[str]:
    """`cmd` (bwrap's) run under the warden of the calling process."""
    return [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), str(os.getpid()), str(max_inodes), "--", *cmd]


def children(pid: int) -> list[int]:
    """The children of `pid` (its thread group's main thread's), by /proc; [] if gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except FileNotFoundError:  # the kernel lacks CONFIG_PROC_CHILDREN, or pid is gone: scan every process
        pass
    except OSError:
        return []
    out = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        if _stat(int(name))[1] == pid:
            out.append(int(name))
    return out


def _stat(pid: int) -> tuple[bytes, int | None]:
    """(command name, parent pid) of `pid`, or (b"", None) if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        head, tail = data.rsplit(b")", 1)
        return head.split(b"(", 1)[1], int(tail.split()[1])
    except (OSError, IndexError, ValueError):
        return b"", None


def tmp_inodes(pid: int) -> int | None:
    """Files and folders in `pid`'s /tmp (the tmpfs's root included), or None when it cannot be read."""
    try:
        st = os.statvfs(f"/proc/{pid}/root/tmp")
    except OSError:
        return None
    return st.f_files - st.f_ffree


def end_all() -> None:
    """Kill every child of this process, those handed to it as a subreaper included, and reap them all."""
    while True:
        for pid in children(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(-1, 0)  # a child's exit hands its own children to this process before it is reaped
        except ChildProcessError:
            return


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _adopt(bwrap: int) -> tuple[int, int] | None:
    """bwrap's child (the snippet to be) and a pidfd on it, once bwrap has made it."""
    for pid in children(bwrap):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        if _stat(pid)[1] == bwrap:  # still bwrap's child after pidfd_open: the pidfd is that process's
            return pid, fd
        os.close(fd)
    return None


def in_sandbox(pid: int, launcher: bytes) -> bool:
    """Whether `pid` runs the snippet in its sandbox: it has exec'd (its command name is no longer the
    launcher's, `launcher`) and its root is not this process's (bwrap has pivoted into the sandbox's root).
    Before that, /proc/PID/root/tmp is the host's /tmp, which must never be judged as the snippet's."""
    name = _stat(pid)[0]
    try:
        root, own = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except OSError:
        return False
    return name not in (launcher, b"") and (root.st_dev, root.st_ino) != (own.st_dev, own.st_ino)


def _stop(pidfd: int, max_inodes: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        return  # already gone
    os.write(2, f"the sandbox stopped the code: /tmp held more than {max_inodes} files and folders\n".encode())


def watch(bwrap: int, launcher: bytes, max_inodes: int) -> int:
    """Poll bwrap (its command name `launcher`) until it ends, stopping its snippet past `max_inodes` in /tmp;
    bwrap's exit status."""
    snippet, running, stopped = None, False, False
    ended = _pidfd(bwrap)  # readable once bwrap has exited: its end is seen at once, not at the next poll
    while True:
        if ended is not None and select.select([ended], [], [], POLL_S)[0]:
            status = os.waitpid(bwrap, 0)[1]
            break
        if ended is None:  # a kernel without pidfds (before 5.3): bwrap's end is seen at the next poll
            time.sleep(POLL_S)
            pid, status = os.waitpid(bwrap, os.WNOHANG)
            if pid:
                break
        if snippet is None:
            snippet = _adopt(bwrap)
        elif not stopped:
            # latched: once in its sandbox, the snippet cannot leave its root, though it could rename itself
            running = running or in_sandbox(snippet[0], launcher)
            used = tmp_inodes(snippet[0]) if running else None
            if used is not None and used > max_inodes:
                stopped = True  # one kill, one message
                _stop(snippet[1], max_inodes)
    if ended is not None:
        os.close(ended)
    if snippet is not None:
        os.close(snippet[1])
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code  # as bwrap reports a signal: 128 + N


def _gone(signum: int, frame: object) -> None:
    raise _CallerGone


def main(argv: list[str]) -> int:
    caller, max_inodes, cmd = int(argv[1]), int(argv[2]), argv[4:]
    signal.signal(signal.SIGTERM, _gone)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) or libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0):
        os.write(2, f"sandbox warden: prctl failed ({os.strerror(ctypes.get_errno())})\n".encode())
        return CALLER_GONE
    try:
        if os.getppid() != caller:  # the caller died before the parent-death signal was set
            return CALLER_GONE
        bwrap = os.fork()
        if bwrap == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                os.execv(cmd[0], cmd)
            finally:
                os._exit(127)
        os.closerange(3, 1 << 16)  # bwrap holds the call's pipes now; the caller reads EOF when bwrap ends
        code = watch(bwrap, os.path.basename(cmd[0]).encode()[:15], max_inodes)
        end_all()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # all ended: nothing left for the caller's death to do
        return code
    except _CallerGone:
        end_all()
        return 137


if __name__ == "__main__":
    sys.exit(main(sys.argv))
