"""TraceRolloutFunc against TRL 1.16's rollout_func contract, with a minimal stand-in for the trainer (no TRL
needed): repeated prompts in, one row per received prompt out, per-token tree advantages on the side."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("transformers")

from helpers_calc import scripted_calc  # noqa: E402

from trace_rl.backends.base import SamplingParams, ScriptedBackend  # noqa: E402
from trace_rl.envs.calculator import CalculatorEnv, make_tasks  # noqa: E402
from trace_rl.integrations.rows import batch_rows  # noqa: E402
from trace_rl.integrations.trl.rollout import REQUIRED, TraceRolloutFunc, tree_reward  # noqa: E402
from trace_rl.lm.tokenizer import byte_tokenizer  # noqa: E402


def stand_in(g: int = 4, accepts: bool = True):
    """What the rollout function reads from GRPOTrainer: group size, mode, step, and the subclass marker."""
    return SimpleNamespace(
        num_generations=g,
        num_generations_eval=1,
        model=SimpleNamespace(training=True),
        state=SimpleNamespace(global_step=0),
        accepts_token_advantages=accepts,
    )


def rollout_func(method="trace", **kw):
    tok = byte_tokenizer()
    backend = ScriptedBackend(tok, lambda text, i: scripted_calc(text, i, wrong_every=3))
    return TraceRolloutFunc(
        CalculatorEnv,
        backend=backend,
        task_from_prompt=json.loads,
        method=method,
        params=SamplingParams(max_new_tokens=64),
        **kw,
    )


def prompts(count: int, g: int) -> list[str]:
    return [json.dumps(t) for t in make_tasks(count, seed=1, steps=(2, 3)) for _ in range(g)]


@pytest.mark.parametrize("method,weighting", [("trace", "first"), ("trace", "split"), ("grpo", "first")])
def test_one_row_per_received_prompt_with_the_leaves_and_their_tree_advantages(method, weighting):
    fn = rollout_func(method, weighting=weighting)
    out = fn(prompts(4, 4), stand_in(4))
    assert set(REQUIRED) <= set(out) and "env_mask" in out
    assert all(len(v) == 16 for v in out.values())
    for ids, lp, mask in zip(out["completion_ids"], out["logprobs"], out["env_mask"]):
        assert len(ids) == len(lp) == len(mask) > 0
    real = [r for r in fn.last_rows if r is not None]
    assert len(real) + fn.last_result.unspent_prefix_budget == 16
    want = batch_rows(fn.last_result.active, get_adv(method), weighting)
    assert [r.leaf_id for r in real] == [w.leaf_id for w in want]
    for adv, row, mask in zip(fn.last_advantages, fn.last_rows, out["env_mask"]):
        if row is None:  # filler: nothing to learn
            assert not any(mask) and not any(adv)
        else:
            assert adv == row.weighted_advantages and mask == row.loss_mask
    assert tree_reward(out["completion_ids"], out["trace_reward"]) == [float(r) for r in out["trace_reward"]]
    rewards = [r for r, row in zip(out["trace_reward"], fn.last_rows) if row]
    assert set(rewards) <= {0.0, 1.0}
    if method == "trace":  # a shared prefix counts once: 1/k on each copy (split), or all on its first (first)
        assert any(r.weights[0] < 1 for r in real)
        assert any(r.weights[0] == 0 for r in real) == (weighting == "first")


def get_adv(method):
    from trace_rl.methods import get_method

    return get_method(method).advantage


def test_a_policy_trained_on_the_rows_moves_towards_the_successful_leaves():
    """A few steps of the loss TRL's `dapo` loss reduces to at ratio 1 (-sum of advantage x log-prob over the
    env-masked tokens / their count), on exactly the rows and advantages the rollout function hands TRL: the
    loss falls and the policy's log-prob margin of reward-1 completions over reward-0 ones rises."""
    torch = pytest.importorskip("torch")
    from trace_rl.lm.models import create_tiny_model

    fn = rollout_func()
    out = fn(prompts(4, 4), stand_in(4))
    assert fn.last_result.predictor_loss is not None  # the predictor was updated in this process too
    keep = [i for i, row in enumerate(fn.last_rows) if row is not None]
    rewards = torch.tensor([out["trace_reward"][i] for i in keep])
    assert 0 < rewards.sum() < len(keep), "the scripted agent must both succeed and fail"
    torch.manual_seed(0)
    model, _ = create_tiny_model(tokenizer="byte", hidden=32, layers=2, heads=2)
    model.float().train()
    width = max(len(out["prompt_ids"][i]) + len(out["completion_ids"][i]) for i in keep)
    ids = torch.zeros((len(keep), width), dtype=torch.long)
    mask, adv = torch.zeros((len(keep), width)), torch.zeros((len(keep), width))
    for r, i in enumerate(keep):
        p, c = out["prompt_ids"][i], out["completion_ids"][i]
        ids[r, : len(p) + len(c)] = torch.tensor(p + c)
        mask[r, len(p) : len(p) + len(c)] = torch.tensor(out["env_mask"][i], dtype=torch.float)
        adv[r, len(p) : len(p) + len(c)] = torch.tensor(fn.last_advantages[i])

    def logprobs():  # log-prob of each token given the ones before it (column 0 predicts nothing)
        logits = model(input_ids=ids).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
        return torch.cat([torch.zeros((len(keep), 1)), lp], 1)

    def loss_and_margin():
        lp = logprobs()
        loss = -(adv * lp * mask).sum() / mask.sum()
        per_row = ((lp * mask).sum(1) / mask.sum(1)).detach()
        return loss, float(per_row[rewards > 0.5].mean() - per_row[rewards <= 0.5].mean())

    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss0, margin0 = loss_and_margin()
    for _ in range(6):
        loss, _ = loss_and_margin()
        opt.zero_grad()
        loss.backward()
        opt.step()
    loss1, margin1 = loss_and_margin()
    assert float(loss1) < float(loss0)
    assert margin1 > margin0


