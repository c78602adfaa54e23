"""Training: supervised warm start (sft.py); the policy update from trees comes next."""
