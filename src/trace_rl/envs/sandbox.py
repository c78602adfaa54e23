"""Run model-written Python in a separate process, contained.

What it covers:
- wall-clock limit: the child runs in its own process group, killed as a group when time is up;
- memory: RLIMIT_AS (an allocation beyond it raises MemoryError inside the child);
- CPU time (RLIMIT_CPU), file size (RLIMIT_FSIZE) and open files (RLIMIT_NOFILE);
- a fresh temporary working directory, deleted afterwards;
- an audit hook (PEP 578, cannot be removed by the code it watches) that refuses: opening files for writing
  outside the working directory, deleting/renaming/creating files or folders outside it, starting processes
  (fork, exec, spawn, subprocess, os.system), opening sockets (no network), and loading C libraries from
  outside the Python installation via ctypes;
- output truncated to `max_output` characters per stream.
What it does not cover: reads anywhere the user can read; ctypes calls into the already-loaded C library
(numpy needs `ctypes.CDLL(None)`), though any process started that way dies with the group; RLIMIT_NPROC,
which Linux ignores for root; a bug in CPython itself; resource use by the
modules the code imports before a limit bites. It is a guard for honest mistakes and careless model code
(loops, huge allocations, stray writes), not a jail for an adversary: use a container or gVisor for that.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass

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
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & (_os.O_WRONLY | _os.O_RDWR | _os.O_CREAT)
            if writes and not _inside(args[0]):
                raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {args[0]}")
        elif event in _PATHS and not _inside(args[_PATHS[event]]):
            raise PermissionError(f"sandbox: {event} outside the working directory is not allowed")
    _sys.addaudithook(_hook)
    del _hook, _inside, _BLOCK, _PATHS, _ROOT, _PREFIXES
    """
)


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
            lines = [l for l in self.stderr.strip().splitlines() if l.strip()]
            last = lines[-1] if lines else f"exit status {self.returncode}"
            if self.returncode < 0:
                last = f"killed by signal {-self.returncode} (memory or CPU limit?)"
            return f"{self.stdout}\nError: {last}".strip()
        return self.stdout.strip() or "(no output; use print() to see values)"


def _limits(memory_mb: int, cpu_s: int) -> None:
    import resource

    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024 * 1024, 16 * 1024 * 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    try:  # ignored for root, effective otherwise
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    except (ValueError, OSError):
        pass


def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 1024, max_output: int = 2000) -> SandboxResult:
    """Run `code` with the limits above; never raises for anything the code does."""
    with tempfile.TemporaryDirectory(prefix="trace-rl-sandbox-") as work:
        script = os.path.join(work, "main.py")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(_GUARD + "\ndel _os, _sys\n" + code)
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "HOME": work, "TMPDIR": work}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", script], cwd=work, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=lambda: _limits(memory_mb, int(timeout_s) + 1),
        )
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
        finally:
            try:  # anything the code left behind in its group goes too
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        clip = lambda b: b.decode("utf-8", "replace")[:max_output]
        return SandboxResult(clip(out), clip(err), None if timed_out else proc.returncode, timed_out)
