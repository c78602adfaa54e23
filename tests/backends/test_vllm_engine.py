"""VLLMBackend against the REAL vLLM engine (vLLM's CPU build, `vllm-cpu`; skipped where vLLM does not import).

Runs in .venv-vllm (scripts/install_vllm_env.sh). One engine serves the whole module (start-up is slow): the
project's tiny random Llama, saved to a temporary folder, float32, eager mode, the model's own 2048-token context
(multi-turn histories grow past 512), 32-token KV blocks and 1 GiB of KV cache (`VLLM_CPU_KVCACHE_SPACE`). The
engine core runs in a spawned process; pytest's own `__main__` is guarded, so the spawned child does not rerun
the test session.

Checks: the sampled tokens' log-probs agree with a float32 HF forward over the same tokens (temperature-scaled
log-softmax, the trainer's formula) on the same weights; a weight sync reaches the served model (changed
weights change the outputs, the prompt is prefilled again and its log-probs are those of the NEW weights, so
no KV of the old weights is served; restoring the weights restores the output); the sync is direct, writes no
file, and serves the same weights as the file path, bit for bit; rows of a TRACE step that
share a prompt hit vLLM's prefix cache. Figures (the gap, tokens/s, the hit rate) come from bench/gpu_check_vllm.py.
"""

import os
from pathlib import Path

import pytest

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default would take a share of the host memory

import numpy as np  # noqa: E402
import torch  # noqa: E402

from trace_rl.agent.react import ChatFormat  # noqa: E402
from trace_rl.backends import vllm_weights  # noqa: E402
from trace_rl.backends.base import SamplingParams  # noqa: E402
from trace_rl.backends.vllm import VLLMBackend  # noqa: E402
from trace_rl.envs.calculator import CalculatorEnv, make_tasks  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402
from trace_rl.methods import BudgetPlan, get_method  # noqa: E402
from trace_rl.predictors.text import light_text_predictor  # noqa: E402
from trace_rl.rollout.engine import TreeRolloutEngine  # noqa: E402
from trace_rl.rollout.lm_actor import LMActor  # noqa: E402

LOGPROB_TOL = 2e-3  # float32 on both sides; vLLM's CPU kernels sum in another order than torch's


def hf_logprobs(model, prompt, ids, temperature=1.0):
    """Per-token log-probs of `ids` after `prompt` under `model` (float32, temperature-scaled log-softmax)."""
    with torch.no_grad():
        full = torch.tensor([list(prompt) + list(ids)])
        logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1].float() / temperature
        return torch.log_softmax(logits, -1).gather(-1, full[0, len(prompt) :, None])[:, 0].numpy()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model, tok = create_tiny_model(seed=0)
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    backend = VLLMBackend.launch(
        str(path), tokenizer=tok, dtype="float32", seed=0, max_model_len=2048, enforce_eager=True, block_size=32
    )
    try:
        yield backend, model.eval(), tok
    finally:
        backend.close()


def probe_prompts(tok, n=4):
    fmt = ChatFormat(tok)
    return [fmt.prompt_ids(CalculatorEnv.system, t["question"]) for t in make_tasks(n, seed=3)]


def test_logprobs_agree_with_hf_on_the_same_weights(served):
    backend, model, tok = served
    prompts = probe_prompts(tok)
    for temperature in (1.0, 0.7):
        params = SamplingParams(temperature=temperature, max_new_tokens=24)
        gens = backend.generate(prompts, params, seeds=[1, 2, 3, 4])
        assert all(g.token_ids for g in gens)
        gap = max(
            float(np.abs(hf_logprobs(model, p, g.token_ids, temperature) - np.asarray(g.logprobs)).max())
            for p, g in zip(prompts, gens)
        )
        assert gap < LOGPROB_TOL, f"max |vLLM - HF| log-prob {gap:.2e} at temperature {temperature}"
    again = backend.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=24), seeds=[1, 2, 3, 4])
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]  # per-row seeds reproduce


def test_weight_sync_changes_outputs_and_serves_no_stale_kv(served):
    backend, model, tok = served
    prompt = probe_prompts(tok, 1)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    before = backend.generate(prompt, greedy, seed=0)[0]
    warm = backend.generate(prompt, params, seeds=[5])[0]
    assert warm.prefix_tokens_computed < len(prompt[0])  # the prompt's blocks are cached under the old weights

    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(7)
    changed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    version = backend.weight_version
    try:
        assert backend.update_weights(changed) == version + 1
        model.load_state_dict(changed)
        after = backend.generate(prompt, params, seeds=[5])[0]
        assert after.prefix_tokens_computed == len(prompt[0])  # the cache was reset: prefilled again
        gap = float(np.abs(hf_logprobs(model, prompt[0], after.token_ids) - np.asarray(after.logprobs)).max())
        assert gap < LOGPROB_TOL, f"log-probs after the sync are not the new weights' ({gap:.2e})"
        assert after.token_ids != warm.token_ids or after.logprobs != pytest.approx(warm.logprobs, abs=1e-3)
    finally:
        backend.update_weights(original)
        model.load_state_dict(original)
    assert backend.generate(prompt, greedy, seed=0)[0].token_ids == before.token_ids


