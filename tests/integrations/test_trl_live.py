"""One GRPO step of TRL's real trainer on a tiny CPU model with TRACE rollouts (skipped where TRL is missing).

Generation is scripted (a calculator agent that errs on purpose) so rewards are mixed and trees branch; the
policy that TRL trains is a tiny random Llama on the same byte tokenizer, so TRL's own forward passes, loss and
optimiser step run for real. The check: the advantages TRL's loss receives are the tree advantages, per token.
"""

import json

import numpy as np
import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from helpers_calc import scripted_calc  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from trace_rl.backends.base import SamplingParams, ScriptedBackend  # noqa: E402
from trace_rl.envs.calculator import CalculatorEnv, make_tasks  # noqa: E402
from trace_rl.integrations.trl import TraceGRPOTrainer, TraceRolloutFunc, tree_reward  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402


def _setup(tmp_path, trainer_cls=TraceGRPOTrainer):
    model, tok = create_tiny_model(tokenizer="byte", hidden=32, layers=2, heads=2)
    backend = ScriptedBackend(tok, lambda text, i: scripted_calc(text, i, wrong_every=3))
    fn = TraceRolloutFunc(
        CalculatorEnv,
        backend=backend,
        task_from_prompt=json.loads,
        method="trace",
        params=SamplingParams(max_new_tokens=48),
    )
    data = Dataset.from_dict({"prompt": [json.dumps(t) for t in make_tasks(8, seed=2, steps=(2, 3))]})
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_steps=1,
        learning_rate=1e-3,
        loss_type="dapo",
        beta=0.0,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        bf16=False,
        max_completion_length=512,
        disable_tqdm=True,
    )
    return (
        trainer_cls(
            model=model,
            reward_funcs=[tree_reward],
            args=args,
            train_dataset=data,
            processing_class=tok,
            rollout_func=fn,
        ),
        fn,
        model,
    )


def test_one_step_trains_on_the_tree_advantages(tmp_path):
    trainer, fn, model = _setup(tmp_path)
    seen = []
    compute_loss = trainer._compute_loss

    def spy(model_, inputs):
        seen.append({k: inputs[k].detach().clone() for k in ("advantages", "completion_ids", "completion_mask")})
        return compute_loss(model_, inputs)

    trainer._compute_loss = spy
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert seen, "the loss never ran"
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters())), "no parameter moved"
    # TRL shuffles rows before the loss: match each row to ours by its completion tokens
    ours = {}
    for row, adv in zip(fn.last_rows, fn.last_advantages):
        if row is not None:
            ours.setdefault(tuple(row.completion_ids), []).append(adv)
    got_rows = 0
    for batch in seen:
        for adv, ids, mask in zip(batch["advantages"], batch["completion_ids"], batch["completion_mask"]):
            n = int(mask.sum())
            key = tuple(ids[:n].tolist())
            if key not in ours:  # a filler row: mask 0 in TRL's tool mask, zero advantage
                assert not adv.any()
                continue
            got_rows += 1
            assert adv.dim() == 1 and any(np.allclose(adv[:n].numpy(), a, atol=1e-6) for a in ours[key])
            assert not adv[n:].any()
    assert got_rows == sum(r is not None for r in fn.last_rows)
    assert any(r is not None and min(r.weights) < 1 for r in fn.last_rows)  # shared prefixes were split


def test_the_plain_trainer_is_refused(tmp_path):
    trainer, _, _ = _setup(tmp_path, trainer_cls=GRPOTrainer)
    with pytest.raises(TypeError, match="TraceGRPOTrainer"):
        trainer.train()
