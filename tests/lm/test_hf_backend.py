import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.lm.backend import SamplingParams  # noqa: E402
from trace_rl.lm.hf_backend import HFBackend  # noqa: E402
from trace_rl.lm.models import create_tiny_model, load_model  # noqa: E402


@pytest.fixture(scope="module")
def backend():
    model, tok = create_tiny_model(hidden=32, layers=2, heads=2)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6)  # a random model with peaked, varied outputs
    return HFBackend(model, tok)


def full_logprobs(backend, prompt, gen):
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        lp = torch.log_softmax(backend.model(ids).logits[0].float(), -1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(gen.token_ids)]


def test_batched_shared_prefix_sampling_matches_a_plain_forward(backend):
    tok = backend.tokenizer
    a = tok("a shared prompt prefix, then", add_special_tokens=False).input_ids
    prompts = [a, a + tok(" more words", add_special_tokens=False).input_ids, a[:10] + [65, 66]]
    gens = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=10), seed=0)
    for p, g in zip(prompts, gens):
        assert len(g.token_ids) == len(g.logprobs) > 0
        assert max(abs(x - y) for x, y in zip(full_logprobs(backend, p, g), g.logprobs)) < 1e-3


def test_k_continuations_prefill_the_prefix_once_and_reuse_it(backend):
    tok = backend.tokenizer
    backend.clear_cache()
    prefix = tok("x" * 120, add_special_tokens=False).input_ids
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    first = backend.generate([prefix] * 4, params, seed=1)
    assert first[0].prefix_tokens_computed == len(prefix)  # once, not 4 times
    again = backend.generate([prefix] * 4, params, seed=1)
    assert again[0].prefix_tokens_computed == 0  # served from the prefix cache
    assert [g.token_ids for g in again] == [g.token_ids for g in first]  # one seed, one result
    longer = prefix + tok(" and on", add_special_tokens=False).input_ids
    g = backend.generate([longer] * 2, params, seed=2)[0]
    assert g.prefix_tokens_computed == len(longer) - len(prefix)
    assert max(abs(x - y) for x, y in zip(full_logprobs(backend, longer, g), g.logprobs)) < 1e-3


def test_stop_strings_greedy_and_length(backend):
    tok = backend.tokenizer
    p = tok("hello", add_special_tokens=False).input_ids
    g1 = backend.generate([p], SamplingParams(temperature=0, max_new_tokens=5))[0]
    g2 = backend.generate([p], SamplingParams(temperature=0, max_new_tokens=5))[0]
    assert g1.token_ids == g2.token_ids and g1.stop_reason in ("length", "stop")
    text = g1.text
    if text:
        stop = text[0]
        g3 = backend.generate([p], SamplingParams(temperature=0, max_new_tokens=5, stop=(stop,)))[0]
        assert g3.stop_reason == "stop" and len(g3.token_ids) <= len(g1.token_ids)


def test_bad_inputs_are_clear_errors(backend):
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="at least one token"):
        backend.generate([[]], SamplingParams())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model("./no/such/model")


def test_copies_of_distinct_prompts_in_one_call_are_encoded_once(backend):
    # the engine batches the continuations of several anchors together: each anchor's history is encoded once
    tok = backend.tokenizer
    backend.clear_cache()
    shared = tok("a system prompt and a question", add_special_tokens=False).input_ids
    a = shared + tok(" then turn one", add_special_tokens=False).input_ids
    b = shared + tok(" then another turn", add_special_tokens=False).input_ids
    prompts = [a, b, a, a, b]
    gens = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8), seed=3)
    lcp = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert lcp >= len(shared)
    assert gens[0].prefix_tokens_computed == len(a) + len(b) - lcp  # not three of a's suffix and two of b's
    for p, g in zip(prompts, gens):
        assert max(abs(x - y) for x, y in zip(full_logprobs(backend, p, g), g.logprobs)) < 1e-3
    assert len({tuple(g.token_ids) for g in gens}) > 1  # copies still sample independently
