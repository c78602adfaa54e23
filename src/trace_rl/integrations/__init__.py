"""Bridges from trace-rl's core to outside RL trainers (verl, TRL).

The core never imports this package, and nothing here imports verl or TRL at package level: `rows` is pure
(numpy and the core), and each trainer's adapters live in their own subpackage that imports its trainer.
"""
