"""Experimental methods and strategies: research variants of TRACE that the measurements so far do not show
beating the stable methods on the LM task (lab/notes/2026-12-04-allocator-verdict.md). They stay selectable by
name (`method=trace_cost`), are listed by `trace-rl methods` as experimental, and are imported only when one is
chosen or listed. The calibration layers, experimental too, are modules the engine imports (numpy only, no state
until a layer is chosen).

- `strategies.py`: the root strategies `knapsack_repaired` and `active_<objective>` (root objectives weighted by
  what a group teaches, `root_objectives.py`), and the prefix strategies `cost` (stage 2 under a cost budget) and
  `mix` (stage 2 pooled over a step's prompts);
- `methods.py`: the methods composed of them;
- `flip.py`, `root_calibration.py` (on `map_logistic.py`): the calibration layers of the success predictor, read
  by stage 2 and stage 1 when `predictor.flip_model` / `root_model` is `calibrated` (the engine imports them; they
  stay raw, and cost nothing, otherwise).

Limits: the exact allocators these variants call stay in the core beside their stable siblings and their
brute-force tests (`allocation.py`'s cost-budget and pooled allocators, `knapsack.py`'s repaired optimum).
"""
