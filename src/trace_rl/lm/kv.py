"""How a KV cache is handed to a transformers model, on every transformers 5 the project accepts.

transformers 5.24 renamed the forward keyword `past_key_values` to `cache` (keeping `past_key_values` as an alias that
raises a FutureWarning and is to be removed in 5.40). Up to 5.23 forward takes only `past_key_values`, and it
swallows unknown keywords in `**kwargs`: a `cache=` there is dropped without a word, the model attends to nothing but
the tokens it is fed, and every cached continuation is wrong. So the keyword is read from the model's own forward
signature, and the first cached forward of each caller is checked to have grown the cache, so that a future rename
fails loudly too.
"""

from __future__ import annotations

import inspect

_KEYWORDS = ("cache", "past_key_values")  # the newer name first, should a forward ever list both
_found: dict[type, str] = {}


def _inner(model):
    """The model a wrapper forwards to (peft's PeftModel, DDP/accelerate's .module, torch.compile's _orig_mod)."""
    if hasattr(model, "get_base_model"):
        return model.get_base_model()
    for attr in ("module", "_orig_mod"):
        inner = getattr(model, attr, None)
        if inner is not None and inner is not model:
            return inner
    return None


def cache_keyword(model) -> str:
    """The keyword under which `model.forward` takes a KV cache: 'cache' (transformers >= 5.24) or
    'past_key_values' (earlier). Raises TypeError for a model whose forward (or a wrapped model's) takes neither."""
    seen, m = [], model
    while m is not None and len(seen) < 4:
        if type(m) in _found:
            return _found[type(m)]
        params = inspect.signature(m.forward).parameters
        for name in _KEYWORDS:
            if name in params:
                _found[type(m)] = name
                return name
        seen.append(type(m).__name__)
        m = _inner(m)
    raise TypeError(f"{' -> '.join(seen)}.forward takes no KV cache (neither `cache` nor `past_key_values`)")


def check_cache_grew(model, cache, before: int, fed: int) -> None:
    """Raise if a forward that was fed `fed` tokens with `cache` (holding `before` tokens) did not add them to it:
    the model ignored the cache (a keyword it silently drops), so every later token would see no context."""
    after = cache.get_seq_length()
    if after != before + fed:
        import transformers

        raise RuntimeError(
            f"{type(model).__name__} ignored the KV cache passed as `{cache_keyword(model)}=` under transformers "
            f"{transformers.__version__} (it holds {after} tokens, expected {before} + {fed}): this transformers "
            "version passes caches under another keyword; please report it"
        )
