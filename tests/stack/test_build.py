"""`build_stack`, the one builder of the LM commands' stack, on the random tiny model: it loads the model a
command trains (prepared before anything else loads) and its frozen reference, and its engines both grow a
step's trees and evaluate."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.envs.registry import get_env  # noqa: E402
from trace_rl.methods import METHODS, BudgetPlan  # noqa: E402
from trace_rl.predictors.build import build_predictor  # noqa: E402
from trace_rl.rollout.engine import LocalExecutor  # noqa: E402
from trace_rl.stack.build import build_stack  # noqa: E402
from trace_rl.stack.config import EngineConfig, LMPolicyConfig, LMPredictorConfig  # noqa: E402
from trace_rl.trace_config import TraceConfig  # noqa: E402

POLICY = LMPolicyConfig(model="random-tiny", max_new_tokens=8)


def test_a_trained_stack_prepares_its_model_before_the_reference_and_the_backend(monkeypatch):
    import torch

    import trace_rl.lm.models as models

    order = []
    real = models.load_model
    monkeypatch.setattr(models, "load_model", lambda *a, **k: order.append("load") or real(*a, **k))

    def prepare(model):
        order.append("prepare")
        with torch.no_grad():  # what a resumed checkpoint does: the backend must sample these weights
            next(model.parameters()).add_(1.0)

    spec = get_env("calculator")
    stack = build_stack(POLICY, spec, seed=3, train=True, reference=True, prepare=prepare, dtype="float32")
    assert order == ["load", "prepare", "load"]
    assert stack.backend.model is stack.model  # hf samples the very model the command updates
    ref = stack.ref_model
    assert ref is not stack.model and not any(p.requires_grad for p in ref.parameters()) and not ref.training
    assert not torch.equal(next(ref.parameters()), next(stack.model.parameters()))  # the start, not the prepared
    assert isinstance(stack.executor, LocalExecutor) and stack.params.max_new_tokens == 8
    stack.close()


def test_its_engines_grow_trees_and_evaluate_each_on_a_fresh_actor():
    spec = get_env("calculator")
    stack = build_stack(POLICY, spec, EngineConfig(env_workers=2), seed=1)
    assert stack.model is None  # nothing trains here: the backend loaded the policy itself
    plain = stack.engine()
    run = plain.evaluate(spec.held_out(2, 0), samples=2)
    assert [len(run.rollouts(i)) for i in range(2)] == [2, 2]
    method = METHODS["grpo"]
    predictor = build_predictor(LMPredictorConfig().settings(), method, 1)
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=2, pool_factor=1)
    grower = stack.engine(predictor, TraceConfig("grpo"), plan=plan)
    assert grower.actor is not plain.actor and grower.actor.env_workers == 2 and grower.seed == 1
    result = grower.grow(spec.train(2, 0), method, 0)
    assert result.rollouts == 4
    stack.close()