def test_contract_violations_are_refused():
    fn = rollout_func()
    with pytest.raises(TypeError, match="TraceGRPOTrainer"):
        fn(prompts(2, 4), stand_in(4, accepts=False))
    with pytest.raises(ValueError, match="multiple of num_generations"):
        fn(prompts(2, 4)[:-1], stand_in(4))
    shuffled = prompts(2, 4)
    shuffled[1], shuffled[4] = shuffled[4], shuffled[1]
    with pytest.raises(ValueError, match="in a row"):
        fn(shuffled, stand_in(4))
    with pytest.raises(ValueError, match="method='trace_cost'.*cost budget.*num_generations rows"):
        rollout_func(method="trace_cost")


def test_keyword_arguments_are_the_one_trace_configuration():
    from trace_rl.methods import BudgetPlan
    from trace_rl.trace_config import PredictorSettings, TraceConfig

    fn = rollout_func(advantage="grpo", budget={"branch_factor": 2, "max_per_prompt": 6}, predictor={"kind": "history"})
    want = TraceConfig(
        "trace", "grpo", BudgetPlan(branch_factor=2, max_per_prompt=6), PredictorSettings("history"), "first"
    )
    assert fn.config == want and type(fn.predictor).__name__ == "RewardHistoryPredictor"
    assert rollout_func(budget=BudgetPlan(branch_factor=3)).config.budget.branch_factor == 3
    assert rollout_func().config == TraceConfig()  # the command line's defaults
    assert fn.config.batch_plan(4, 4) == BudgetPlan(4, 4, 2, 1, 6)


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"estimator": "grpo"}, "advantage="),
        ({"branch_factor": 2}, "budget={'branch_factor': ...}"),
        ({"max_per_prompt": 4}, "budget={'max_per_prompt': ...}"),
        ({"budget": {"rollouts_per_prompt": 4}}, "num_generations"),
        ({"predictor": {"kind": "light_text"}}, "'light'"),
        ({"method": "trace_oracle"}, "exact V"),
        ({"weighting": "half"}, "TraceRolloutFunc.weighting must be one of"),
    ],
)
def test_an_old_or_bad_keyword_is_one_line_naming_the_new_one(kwargs, names):
    with pytest.raises((TypeError, ValueError)) as err:
        rollout_func(**kwargs)
    assert names in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_filler_rows_top_up_a_short_step():
    fn = rollout_func()
    out = fn(prompts(2, 4), stand_in(4))
    real = [r for r in fn.last_rows if r is not None]
    padded = fn.rows_to_output(real[:3], 8)
    assert len(padded["completion_ids"]) == 8 and fn.last_rows[3:] == [None] * 5
    assert all(not any(m) for m in padded["env_mask"][3:]) and np.all(np.array(padded["trace_reward"][3:]) == 0)
    assert out["prompt_ids"][0] == real[0].prompt_ids
    with pytest.raises(RuntimeError, match="overspent"):
        fn.rows_to_output(real, 2)
