"""Per-call cgroups for the strict sandbox (see `envs.sandbox`): a pids cgroup and a memory cgroup where the
host delegates them to this process.

- pids: as root, RLIMIT_NPROC does not bind (the uid inside the user namespace maps to root outside, which the
  kernel exempts), so each call's pids.max bounds every thread. A caller that is not root needs none.
- memory: RLIMIT_AS counts the snippet's address space, not what the kernel allocates on its behalf (inodes,
  dentries, extended attributes, pipe buffers, page tables) nor its tmpfs pages. A memory cgroup counts those
  too (cgroup v1 charges kernel memory to memory.usage_in_bytes, v2 to memory.current): past the call's
  limit the kernel refuses the allocation or kills the snippet. Used for any caller where delegated.
Where a controller is not delegated (no writable hierarchy, or v2 without the controller enabled), the call
runs without it; `envs.sandbox` says what bounds it then.

A shell enters the cgroups, then execs the rest of the launch chain, so every thread the snippet makes is
counted from the first (moving bwrap in after it started would race its clone). Cgroups are named after the
owning pid; `kill_and_remove_stale` ends the tasks of a dead owner's cgroups and removes them.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time

PREFIX = "trace-rl-"  # + the owner's pid + "-" + random hex


def _hierarchies(controller: str) -> list[str]:
    """Where this process's cgroup for `controller` lives: the v1 hierarchy holding it, or the v2 one."""
    try:
        with open("/proc/self/cgroup") as fh:
            own = [line.rstrip("\n").split(":", 2) for line in fh]
        with open("/proc/self/mounts") as fh:
            mounts = [line.split() for line in fh]
    except OSError:
        return []
    out = []
    for _, controllers, path in own:
        for _, point, fstype, options, *_ in mounts:
            if controllers and controller in controllers.split(",") and fstype == "cgroup":
                if controller in options.split(","):
                    out.append(point + path)
            elif not controllers and fstype == "cgroup2":
                out.append(point + path)
    return out


def _probe(bases: list[str], limit_file: str, value: str) -> str | None:
    for base in bases:
        probe = os.path.join(base, f"{PREFIX}{os.getpid()}-probe")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            with open(os.path.join(probe, limit_file), "w") as fh:
                fh.write(value)
            return base
        except OSError:
            continue
        finally:
            os.rmdir(probe)
    return None


@functools.cache
def pids_cgroup_root() -> str | None:
    """The pids cgroup folder this process may create children in, when the caller is root and the host
    delegates one (a writable cgroup v1 `pids` hierarchy, or cgroup v2 with `pids` enabled); else None."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return None
    return _probe(_hierarchies("pids"), "pids.max", "64")


@functools.cache
def memory_cgroup_root() -> str | None:
    """The memory cgroup folder this process may create children in (v1 `memory` or v2 with `memory`
    enabled, writable by this process), or None."""
    if not sys.platform.startswith("linux"):
        return None
    v1 = [b for b in _hierarchies("memory") if os.path.exists(os.path.join(b, "memory.limit_in_bytes"))]
    v2 = [b for b in _hierarchies("memory") if b not in v1]
    return _probe(v1, "memory.limit_in_bytes", str(256 << 20)) or _probe(v2, "memory.max", str(256 << 20))


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


class CallCgroup:
    """The cgroups of one call: pids.max = `tasks` where a pids cgroup is delegated to a root caller, and a
    memory limit of `memory_bytes` (swap included where the kernel counts it) where a memory cgroup is."""

    def __init__(self, tasks: int, memory_bytes: int):
        self.paths: list[str] = []
        name = f"{PREFIX}{os.getpid()}-{os.urandom(6).hex()}"
        pids, mem = pids_cgroup_root(), memory_cgroup_root()
        if pids:
            self._make(os.path.join(pids, name), {"pids.max": str(tasks)})
        if mem:
            v1 = os.path.exists(os.path.join(mem, "memory.limit_in_bytes"))
            limits = (
                {"memory.limit_in_bytes": str(memory_bytes), "memory.memsw.limit_in_bytes": str(memory_bytes)}
                if v1
                else {"memory.max": str(memory_bytes), "memory.swap.max": "0"}
            )
            self._make(os.path.join(mem, name), limits)

    def _make(self, path: str, limits: dict[str, str]) -> None:
        """One controller's cgroup, or none when it cannot be made now (the hierarchy went away or is full):
        the call then runs without that controller, bounded as where none is delegated."""
        made = path not in self.paths  # cgroup v2: one folder holds both controllers
        try:
            if made:
                os.mkdir(path)
            for i, (key, value) in enumerate(limits.items()):
                try:
                    _write(os.path.join(path, key), value)
                except OSError:
                    if i == 0:
                        raise
                    # memsw / swap.max: absent or refused where swap is not accounted; nothing to cap then
        except OSError:
            if made:
                _remove(path)
            return
        if made:
            self.paths.append(path)

    @classmethod
    def make(cls, tasks: int, memory_bytes: int) -> CallCgroup | None:
        """The call's cgroups, or None where none is delegated or none can be made now: the snippet then runs
        bounded by seccomp, the tmpfs caps and the rlimits."""
        group = cls(tasks, memory_bytes)
        return group if group.paths else None

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd`, started by a shell that first enters every cgroup of this call (exit 97 if it cannot)."""
        script = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo 0 > "$1" || exit 97; shift; n=$((n-1)); done; exec "$@"'
        procs = [os.path.join(p, "cgroup.procs") for p in self.paths]
        return ["/bin/sh", "-c", script, "sh", str(len(procs)), *procs, *cmd]

    def remove(self) -> None:
        for path in self.paths:
            _remove(path)


def _remove(path: str) -> bool:
    for _ in range(50):  # the last tasks may take a moment to leave after the sandbox is reaped
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.01)
    return False  # still busy: the next process's sweep ends its tasks and removes it


def _kill_tasks(path: str) -> None:
    try:
        with open(os.path.join(path, "cgroup.procs")) as fh:
            pids = [int(line) for line in fh if line.strip()]
    except (OSError, ValueError):
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def kill_and_remove_stale(owner_alive) -> int:
    """End the tasks of the per-call cgroups whose owner (`owner_alive(name, PREFIX)` False) no longer runs,
    then remove the cgroups; how many went."""
    removed = 0
    for root in {r for r in (pids_cgroup_root(), memory_cgroup_root()) if r}:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            path = os.path.join(root, name)
            if name.startswith(PREFIX) and os.path.isdir(path) and not owner_alive(name, PREFIX):
                _kill_tasks(path)
                removed += _remove(path)
    return removed
