import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.backends.base import SamplingParams  # noqa: E402
from trace_rl.backends.hf import HFBackend  # noqa: E402
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
    assert sum(g.prefix_tokens_computed for g in first) == len(prefix)  # a sum over rows is the call's prefill
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
    with pytest.raises(FileNotFoundError, match="existing path"):
        load_model("./no/such/model")


def test_a_hub_id_is_passed_to_transformers_not_rejected_as_a_path(monkeypatch):
    from trace_rl.lm import models

    assert models.resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(FileNotFoundError, match="existing path"):
        models.resolve_model_path("no/such/deep/path")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never download in tests: the hub id reaches from_pretrained
    with pytest.raises(FileNotFoundError, match="cannot load model 'org-that-is-not/cached-anywhere'"):
        load_model("org-that-is-not/cached-anywhere")


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


def test_next_turn_encodes_only_new_tokens_and_matches_a_plain_forward(backend):
    # an episode's next prompt extends its last prompt and generation: only the new tokens are encoded
    tok = backend.tokenizer
    backend.clear_cache()
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    prompts = [tok(f"question {i}: compute things", add_special_tokens=False).input_ids for i in range(3)]
    gens = backend.generate(prompts, params, seed=4)
    obs = tok(" observation", add_special_tokens=False).input_ids
    fresh = tok("an unrelated new prompt", add_special_tokens=False).input_ids
    turn2 = [p + g.token_ids + obs for p, g in zip(prompts, gens)] + [fresh]
    gens2 = backend.generate(turn2, params, seed=5)
    unfed = sum(g.stop_reason == "stop" for g in gens)  # a row's stopping token was never fed
    assert gens2[0].prefix_tokens_computed == 3 * len(obs) + unfed + len(fresh)
    for p, g in zip(turn2, gens2):
        assert max(abs(x - y) for x, y in zip(full_logprobs(backend, p, g), g.logprobs)) < 1e-3
    # a continuation from an earlier turn's prefix (stage 2 forks there) reuses it too
    fork = prompts[1] + gens[1].token_ids + tok(" other", add_special_tokens=False).input_ids
    g = backend.generate([fork] * 2, params, seed=6)[0]
    assert g.prefix_tokens_computed == len(fork) - len(prompts[1]) - len(gens[1].token_ids) + (
        gens[1].stop_reason == "stop"
    )
    assert max(abs(x - y) for x, y in zip(full_logprobs(backend, fork, g), g.logprobs)) < 1e-3


def test_row_cache_stays_within_its_byte_budget(backend):
    small = HFBackend(backend.model, backend.tokenizer, row_cache_bytes=20_000)
    prompts = [backend.tokenizer(f"prompt number {i}", add_special_tokens=False).input_ids for i in range(6)]
    gens = small.generate(prompts, SamplingParams(max_new_tokens=5), seed=0)
    assert 0 < small._row_bytes <= 20_000 and len(small._rows) < 6
    again = small.generate([p + g.token_ids for p, g in zip(prompts, gens)], SamplingParams(max_new_tokens=5), seed=1)
    for p, g0, g in zip(prompts, gens, again):
        assert max(abs(x - y) for x, y in zip(full_logprobs(small, p + g0.token_ids, g), g.logprobs)) < 1e-3


def test_prefix_hashes_match_the_rolling_definition():
    seq = [3, 0, 49_999, 7] * 300
    ref, h = [], 0
    for t in seq:
        h = (h * 1_000_003 + t + 1) % 2**64
        ref.append(h)
    assert [int(x) for x in HFBackend._hashes(seq)] == ref


def test_no_cached_kv_of_old_weights_is_served_after_a_weight_update():
    model, tok = create_tiny_model(hidden=32, layers=2, heads=2, seed=5)
    backend = HFBackend(model, tok)
    prompt = tok("a prompt the caches will hold", add_special_tokens=False).input_ids
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    first = backend.generate([prompt] * 2, params, seeds=[1, 2])
    backend.generate([prompt + first[0].token_ids], params, seeds=[3])  # fills the per-row cache too
    version = backend.weight_version
    new = {k: v * 1.5 for k, v in model.state_dict().items()}
    assert backend.update_weights(new) == version + 1
    after = backend.generate([prompt] * 2, params, seeds=[1, 2])
    again = backend.generate([prompt + after[0].token_ids], params, seeds=[3])
    fresh_model, _ = create_tiny_model(hidden=32, layers=2, heads=2, seed=5)
    fresh_model.load_state_dict(new)
    fresh = HFBackend(fresh_model, tok)
    ref = fresh.generate([prompt] * 2, params, seeds=[1, 2])
    ref_again = fresh.generate([prompt + ref[0].token_ids], params, seeds=[3])
    for a, b in zip(after + again, ref + ref_again):
        assert a.token_ids == b.token_ids
        assert np.allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert after[0].logprobs != first[0].logprobs  # the new weights are in use
    assert all(key[0] == backend.weight_version for key in backend._rows)
    assert all(key[0] == backend.weight_version for key in backend._prefix_cache)


def test_a_row_samples_the_same_tokens_in_any_batch(backend):
    tok = backend.tokenizer
    a = tok("first prompt here", add_special_tokens=False).input_ids
    b = tok("another, longer prompt for the batch", add_special_tokens=False).input_ids
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    alone = backend.generate([a], params, seeds=[42])[0]
    backend.invalidate()
    batched = backend.generate([b, a, b], params, seeds=[7, 42, 9])[1]
    assert alone.token_ids == batched.token_ids


def test_a_dropped_cache_keyword_fails_loudly_instead_of_sampling_without_context():
    # what transformers before 5.24 did with `cache=`: swallowed it, so every step saw only its own token
    model, tok = create_tiny_model(hidden=32, layers=2, heads=2)
    backend = HFBackend(model, tok)
    assert backend._cache_kw in ("cache", "past_key_values")
    backend._cache_kw = "a_keyword_the_model_swallows"
    with pytest.raises(RuntimeError, match="LlamaForCausalLM ignored the KV cache"):
        backend.generate([tok("a prompt", add_special_tokens=False).input_ids], SamplingParams(max_new_tokens=3))
