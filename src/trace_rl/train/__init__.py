"""Training: the supervised warm start (sft.py), the policy update from trees (losses, packing, update), the
training loop with checkpoints (trainer, checkpoint, loggers) and the comparison across methods (compare)."""
