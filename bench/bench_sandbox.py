"""Per-call overhead of the sandbox: median wall time of N trivial snippets, weak (audit hook) vs strict
(bubblewrap namespaces + seccomp). Run: PYTHONPATH=src python bench/bench_sandbox.py [N]"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

from trace_rl.envs.sandbox import run_python, strict_unavailable


def median_ms(mode: str, n: int) -> float:
    times = []
    for i in range(n):
        start = time.perf_counter()
        res = run_python(f"print({i} + 1)", mode=mode)
        times.append(time.perf_counter() - start)
        assert res.observation() == str(i + 1), res
    return 1000 * statistics.median(times)


def main(n: int = 100) -> None:
    warnings.simplefilter("ignore", RuntimeWarning)
    print(f"weak (audit hook): median {median_ms('weak', n):.1f} ms per call over {n} trivial snippets")
    why = strict_unavailable()
    if why is None:
        print(f"strict (bwrap + seccomp): median {median_ms('strict', n):.1f} ms per call over {n} trivial snippets")
    else:
        print(f"strict: unavailable here ({why})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
