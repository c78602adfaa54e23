"""VIP's allocation as trace-rl computes it (exact continuous step) against upstream's (SLSQP at its default
tolerance), at the trainer's call (RLOO rule, 1 <= n <= 32), 8 rollouts a prompt.

For each batch size: the share of batches whose final allocations are identical, the rollouts that move
between prompts (half the L1 distance) and how far SLSQP's continuous objective sits above the optimum.
The batches are success rates a GP gives after a step: a mix of observed rates (0 and 1 included) and
prior-like small values. Prints figures, asserts nothing. Needs scipy and upstream's
src/vip/allocation/bernoulli_allocation.py (github.com/HieuNT91/VIP @ 87bedf7), which the repository does not
ship: `TRACE_RL_VIP_REFERENCE=/path/to/bernoulli_allocation.py PYTHONPATH=src python bench/bench_vip_faithful.py`
(docs/baselines.md); without it the bench says so in one line and exits with status 2.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
import warnings

import numpy as np
import upstream_code  # bench/, on the path when the bench runs as a script

from trace_rl.vip import allocate_vip, solve_continuous, vip_objective

VIP = "TRACE_RL_VIP_REFERENCE"

warnings.filterwarnings("ignore", category=RuntimeWarning)  # SLSQP steps onto n = 1, where a/(n-1) is infinite


def main() -> None:
    try:
        upstream = upstream_code.load(VIP)
    except ValueError as exc:
        sys.exit(f"bench_vip_faithful: {exc}")
    if upstream is None:
        print(f"bench_vip_faithful: {upstream_code.unset_line(VIP)}", file=sys.stderr)
        sys.exit(2)
    rng = np.random.default_rng(0)
    for prompts, batches in [(8, 60), (32, 30), (128, 8)]:
        same, moved, gaps, secs = 0, [], [], 0.0
        for _ in range(batches):
            observed = rng.binomial(8, rng.beta(0.5, 0.5, size=prompts)) / 8
            p = np.where(rng.random(prompts) < 0.3, rng.uniform(0.001, 0.02, prompts), observed)
            q = np.clip(p, 1e-6, 1 - 1e-6)
            if np.std(q) < 1e-3:
                continue
            budget = 8 * prompts
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                x = upstream.solve(q * (1 - q), q, budget, lower=1, upper=32)
                ref = upstream.allocation_rounding(x, q * (1 - q), budget, 32)
            secs += time.perf_counter() - t0
            ours = allocate_vip(p, budget)
            same += ours.tolist() == ref
            moved.append(np.abs(ours - np.array(ref)).sum() / 2)
            best = vip_objective(q, solve_continuous(q, budget))
            gaps.append((vip_objective(q, x) - best) / abs(best))
        print(
            f"P={prompts} (8 per prompt): identical {same}/{len(moved)}; rollouts moved mean {np.mean(moved):.1f}, "
            f"max {max(moved):.0f} of {8 * prompts}; SLSQP above the optimum by {np.median(gaps):.1%} (median), "
            f"{max(gaps):.1%} (max); SLSQP {secs / len(moved):.2f} s a batch"
        )


if __name__ == "__main__":
    main()
