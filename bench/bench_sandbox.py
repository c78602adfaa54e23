"""Per-call overhead of the sandbox: median wall time of N trivial snippets, weak (audit hook) vs strict
(bubblewrap namespaces + seccomp, plus per-call cgroups where delegated and the launch chain); and the
overhead of BFCL's per-call limits: median wall time of a one-call step (`call[pwd()]`, which runs only in a
bounded copy) next to the call made directly.
Run: PYTHONPATH=src python bench/bench_sandbox.py [N]"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
import warnings

from trace_rl.envs.sandbox import own_tmpfs, run_python, strict_unavailable
from trace_rl.envs.sandbox_cgroup import memory_cgroup_root, pids_cgroup_root


def median_ms(mode: str, n: int) -> float:
    times = []
    for i in range(n):
        start = time.perf_counter()
        res = run_python(f"print({i} + 1)", mode=mode)
        times.append(time.perf_counter() - start)
        assert res.observation() == str(i + 1), res
    return 1000 * statistics.median(times)


def bfcl_step_ms(n: int) -> tuple[float, float]:
    from trace_rl.envs.bfcl_env import BFCLEnv, load_bfcl

    env = BFCLEnv(steps_per_turn=10 * n)
    env.reset(load_bfcl("multi_turn_base", limit=1)[0])
    fs = env.instances["GorillaFileSystem"]
    step, direct = [], []
    for _ in range(n):
        start = time.perf_counter()
        env.step("Action: call[pwd()]")
        step.append(time.perf_counter() - start)
        start = time.perf_counter()
        fs.pwd()
        direct.append(time.perf_counter() - start)
    return 1000 * statistics.median(step), 1000 * statistics.median(direct)


def main(n: int = 100) -> None:
    warnings.simplefilter("ignore", RuntimeWarning)
    print(f"weak (audit hook): median {median_ms('weak', n):.1f} ms per call over {n} trivial snippets")
    why = strict_unavailable()
    if why is None:
        parts = [
            "pids cgroup" if pids_cgroup_root() else "no pids cgroup",
            "memory cgroup" if memory_cgroup_root() else "no memory cgroup",
            "launch chain (unshare, setpriv, own /tmp)" if own_tmpfs() else "bwrap run directly",
        ]
        print(f"strict (bwrap + seccomp, {', '.join(parts)}): median {median_ms('strict', n):.1f} ms per call")
    else:
        print(f"strict: unavailable here ({why})")
    if importlib.util.find_spec("bfcl_eval") is not None:
        step, direct = bfcl_step_ms(n)
        print(f"bfcl: median {step:.2f} ms per one-call step (its bounded copy included), {direct:.3f} ms for the call")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
