"""TRACE inside verl 0.9.1 (V1 trainer, agent loops), loaded through the `verl.plugins` entry point.

Pure parts, importable without verl and tested in the main environment: `budgets` (stage-1 root counts),
`advantage` (tree records, rebuilt trees, per-token advantages), `tree_actor` (one prompt's tree from
agent-loop sessions through the core engine), `predictor_state`. verl-facing parts, which import verl:
`loop` (turn-by-turn tool agent loop), `worker`, `manager`, `trainer`, `plugin`. This package's `__init__`
imports none of them.
"""
