"""Cost of BFCL's per-call time limit in a large process: median wall time of a one-call step
(`call[pwd()]`, whose calls first run on a bounded copy) and of scoring one episode, in this process as
it starts, then after importing torch and transformers, then with that plus a resident block of memory
(a model's weights, say). The bounded copy is what grows with the process: a fork copies the page tables.

Prints figures, asserts nothing. Run: PYTHONPATH=src python bench/bench_bfcl_step.py [N] [MiB]
"""

from __future__ import annotations

import importlib.util
import resource
import statistics
import sys
import time


def median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure(label: str, n: int) -> None:
    from trace_rl.envs.bfcl_env import BFCLEnv, load_bfcl

    entry = load_bfcl("multi_turn_base", limit=1)[0]
    env = BFCLEnv(steps_per_turn=10 * n)
    env.reset(entry)
    fs = env.instances["GorillaFileSystem"]
    step = median_ms(lambda: env.step("Action: call[pwd()]"), n)
    direct = median_ms(fs.pwd, n)
    env.reset(entry)
    env.calls = [[[c for c in calls]] if calls else [] for calls in entry["answer"]]
    env.turn_index = len(entry["answer"]) - 1
    score = median_ms(env.score, max(3, n // 10))
    bare = ""
    if importlib.util.find_spec("trace_rl.envs.bounded") is not None:  # absent before the worker existed
        from trace_rl.envs.bfcl_env import MAX_STATE_BYTES, _run_in_copy  # with no calls: nothing but the copy
        from trace_rl.envs.bounded import run_bounded, run_forked

        fork = median_ms(lambda: run_forked(lambda tick: None, 2.0), n)
        worker = median_ms(lambda: run_bounded(_run_in_copy, ({}, [], MAX_STATE_BYTES), 2.0), n)
        bare = f"; an empty bounded run: {worker:.2f} ms on the worker, {fork:.2f} ms forking this process"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{label} (max RSS {rss:.0f} MiB): {step:.2f} ms per one-call step, {score:.1f} ms per episode scored, "
        f"{direct:.3f} ms for the call itself{bare}"
    )


def main(n: int = 50, mib: int = 1024) -> None:
    measure("small process", n)
    import torch
    import transformers  # noqa: F401

    measure("torch and transformers imported", n)
    block = torch.ones(mib * 2**20 // 4)  # resident: every page written
    measure(f"plus {mib} MiB resident", n)
    del block


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
