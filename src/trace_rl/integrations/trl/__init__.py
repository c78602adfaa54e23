"""TRACE trees inside TRL's GRPOTrainer: `TraceRolloutFunc` (no TRL import) and `TraceGRPOTrainer` (imports TRL).

`from trace_rl.integrations.trl import TraceGRPOTrainer` imports TRL on first use only, so the rollout function
and its tests run where TRL is not installed.
"""

from .rollout import TraceRolloutFunc, hf_backend, tree_reward

__all__ = ["TraceRolloutFunc", "TraceGRPOTrainer", "hf_backend", "tree_reward"]


def __getattr__(name: str):
    if name == "TraceGRPOTrainer":
        from .trainer import TraceGRPOTrainer

        return TraceGRPOTrainer
    raise AttributeError(name)
