"""vLLM's GPU share from the model's and the trainer's sizes (backends/vllm_memory.py): the arithmetic, the refusal,
and the figure a real model's sizes give."""

import pytest

from trace_rl.backends import vllm_memory as vm

GIB = 2**30


def test_an_fp32_adamw_trainer_costs_20_bytes_a_parameter_and_lora_far_less():
    assert vm.trainer_bytes(10, 10) == 10 * (4 + 4 + 8 + 4)
    assert vm.trainer_bytes(10, 10, step_copy=False) == 10 * 16  # the 16 B: weights, gradients, AdamW
    assert vm.trainer_bytes(100, 2) == 400 + 2 * 16  # LoRA: frozen base weights, adapters trained
    assert vm.trainer_bytes(10, 10, reference_params=10, activations=7) == 200 + 40 + 7
    with pytest.raises(ValueError, match="trainable <= params"):
        vm.trainer_bytes(10, 11)


def test_the_engine_gets_what_the_trainer_and_the_reserve_leave():
    total = 80 * GIB
    engine_min = vm.engine_min_bytes(500_000_000, "bfloat16")  # 1 GB of weights + KV minimum + overhead
    assert engine_min == 10**9 + 2 * GIB
    share = vm.engine_share(total, trainer=20 * GIB, engine_min=engine_min)
    assert share == int((80 - 20 - 2) / 80 * 100) / 100 == 0.72
    assert vm.engine_share(total, trainer=0, engine_min=engine_min) == vm.CAP  # never above vLLM's own default


def test_a_trainer_that_leaves_the_engine_too_little_is_one_line():
    # 3B parameters in fp32 with AdamW and the bound's copy: 55.9 GiB before activations, over the 40 GiB the old
    # fixed half left the trainer on an 80 GiB GPU; computed, the engine gets the 0.27 that is left
    three = vm.trainer_bytes(3 * 10**9, 3 * 10**9)
    assert vm.engine_share(80 * GIB, three, vm.engine_min_bytes(3 * 10**9, "bfloat16")) == 0.27
    four = vm.trainer_bytes(4 * 10**9, 4 * 10**9)  # 74.5 GiB: the engine's 9.5 GiB minimum no longer fits
    with pytest.raises(ValueError) as err:
        vm.engine_share(80 * GIB, four, vm.engine_min_bytes(4 * 10**9, "bfloat16"))
    line = str(err.value)
    assert line.startswith("policy.vllm.gpu_memory_utilization: the trainer needs 74.5 GiB") and "\n" not in line
    assert "update.lora_rank" in line
    lora = vm.trainer_bytes(4 * 10**9, 20_000_000)  # LoRA adapters of a 4B model: the engine fits again
    assert vm.engine_share(80 * GIB, lora, vm.engine_min_bytes(4 * 10**9, "bfloat16")) == 0.78


def test_activations_and_a_real_models_footprint():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from trace_rl.lm.models import create_tiny_model

    assert vm.activation_bytes(4096, 896, 24, 151936) == 4096 * (64 * 896 * 24 + 12 * 151936)  # Qwen2.5-0.5B: 13 GB
    model, _ = create_tiny_model(seed=0)
    params = sum(p.numel() for p in model.parameters())
    assert vm.model_sizes(model) == (params, params)
    cfg = model.config
    acts = vm.activation_bytes(4096, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size)
    assert vm.trainer_footprint(model, micro_batch_tokens=4096) == 20 * params + acts
    model.model.embed_tokens.weight.requires_grad_(False)  # frozen weights keep no gradient or AdamW state
    frozen = model.model.embed_tokens.weight.numel()
    assert vm.trainer_footprint(model, model, step_copy=False) == 16 * params - 12 * frozen + 4 * params + acts
    assert isinstance(torch.zeros(1), torch.Tensor)


def test_engine_min_refuses_an_unknown_dtype_and_a_zero_gpu():
    with pytest.raises(ValueError, match="dtype must be one of"):
        vm.engine_min_bytes(1, "int8")
    with pytest.raises(ValueError, match="total GPU memory"):
        vm.engine_share(0, 0, 1)
