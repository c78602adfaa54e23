"""The one predictor builder: the V~ a method reads, from TRACE's predictor settings, for every entry point
(the command line's `rollout`, `train`, `compare`, verl's processes, TRL's rollout function).

The method decides first: Knapsack RL's methods read a reward history, VIP its Gaussian process; every other
method reads `kind`: `light` (hashed n-grams + online logistic), `history`, or an LM critic backbone (a name,
a path or a hub id; the command line only). `warmup` trees, when given, fit the fresh predictor before its
first step, with prefixes at `prefix_share` of the examples, drawn from the `"warmup"` stream of the seed.

`settings` is a `trace_config.PredictorSettings` or the command line's predictor group: anything with `kind`
and `prefix_share`; an LM critic also reads `critic_lr` and `critic_epochs`, VIP's `gp_encoder`, where the
object has them (else the defaults below). Loading an LM critic's or MiniLM's weights is the one I/O here.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import ConfigError, MissingFileError
from ..seeding import derive_rng
from ..trace_config import METHODS, Method, check_predictor_kind
from .base import Predictor, training_examples

CRITIC_LR = 3e-3  # learning rate of an LM critic's head
CRITIC_EPOCHS = 4  # passes of an LM critic over each step's examples
GP_ENCODERS = ("all-minilm-l6-v2", "hashed")  # VIP's prompt embeddings: MiniLMEmbedder (upstream's), hashed


def _gp_embedder(settings: Any) -> Any:
    """VIP's prompt embedder of `settings.gp_encoder`; MiniLM's constructor finds its files and loads nothing."""
    from .embedders import HashedPromptEmbedder, MiniLMEmbedder

    if getattr(settings, "gp_encoder", GP_ENCODERS[0]) == "hashed":
        return HashedPromptEmbedder()
    try:
        return MiniLMEmbedder()
    except MissingFileError as err:
        raise ConfigError(f"predictor.gp_encoder: {err}; or predictor.gp_encoder=hashed (not VIP's)") from None


def probe_predictor(settings: Any, methods: Sequence[str]) -> None:
    """Once, before any work: if one of `methods` reads VIP's Gaussian process, its encoder can be built (one line
    naming predictor.gp_encoder otherwise), so a compare with `vip` among its methods never spends its other
    methods' runs before a missing package shows."""
    if any(m in METHODS and METHODS[m].predictor == "gp" for m in methods):
        _gp_embedder(settings)


def build_predictor(settings: Any, method: Method, seed: int, warmup: Sequence = ()) -> Predictor:
    """A fresh predictor for `method` (see the module docstring); a MiniLM that cannot load is one line."""
    from .history import RewardHistoryPredictor
    from .text import light_text_predictor

    if method.predictor == "history":
        pred = RewardHistoryPredictor()
    elif method.predictor == "gp":
        from .gp import GaussianProcessPredictor

        pred = GaussianProcessPredictor(_gp_embedder(settings))
    elif method.predictor == "oracle":
        raise ValueError(f"method {method.name}: the oracle predictor is the testbed's (exact V); no builder here")
    elif settings.kind == "light":
        pred = light_text_predictor(seed=seed)
    elif settings.kind == "history":
        pred = RewardHistoryPredictor()
    else:
        check_predictor_kind(settings.kind, "predictor.kind", critics=[settings.kind])
        from .lm_critic import LMCritic

        lr = getattr(settings, "critic_lr", CRITIC_LR)
        epochs = getattr(settings, "critic_epochs", CRITIC_EPOCHS)
        pred = LMCritic(settings.kind, lr=lr, epochs=epochs, seed=seed)
    if warmup:
        pred.update(*training_examples(list(warmup), settings.prefix_share, derive_rng(seed, "warmup")))
    return pred
