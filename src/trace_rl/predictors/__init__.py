"""Success predictors V~(H) behind one protocol (see base.py)."""

from .base import Predictor, Prefix, training_examples
from .history import RewardHistoryPredictor
from .logistic import OnlineLogisticPredictor

__all__ = ["Predictor", "Prefix", "training_examples", "RewardHistoryPredictor", "OnlineLogisticPredictor"]