def test_a_direct_push_writes_no_file_and_serves_what_the_file_path_serves(served, tmp_path, monkeypatch):
    """The default sync sends the tensors as collective_rpc arguments: no file is made (the file path's
    mkstemp is watched, and its folder stays empty), and the engine's log-probs of a seeded continuation are the
    HF policy's under the pushed weights; the file path, pushed the same weights, serves the same tokens and
    log-probs (the watch sees its one file: the check can fail)."""
    backend, model, tok = served
    made = []
    mkstemp = vllm_weights.tempfile.mkstemp
    monkeypatch.setattr(vllm_weights.tempfile, "mkstemp", lambda *a, **k: made.append(k) or mkstemp(*a, **k))
    monkeypatch.setattr(backend, "weights_dir", str(tmp_path))
    shm_before = sorted(p.name for p in Path("/dev/shm").glob("trace-rl-weights-*"))
    prompt = probe_prompts(tok, 1)
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(11)
    changed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    try:
        backend.update_weights(changed)
        assert backend.last_sync == "direct" and made == [] and list(tmp_path.iterdir()) == []
        assert sorted(p.name for p in Path("/dev/shm").glob("trace-rl-weights-*")) == shm_before
        model.load_state_dict(changed)
        direct = backend.generate(prompt, params, seeds=[9])[0]
        gap = float(np.abs(hf_logprobs(model, prompt[0], direct.token_ids) - np.asarray(direct.logprobs)).max())
        assert gap < LOGPROB_TOL, f"log-probs after a direct push are not the pushed weights' ({gap:.2e})"

        backend.update_weights(original)  # away, then the same weights again through the file
        monkeypatch.setattr(backend, "weight_sync", "file")
        backend.update_weights(changed)
        assert backend.last_sync == "file" and len(made) == 1 and list(tmp_path.iterdir()) == []
        through_file = backend.generate(prompt, params, seeds=[9])[0]
        assert through_file.token_ids == direct.token_ids and through_file.logprobs == direct.logprobs
    finally:
        monkeypatch.setattr(backend, "weight_sync", "direct")
        backend.update_weights(original)
        model.load_state_dict(original)


def test_a_trace_step_hits_the_prefix_cache(served):
    backend, _, _ = served
    backend.clear_cache()
    start = dict(backend.stats)
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)
    actor = LMActor(backend, CalculatorEnv, SamplingParams(temperature=1.0, max_new_tokens=24))
    res = TreeRolloutEngine(actor, light_text_predictor(seed=0), plan, seed=0).grow(
        make_tasks(plan.pool, seed=1), get_method("trace")
    )
    assert res.rollouts > 0 and res.generated_tokens > 0
    prompt_tokens = backend.stats["prompt_tokens"] - start["prompt_tokens"]
    cached = backend.stats["cached_prompt_tokens"] - start["cached_prompt_tokens"]
    assert 0 < cached < prompt_tokens  # siblings share their prompt's cached blocks; first visits prefill


def test_256_seeded_requests_of_200_tokens_run_and_reproduce(served):
    """The size that killed vllm-cpu 0.32.0's engine with chunked prefill on ('CPU Generator does not use
    offset': a seeded request whose prompt is split cannot resume): `launch` turns it off on CPU, and every row
    still carries its own seed, so a row samples the same tokens in another batch."""
    backend, _, tok = served
    rng = np.random.default_rng(0)
    vocab = [t for t in range(len(tok)) if t != tok.eos_token_id]
    prompts = [[int(t) for t in rng.choice(vocab, size=200)] for _ in range(256)]
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    gens = backend.generate(prompts, params, seeds=list(range(256)))
    assert len(gens) == 256 and all(g.token_ids for g in gens)
    again = backend.generate(prompts[::17], params, seeds=list(range(256))[::17])
    assert [g.token_ids for g in again] == [g.token_ids for g in gens[::17]]


def test_continuous_batching_overlaps_calls_and_grows_round_batchings_trees(served):
    """engine.batching=continuous on the real engine: every episode's turn is its own request, in flight at once;
    each row carries its seed, so the trees hold round batching's tokens, node for node."""
    backend, _, _ = served
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)
    tasks = make_tasks(plan.pool, seed=2)
    grown = {}
    for batching in ("round", "continuous"):
        backend.clear_cache()
        actor = LMActor(backend, CalculatorEnv, SamplingParams(temperature=1.0, max_new_tokens=24), batching=batching)
        res = TreeRolloutEngine(actor, light_text_predictor(seed=0), plan, seed=0).grow(tasks, get_method("trace"))
        grown[batching] = [[(n.node_id, n.token_ids) for n in t.turns()] for t in res.trees]
        assert res.generated_tokens > 0 and res.time["generate"] <= res.time["total"]
    assert grown["continuous"] == grown["round"]
