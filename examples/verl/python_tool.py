"""The paper's math tool for verl's tool agent loop: `python(code)` runs model-written code in trace-rl's sandbox.

Loaded by `actor_rollout_ref.rollout.multi_turn.function_tool_path` (verl 0.9.1 executes this file and keeps
the functions decorated with `@function_tool`). Stateless across calls, as TRACE's forks require: each call
runs in a fresh sandboxed process, so a continuation that replays no earlier call sees the same tool.

The sandbox mode comes from TRACE_SANDBOX: `strict` (the default) is checked when this file is loaded and
refused there, in one line, where bubblewrap cannot run, so a run never trains with a dead tool; `weak` (an
in-process audit hook) must be chosen explicitly, and the trace trainer then writes trace/sandbox_weak=1 into
every step's metrics (see trace_rl.envs.sandbox for what each mode contains).
"""

import os

from verl.tools.function_tool import function_tool

from trace_rl.envs.sandbox import require, run_python

MODE = require(os.environ.get("TRACE_SANDBOX", "strict"))  # raises SandboxUnavailable here, not per call


@function_tool
def python(code: str) -> str:
    """Run Python code and return what it prints (or the error's last line).

    Args:
        code: A complete Python program; print the values you need to see.
    """
    return run_python(code, timeout_s=10.0, mode=MODE).observation()
