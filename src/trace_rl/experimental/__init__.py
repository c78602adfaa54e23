"""Experimental methods and strategies: research variants of TRACE that the measurements so far do not show
beating the stable methods on the LM task (lab/notes/2026-12-04-allocator-verdict.md). They stay selectable by
name (`method=trace_cost`), are listed by `trace-rl methods` as experimental, and are imported only when one is
chosen or listed: the stable methods never load this package.

- `strategies.py`: the root strategies `knapsack_repaired` and `active_<objective>` (root objectives weighted by
  what a group teaches, `root_objectives.py`), and the prefix strategies `cost` (stage 2 under a cost budget) and
  `mix` (stage 2 pooled over a step's prompts);
- `methods.py`: the methods composed of them.

Limits: the algorithms themselves still live in the core modules they were written in (`root_objectives.py`,
`allocation.py`'s cost and mixing allocators, `knapsack.py`'s repaired optimum) and the calibration layers in
`predictors/` (`flip.py`, `root_calibration.py`), where their tests and benches import them.
"""
