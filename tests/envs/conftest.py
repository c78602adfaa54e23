import os
import time

import pytest
from sandbox_procs import now_ticks, sandbox_processes


@pytest.fixture(scope="session", autouse=True)
def no_sandbox_left_behind():
    """The env tests must leave no sandbox process running: one that outlives its caller holds its memory and
    cgroup until someone kills it by hand. Checked at the end of the session for sandboxes started since its
    start whose caller is this process or has died (another session's live sandboxes are left alone)."""
    if not os.path.isdir("/proc"):
        yield
        return
    start = now_ticks()
    yield
    deadline = time.monotonic() + 10  # a sandbox killed at a test's end takes a moment to be reaped
    while (left := sandbox_processes(start)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, "the tests left sandbox processes running:\n" + "\n".join(left)
