"""trace-rl: TRACE (Tree Rollout Allocation for Contrastive Exploration) for multi-turn agentic RL.

Layers (dependencies point down): the core at this package's top level (tree, allocation, advantages,
metrics, methods, seeding; numpy only), predictors/, lm/ (models), backends/, envs/, agent/, rollout/ (the
one TRACE step), testbed/ (a synthetic environment with exact V), train/, and the CLI.
"""

__version__ = "0.1.0"
