"""A function run under a deadline in a forked copy of a small, long-lived worker process (BFCL's calls and
the math answer checker; standard library only).

Why a worker: a fork copies the forking process's page tables, so its cost grows with that process's
address space: a trainer with torch and a model loaded paid several times a bare process's cost per BFCL
step (figures in docs/environments.md, BFCL). A worker is a fresh interpreter that imports only this module
and what the functions it runs need; each request forks the worker, not the caller. The function
(module-level, sent by name) and its arguments travel pickled, so the copy holds exactly the state it is
given, as a deep copy would.

The guarantees are those of a fork of the caller: a per-item deadline (each `tick()` restarts it), a total
bound (by the wall clock, or with `cpu=True` by the copy's CPU time, which machine load does not change), an
optional memory bound (`memory_mb`: RLIMIT_AS in the copy, over what it maps when forked), the caller survives
a function that hangs or crashes (the copy is killed, the worker lives on), and the function's side effects
die with the copy. What differs: the copy sees only its arguments and the worker's own module state, not the
caller's; a value that cannot be pickled cannot be sent, and then the function runs on a fork of the caller as
before (also when no worker can be started, or one fails). Where fork is unavailable (not Linux or macOS) the
function runs here, unbounded.

Workers: one per concurrent caller (environment steps run in a thread pool), started on first use (a new
interpreter, tens of milliseconds) and reused. Each lives in its own session, so a terminal's Ctrl-C
reaches the caller only; it exits when its pipe closes, which includes the caller being killed. A worker
that does not answer within the function's bound plus GRACE_S is killed with its process group. A forked
caller starts its own workers; the parent's are not shared.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import pickle
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

GRACE_S = 30.0  # beyond the function's own bound: a worker's start and imports on a loaded machine
POLL_S = 0.02  # how often a CPU-time limit is checked
WALL_FACTOR = 4.0  # with a CPU-time limit: the wall-clock bound on a copy that waits instead of computing
_HEAD = struct.Struct("<Q")  # each message: its length, then a pickle


def _cpu_s(pid: int) -> float | None:
    """CPU time (user + system, all threads) the process has used, in seconds; None where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _limit_memory(memory_mb: int) -> None:
    """RLIMIT_AS = this process's address space now + `memory_mb`: what the function may add, whatever the
    process it was forked from already maps (a worker, or a trainer holding torch)."""
    import resource

    try:
        with open("/proc/self/statm") as fh:
            now = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return  # no /proc (macOS): time-bounded only
    limit = now + (memory_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_forked(
    fn: Callable, timeout_s: float, total_s: float | None = None, *, cpu: bool = False, memory_mb: int | None = None
) -> tuple[str, Any, int]:
    """`fn(tick)` in a forked copy of this process with a deadline: ("ok", value, ticks), ("timeout", None,
    ticks) or ("error", message, ticks). Each `tick()` the child makes restarts the deadline (a per-item limit)
    and is counted; `total_s` bounds the whole. The value comes back pickled; the copy's side effects die with
    it.

    cpu: the limits count the copy's CPU time, not the wall clock, so whether a function near the limit
    finishes does not depend on how loaded the machine is (read from /proc every POLL_S; where /proc is
    missing, the wall clock); a copy that waits without using CPU, or that the load leaves under 1/WALL_FACTOR
    of a core, is stopped at WALL_FACTOR times the limits by the wall clock.
    memory_mb: the copy may grow its address space by this much (RLIMIT_AS), then allocations fail."""
    r, w = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns on fork in a threaded process; the child runs pure Python only
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns, never runs the parent's cleanup
        try:
            os.close(r)
            try:
                if memory_mb is not None:
                    _limit_memory(memory_mb)
                payload = pickle.dumps(("ok", fn(lambda: os.write(w, b"."))))
            except BaseException as err:  # noqa: BLE001
                payload = pickle.dumps(("error", f"{type(err).__name__}: {str(err)[:200]}"))
            with os.fdopen(w, "wb") as fh:
                fh.write(b"!" + payload)
        finally:
            os._exit(0)
    os.close(w)
    on_cpu = cpu and _cpu_s(pid) is not None
    stretch = WALL_FACTOR if on_cpu else 1.0
    total = total_s if total_s is not None else float("inf")
    data, ticks, start = bytearray(), 0, time.monotonic()
    item_wall, item_cpu = start, 0.0  # when the current item began, by the wall clock and in CPU time
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(r, selectors.EVENT_READ)
            while True:
                now = time.monotonic()
                left = min(item_wall + stretch * timeout_s, start + stretch * total) - now
                if on_cpu:
                    used = _cpu_s(pid)
                    if used is not None and (used - item_cpu > timeout_s or used > total):
                        return "timeout", None, ticks
                    left = min(left, POLL_S)
                if left <= 0:
                    return "timeout", None, ticks
                if not sel.select(left):
                    continue
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                if not data:  # still in the ticks: each one restarts the clock
                    head, bang, rest = chunk.partition(b"!")
                    ticks += len(head)
                    if head:
                        item_wall = time.monotonic()
                        item_cpu = (_cpu_s(pid) or 0.0) if on_cpu else 0.0
                    chunk = bang + rest
                data += chunk
    finally:  # past the deadline, or done (it has written all and is exiting), or the caller was interrupted
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    try:
        status, value = pickle.loads(bytes(data[1:]))
    except Exception:  # noqa: BLE001 (the child died before it wrote)
        return "error", "the worker process died", ticks
    return status, value, ticks


def run_bounded(
    fn: Callable,
    args: tuple,
    timeout_s: float,
    total_s: float | None = None,
    preload: tuple[str, ...] = (),
    *,
    cpu: bool = False,
    memory_mb: int | None = None,
) -> tuple[str, Any, int]:
    """`fn(tick, *args)` under run_forked's deadlines (and its `cpu` and `memory_mb` bounds) and with its
    answer, run on a fork of a worker process. `fn` must be a module-level function; `preload` names modules
    the worker imports once, before it forks (what `fn` imports on its first call would otherwise be imported
    again in every copy), and "module:function" a function it then calls once, to fill caches every copy
    inherits."""
    if not hasattr(os, "fork"):
        return "ok", fn(lambda: None, *args), 0
    bounds = {"cpu": cpu, "memory_mb": memory_mb}
    try:
        request = pickle.dumps((fn, args, timeout_s, total_s, preload, bounds), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 (state that cannot be pickled: fork this process, as before)
        request = None
    worker = _take() if request is not None and not _broken.is_set() else None
    if worker is not None:
        try:
            bound = (total_s if total_s is not None else timeout_s) * (WALL_FACTOR if cpu else 1.0)
            reply = worker.ask(request, bound + GRACE_S)
        except BaseException:  # interrupted mid-request: its answer must not reach the next caller
            worker.kill()
            raise
        if reply is _LATE:
            worker.kill()
            return "timeout", None, 0
        if reply is None:  # it died or could not be reached
            worker.kill()
            if not worker.answered:  # one that cannot even start here: stop starting them
                _broken.set()
        else:
            _give(worker)
            if reply[0] != "unavailable":
                return reply
    # no worker, or it cannot run this (it failed to import fn's module, say): fork this process instead
    return run_forked(functools.partial(_call, fn, args), timeout_s, total_s, **bounds)


def _call(fn: Callable, args: tuple, tick: Callable) -> Any:
    return fn(tick, *args)


_LATE = ("late",)  # a worker that did not answer in time


class _Worker:
    def __init__(self) -> None:
        code = "import sys; sys.path[:] = sys.argv[1:]; from trace_rl.envs.bounded import serve; serve()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, *sys.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
        )
        self.answered = 0

    def ask(self, request: bytes, bound_s: float) -> tuple | None:
        """The worker's reply; _LATE past `bound_s`; None when it died or could not be reached."""
        try:
            _write(self.proc.stdin.fileno(), request)
            reply = _read(self.proc.stdout.fileno(), time.monotonic() + bound_s)
            self.answered += 1
            return reply
        except TimeoutError:  # before OSError, its base class
            return _LATE
        except Exception:  # noqa: BLE001 (it died, or its answer cannot be read here: the caller forks itself)
            return None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # with a copy it may still be running
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_idle: list[_Worker] = []
_broken = threading.Event()  # set when a worker died before its first answer: this process forks itself from then on
_lock = threading.Lock()


def _take() -> _Worker | None:
    with _lock:
        if _idle:
            return _idle.pop()
    try:
        return _Worker()
    except Exception:  # noqa: BLE001 (no interpreter to start: the caller forks itself)
        return None


def _give(worker: _Worker) -> None:
    with _lock:
        _idle.append(worker)


def _forget() -> None:
    """In a forked child: the parent's workers and lock are the parent's."""
    global _idle, _lock
    _idle, _lock = [], threading.Lock()


@atexit.register
def _close_all() -> None:
    with _lock:
        workers = list(_idle)
        _idle.clear()
    for worker in workers:
        worker.close()  # its pipe closes: it exits


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def _write(fd: int, payload: bytes) -> None:
    view = memoryview(_HEAD.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    out = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while len(out) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError
            chunk = os.read(fd, min(n - len(out), 1 << 20))
            if not chunk:
                raise EOFError
            out += chunk
    return bytes(out)


def _read(fd: int, deadline: float | None) -> Any:
    (n,) = _HEAD.unpack(_read_exact(fd, _HEAD.size, deadline))
    return pickle.loads(_read_exact(fd, n, deadline))


def serve() -> None:
    """The worker's loop: read a request, run it on a fork of this process, answer; exit when the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inp, out = os.dup(0), os.dup(1)
    warm: set[str] = set()
    null = os.open(os.devnull, os.O_RDWR)  # what the functions print must not reach the pipe
    os.dup2(null, 0)
    os.dup2(null, 1)
    while True:
        try:
            (n,) = _HEAD.unpack(_read_exact(inp, _HEAD.size, None))
            body = _read_exact(inp, n, None)
        except EOFError:
            return
        try:
            fn, args, timeout_s, total_s, preload, bounds = pickle.loads(body)
            for name in preload:
                if name not in warm:  # once per worker: every copy forked after it starts warm
                    module, _, call = name.partition(":")
                    loaded = importlib.import_module(module)
                    if call:
                        getattr(loaded, call)()
                    warm.add(name)
        except Exception as err:  # noqa: BLE001 (this interpreter cannot run it: the caller forks itself)
            reply: tuple = ("unavailable", f"{type(err).__name__}: {str(err)[:200]}", 0)
        else:
            reply = run_forked(functools.partial(_call, fn, args), timeout_s, total_s, **bounds)
            del fn, args  # the state it was given goes with it
        try:
            payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:  # noqa: BLE001
            payload = pickle.dumps(("error", f"{type(err).__name__}: {str(err)[:200]}", reply[2]))
        _write(out, payload)
