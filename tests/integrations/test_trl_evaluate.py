"""TRL's `trainer.evaluate()` with a `TraceRolloutFunc`: plain evaluation (skipped where TRL is missing).

Eval prompts must neither grow trees (no allocation, no branching) nor train the predictor: the check runs TRL's
real evaluation loop on a tiny random Llama with a scripted calculator agent, then looks at what the rollout
function did: G bare rollouts per eval prompt, no continuation, the predictor's update never called and its
predictions unchanged. A training step afterwards still grows trees (the switch follows the model's mode).
"""

import copy
import json

import numpy as np
import pytest

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from helpers_calc import scripted_calc  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from trace_rl.backends.base import SamplingParams, ScriptedBackend  # noqa: E402
from trace_rl.envs.calculator import CalculatorEnv, make_tasks  # noqa: E402
from trace_rl.integrations.trl import TraceGRPOTrainer, TraceRolloutFunc, tree_reward  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402

G = 4


def _trainer(tmp_path):
    model, tok = create_tiny_model(tokenizer="byte", hidden=32, layers=2, heads=2)
    backend = ScriptedBackend(tok, lambda text, i: scripted_calc(text, i, wrong_every=3))
    fn = TraceRolloutFunc(
        CalculatorEnv, backend=backend, task_from_prompt=json.loads, params=SamplingParams(max_new_tokens=48)
    )
    train = Dataset.from_dict({"prompt": [json.dumps(t) for t in make_tasks(8, seed=2, steps=(2, 3))]})
    evals = Dataset.from_dict({"prompt": [json.dumps(t) for t in make_tasks(4, seed=7, steps=(2, 3))]})
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        num_generations=G,
        num_generations_eval=G,
        max_steps=1,
        learning_rate=1e-3,
        loss_type="dapo",
        beta=0.0,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        bf16=False,
        max_completion_length=512,
        disable_tqdm=True,
    )
    trainer = TraceGRPOTrainer(
        model=model,
        reward_funcs=[tree_reward],
        args=args,
        train_dataset=train,
        eval_dataset=evals,
        processing_class=tok,
        rollout_func=fn,
    )
    return trainer, fn


def test_evaluate_is_plain_evaluation(tmp_path):
    trainer, fn = _trainer(tmp_path)
    updates = []
    update = fn.predictor.update
    fn.predictor.update = lambda *a, **k: updates.append(1) or update(*a, **k)
    snapshot = copy.deepcopy(fn.predictor)

    metrics = trainer.evaluate()

    assert "eval_loss" in metrics
    res = fn.last_result
    assert res is not None and res.method == "grpo"
    assert res.continuations == 0 and res.bare_rollouts == res.rollouts
    assert sorted(len(t.leaves()) for t in res.active) == [G] * len(res.active)
    assert all(r is not None for r in fn.last_rows)  # G x prompts leaves: no filler row
    assert not updates, "evaluation trained the predictor"
    roots = [(t, t.root_id) for t in res.active]
    assert np.array_equal(fn.predictor.predict(roots), snapshot.predict(roots))

    trainer.train()  # the model is back in training mode: TRACE trees again, and the predictor learns
    assert fn.last_result.method == "trace"
    assert updates
