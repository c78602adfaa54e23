"""`trace-rl train policy.backend=vllm`: one step with generation in the REAL vLLM engine (vLLM's CPU build) and
the update in torch (skipped where vLLM does not import; runs in .venv-vllm).

The command builds its own engine on the tiny random Llama saved to a temporary folder. A spy on
`VLLMBackend.update_weights` checks the colocated loop: the trained model's weights are pushed into the engine
after the update (a full state dict, directly: no file, and the engine then samples a new weight version), and
the step's trees grew through vLLM.
"""

import json

import pytest

pytest.importorskip("vllm")

from trace_rl.backends.vllm import VLLMBackend  # noqa: E402
from trace_rl.cli import main  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402


def test_train_backend_vllm_runs_a_step_and_pushes_the_update(tmp_path, monkeypatch, capsys):
    # without the variable: policy.vllm.kv_cache_gb's default (1 GiB on CPU) lets the engine start
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    model, tok = create_tiny_model(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    pushed, generated = [], []
    update, agenerate = VLLMBackend.update_weights, VLLMBackend.agenerate

    def spy_update(self, state_dict=None):
        pushed.append(None if state_dict is None else len(state_dict))
        return update(self, state_dict)

    async def spy_generate(self, prompts, params, seeds=None, keys=None):
        gens = await agenerate(self, prompts, params, seeds=seeds, keys=keys)
        generated.append((self.weight_version, sum(len(g.token_ids) for g in gens)))
        return gens

    monkeypatch.setattr(VLLMBackend, "update_weights", spy_update)
    monkeypatch.setattr(VLLMBackend, "agenerate", spy_generate)
    run = tmp_path / "run"
    args = [
        f"policy.model={tmp_path / 'tiny'}",
        "policy.backend=vllm",
        "env.name=calculator",
        "budget.prompts=2",
        "budget.rollouts_per_prompt=2",
        "budget.pool_factor=2",
        "budget.max_per_prompt=2",
        "policy.max_new_tokens=12",
        "eval_tasks=2",
        "eval_samples=1",
        "steps=1",
        "seed=0",
        "progress=false",
        "logger=[jsonl]",
        f"out={run}",
    ]
    assert main(["train", *args]) == 0
    n_params = len(model.state_dict())
    # full state dicts: the build's sync of the starting weights, then one after the step's update
    assert pushed == [n_params, n_params]
    assert generated and sum(n for _, n in generated) > 0  # the step's trees grew through vLLM
    assert generated[0][0] == 1  # sampled after the build's sync, never from a stale version 0
    assert capsys.readouterr().err.count("vLLM weight sync: direct (") == 1  # both pushes direct, said once
    rec = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rec) == 1
