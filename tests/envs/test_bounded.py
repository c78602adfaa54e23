"""Functions under a deadline on forks of the small worker process (trace_rl.envs.bounded), as BFCL uses them.
The functions below are module-level so that the worker can import them by name (it imports this module)."""

import os
import signal
import sys
import threading
import time

import pytest

from trace_rl.envs import bounded
from trace_rl.envs.bounded import run_bounded

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="bounded runs need fork")
COUNTER = [0]


def where(tick, marker):
    """Who ran this, and what it saw: its parent's pid, whether the caller's marker is here, a counter it bumps."""
    COUNTER[0] += 1
    tick()
    return os.getppid(), marker in sys.modules, COUNTER[0]


def items(tick, seconds: list[float]):
    for s in seconds:
        time.sleep(s)
        tick()
    return "all done"


def die(tick, how):
    tick()
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("a backend bug")


def test_the_copy_is_a_fork_of_the_worker_holding_only_its_arguments():
    sys.modules["trace_rl_caller_marker"] = sys  # in the caller only
    try:
        first = run_bounded(where, ("trace_rl_caller_marker",), 5.0)
        second = run_bounded(where, ("trace_rl_caller_marker",), 5.0)
    finally:
        del sys.modules["trace_rl_caller_marker"]
    (status, (parent, seen, count), ticks) = first
    assert status == "ok" and ticks == 1
    assert parent != os.getpid() and not seen  # forked from the worker, not from this process
    assert count == 1 and second[1] == (parent, False, 1)  # the same worker, and the copy's changes died with it


def test_each_tick_restarts_the_deadline_and_the_total_bounds_the_whole():
    assert run_bounded(items, ([0.3, 0.3, 0.3],), 0.6) == ("ok", "all done", 3)  # 0.9 s in all, 0.3 s per item
    status, value, ticks = run_bounded(items, ([0.05, 30.0, 0.05],), 0.5)
    assert (status, value, ticks) == ("timeout", None, 1)  # the second item is the one that ran past
    assert run_bounded(items, ([0.3] * 10,), 0.6, total_s=1.0)[0] == "timeout"


def test_the_caller_and_the_worker_survive_a_copy_that_crashes():
    status, message, ticks = run_bounded(die, ("raise",), 5.0)
    assert status == "error" and "RuntimeError: a backend bug" in message and ticks == 1
    assert run_bounded(die, ("kill",), 5.0)[:2] == ("error", "the worker process died")
    assert run_bounded(where, ("x",), 5.0)[0] == "ok"


def test_unpicklable_arguments_run_on_a_fork_of_the_caller_instead():
    assert run_bounded(holds_lock, ("picklable",), 5.0)[1] != os.getpid()  # through the worker
    local = threading.Lock()  # cannot be pickled, so it cannot travel to the worker
    assert run_bounded(holds_lock, (local,), 5.0) == ("ok", os.getpid(), 1)  # the copy's parent is this process


def holds_lock(tick, lock):
    tick()
    return os.getppid()


def test_a_worker_that_cannot_start_leaves_the_caller_forking_itself(monkeypatch):
    monkeypatch.setattr(bounded, "_idle", [])
    monkeypatch.setattr(bounded, "_broken", threading.Event())
    monkeypatch.setattr(bounded.sys, "executable", "/bin/false")
    assert run_bounded(holds_lock, (None,), 5.0) == ("ok", os.getpid(), 1)
    assert bounded._broken.is_set()  # and it stops starting them
    assert run_bounded(holds_lock, (None,), 5.0) == ("ok", os.getpid(), 1)


def test_concurrent_callers_each_get_a_worker():
    out: list = []
    threads = [threading.Thread(target=lambda: out.append(run_bounded(items, ([0.2],), 5.0))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [("ok", "all done", 1)] * 4


def test_a_worker_that_does_not_answer_within_the_bound_is_killed(monkeypatch):
    used = []
    take = bounded._take
    monkeypatch.setattr(bounded, "_take", lambda: used.append(take()) or used[-1])
    monkeypatch.setattr(bounded, "_idle", [])
    monkeypatch.setattr(bounded, "GRACE_S", -4.5)  # the caller gives up 0.5 s in, before the worker's own limit
    assert run_bounded(items, ([3.0],), 5.0) == ("timeout", None, 0)
    assert used[0].proc.poll() is not None and bounded._idle == []  # killed, not handed back


def spin(tick, seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    tick()
    return "spun"


def allocate(tick, mb):
    return len(bytearray(mb << 20))


def test_a_cpu_time_limit_stops_a_busy_copy_and_a_waiting_one():
    assert run_bounded(spin, (0.05,), 2.0, cpu=True) == ("ok", "spun", 1)
    assert run_bounded(spin, (30.0,), 0.3, cpu=True)[0] == "timeout"  # CPU time: ends near 0.3 s however loaded
    # a copy that waits uses no CPU: the wall clock stops it at WALL_FACTOR times the limit
    assert run_bounded(items, ([30.0],), 0.2, cpu=True)[0] == "timeout"


def test_a_memory_bound_makes_a_large_allocation_fail_in_the_copy():
    assert run_bounded(allocate, (64,), 5.0, memory_mb=256) == ("ok", 64 << 20, 0)
    status, message, _ = run_bounded(allocate, (2048,), 5.0, memory_mb=256)
    assert status == "error" and message.startswith("MemoryError")


WARM = [0]


def warm_up():
    WARM[0] += 1


def read_warm(tick):
    return WARM[0]


def test_a_preload_function_runs_once_in_the_worker_before_it_forks():
    first = run_bounded(read_warm, (), 5.0, preload=("test_bounded:warm_up",))
    second = run_bounded(read_warm, (), 5.0, preload=("test_bounded:warm_up",))
    assert first == second == ("ok", 1, 0) and WARM[0] == 0  # in the worker, once; never in this process
