import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402

from trace_rl.lm.kv import cache_keyword, check_cache_grew  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def model():
    model, _ = create_tiny_model(hidden=32, layers=2, heads=2)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6)  # peaked outputs: a continuation that lost its context is far off, not within noise
    return model.eval()


def test_a_continuation_fed_through_the_cache_matches_a_plain_forward(model):
    # transformers before 5.24 silently drops a `cache=` keyword (and 5.24 reads only that name without a warning):
    # the continuation then sees none of the prefix and its log-probs are far from the whole sequence's
    ids = torch.randint(3, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = torch.log_softmax(model(ids).logits[0, 15:], -1)
        cache, kw = DynamicCache(), cache_keyword(model)
        model(input_ids=ids[:, :16], use_cache=True, **{kw: cache})
        check_cache_grew(model, cache, 0, 16)
        tail = model(input_ids=ids[:, 16:], position_ids=torch.arange(16, 24)[None], use_cache=True, **{kw: cache})
        check_cache_grew(model, cache, 16, 8)
    cont = torch.log_softmax(tail.logits[0], -1)
    assert torch.allclose(cont, whole[1:], atol=1e-4)


def test_a_model_that_ignored_the_cache_is_caught(model):
    ids = torch.randint(3, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, use_cache=True)  # what a dropped keyword amounts to: the model never sees `cache`
    with pytest.raises(RuntimeError, match="ignored the KV cache passed as `(cache|past_key_values)=`"):
        check_cache_grew(model, cache, 0, 8)


def test_wrappers_are_looked_through_and_a_forward_without_a_cache_is_refused(model):
    class Wrapper(torch.nn.Module):  # like DDP or accelerate: forward(*args, **kwargs) hides the real signature
        def __init__(self, inner):
            super().__init__()
            self.module = inner

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    assert cache_keyword(Wrapper(model)) == cache_keyword(model) in ("cache", "past_key_values")

    class NoCache(torch.nn.Module):
        def forward(self, input_ids, **kwargs):
            return input_ids

    with pytest.raises(TypeError, match=r"NoCache.forward takes no KV cache \(neither `cache` nor `past_key_values`\)"):
        cache_keyword(NoCache())
