"""The synthetic testbed: tasks with exact V, a tabular policy, an oracle and a learned predictor."""

from .env import TestbedConfig, TestbedEnv, TestbedTask, make_tasks, value_table
from .policy import SoftmaxPolicy
from .predictors import OraclePredictor, TestbedFeatures, learned_predictor

__all__ = [
    "TestbedConfig",
    "TestbedEnv",
    "TestbedTask",
    "make_tasks",
    "value_table",
    "SoftmaxPolicy",
    "OraclePredictor",
    "TestbedFeatures",
    "learned_predictor",
]
