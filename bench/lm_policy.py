"""The policy the LM benchmarks (bench_backend.py, bench_predictor.py) sample from, built as the commands build it
(`stack.build.build_policy`, hf backend).

`tiny` (the default) is the warm start the package ships (tiny@0). Where a `tiny@N` is not built (a seed the
package does not ship, before `trace-rl sft seed=N`), the benchmarks fall back to `random-tiny` and say so on
their first line: the same network, so the same cost per token, but a random policy
rarely ends a turn before its token cap and never solves a task, so its episodes are longer and its trees have
no reward contrast; step shares measured on it are not those of the warm-started policy.
"""

from __future__ import annotations

from trace_rl.errors import UserError
from trace_rl.lm.models import RANDOM_TINY
from trace_rl.lm.warm_start import is_tiny
from trace_rl.stack.build import PolicyStack, build_policy
from trace_rl.stack.config import LMPolicyConfig


def load_policy(name: str, device: str = "cpu") -> tuple[PolicyStack, str]:
    """(the policy stack, the name of the model it holds); an unbuilt tiny@N warm start falls back to random-tiny."""
    try:
        return build_policy(LMPolicyConfig(model=name, device=device)), name
    except UserError as err:
        if not is_tiny(name):
            raise
        print(f"({err}; using {RANDOM_TINY}: the same cost per token, but random episodes)")
        return build_policy(LMPolicyConfig(model=RANDOM_TINY, device=device)), RANDOM_TINY
