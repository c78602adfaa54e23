"""The weak sandbox mode (`sandbox="weak"`, see `envs.sandbox`): the child runs with the strict mode's rlimits,
wall clock and output cap, plus a PEP 578 audit hook that refuses writes outside a temporary directory,
process creation, sockets and foreign C libraries. Pure Python can defeat the hook (gc can reach its tables),
ctypes reaches libc, and the child sees the host's processes and files: a guard for careless code, not a jail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

from .sandbox_host import ENV, FSIZE_MB, NOFILE, TMP_PREFIX, SandboxResult, finish, write_code

_GUARD = textwrap.dedent(
    """
    import os as _os, sys as _sys
    _ROOT = _os.path.realpath(_os.getcwd())
    _BLOCK = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "subprocess.Popen",
              "socket.__new__", "socket.connect", "socket.bind", "pty.spawn"}
    _PREFIXES = tuple({_os.path.realpath(p) for p in (_sys.prefix, _sys.base_prefix)})
    _PATHS = {"os.remove": 0, "os.rename": 0, "os.rmdir": 0, "os.mkdir": 0, "os.chmod": 0, "os.symlink": 1,
              "os.link": 1, "os.truncate": 0, "os.chown": 0, "shutil.rmtree": 0, "os.utime": 0}
    def _inside(p, _os=_os, _ROOT=_ROOT):
        try:
            p = _os.fsdecode(p) if not isinstance(p, int) else None
        except Exception:
            return False
        return p is None or _os.path.realpath(p).startswith(_ROOT + _os.sep) or _os.path.realpath(p) == _ROOT
    def _hook(event, args, _os=_os, _inside=_inside, _BLOCK=_BLOCK, _PATHS=_PATHS, _PREFIXES=_PREFIXES):
        if event in _BLOCK:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "ctypes.dlopen" and args[0] is not None and not (
                isinstance(args[0], str) and _os.path.realpath(args[0]).startswith(_PREFIXES)):
            raise PermissionError(f"sandbox: loading {args[0]} is not allowed")
        if event == "open" and len(args) > 1:
            mode, flags = args[1], args[2] if len(args) > 2 else 0
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & (
                _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT
            )
            if writes and not _inside(args[0]):
                raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {args[0]}")
        elif event in _PATHS and not _inside(args[_PATHS[event]]):
            raise PermissionError(f"sandbox: {event} outside the working directory is not allowed")
    _sys.addaudithook(_hook)
    del _hook, _inside, _BLOCK, _PATHS, _ROOT, _PREFIXES
    """
)


def _weak_limits(memory_mb: int, cpu_s: int) -> None:
    import resource

    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_MB << 20, FSIZE_MB << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
    try:  # ignored for root, effective otherwise
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    except (ValueError, OSError):
        pass


def run_weak(code: str, timeout_s: float, memory_mb: int, max_output: int) -> SandboxResult:
    with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-") as work:
        script = write_code(work, _GUARD + "\ndel _os, _sys\n" + code)
        env = {**ENV, "HOME": work, "TMPDIR": work}
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-X", "utf8", script],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=lambda: _weak_limits(memory_mb, int(timeout_s) + 1),  # noqa: PLW1509  (weak mode only)
        )

        def kill() -> None:  # the whole group: what the code started goes too, unless it left the group
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        return finish(proc, start + timeout_s, max_output, kill)
