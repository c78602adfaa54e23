"""The one predictor builder: the V~ a method reads, from TRACE's predictor settings, for every entry point
(the command line's `rollout`, `train`, `compare`, verl's processes, TRL's rollout function).

The method decides first: a method with its own V~ (`Method.predictor`: Knapsack RL's reward history, VIP's
Gaussian process) reads it; every other method reads `kind`: a registered predictor (`registry.PREDICTORS`:
`light`, hashed n-grams + online logistic, `history`, or one's own by name or module:attr), else an LM critic
backbone (a name, a path or a hub id; the command line only). `warmup` trees, when given, fit the fresh
predictor before its first step, with prefixes at `prefix_share` of the examples, drawn from the `"warmup"` stream
of the seed.

`settings` is a `trace_config.PredictorSettings` or the command line's predictor group: anything with `kind`
and `prefix_share`; `light` and an LM critic read `lr` (None: their own default), an LM critic also
`critic_epochs`, VIP's `gp_encoder`, where the object has them (else the defaults below). Loading an LM
critic's or MiniLM's weights is the one I/O here.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import ConfigError, MissingFileError
from ..registry import PREDICTORS, call
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


def probe_gp(settings: Any) -> None:
    """VIP's encoder can be built (one line naming predictor.gp_encoder otherwise)."""
    _gp_embedder(settings)


def probe_predictor(settings: Any, methods: Sequence[str]) -> None:
    """Once, before any work: each of `methods` whose own V~ has a probe (VIP's Gaussian process: its encoder can be
    built) runs it, so a compare with `vip` among its methods never spends its other methods' runs before a missing
    package shows. A name that is not a method is left to the command's own check."""
    for name in methods:
        if name in METHODS and (own := METHODS[name].own_predictor) is not None and own.probe is not None:
            call(own.probe, settings)


# ---- what registry.PREDICTORS names as each entry's LM builder: (settings, seed) -> V~


def build_light(settings: Any, seed: int) -> Predictor:
    from .text import light_text_predictor

    lr = getattr(settings, "lr", None)  # None: light's own (0.3)
    return light_text_predictor(seed=seed) if lr is None else light_text_predictor(lr=lr, seed=seed)


def build_history(settings: Any, seed: int) -> Predictor:
    from .history import RewardHistoryPredictor

    return RewardHistoryPredictor()


def build_gp(settings: Any, seed: int) -> Predictor:
    from .gp import GaussianProcessPredictor

    return GaussianProcessPredictor(_gp_embedder(settings))


def build_critic(settings: Any, seed: int) -> Predictor:
    """An LM critic on the backbone `settings.kind` (a name, a path or a hub id)."""
    check_predictor_kind(settings.kind, "predictor.kind", critics=[settings.kind])
    from .lm_critic import LMCritic

    lr = getattr(settings, "lr", None) or CRITIC_LR
    epochs = getattr(settings, "critic_epochs", CRITIC_EPOCHS)
    return LMCritic(settings.kind, lr=lr, epochs=epochs, seed=seed)


def build_predictor(settings: Any, method: Method, seed: int, warmup: Sequence = ()) -> Predictor:
    """A fresh predictor for `method` (see the module docstring); a MiniLM that cannot load is one line."""
    entry = method.own_predictor
    if entry is None and settings.kind in PREDICTORS:  # a registered kind, or module:attr of one's own
        entry = PREDICTORS[settings.kind]
    if entry is None:
        pred = build_critic(settings, seed)
    elif entry.build is None:
        raise ValueError(f"method {method.name}: the predictor {entry.name} has no builder on LM agents")
    else:
        pred = call(entry.build, settings, seed)
    if warmup:
        pred.update(*training_examples(list(warmup), settings.prefix_share, derive_rng(seed, "warmup")))
    return pred
