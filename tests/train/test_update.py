import copy
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_packing import random_tree, shared_turn_tree

from trace_rl.lm.models import create_tiny_model
from trace_rl.train.packing import flat_token_logprobs
from trace_rl.train.update import UpdateConfig, make_optimizer, schedule_lr, scheduled_lr, update_policy


def tiny():
    model, _ = create_tiny_model(hidden=32, layers=2, heads=2)
    return model.float()


def on_policy_trees(model, n=3, seed=0):
    """Random trees whose stored log-probs are the model's own (so every ratio starts at 1)."""
    rng = random.Random(seed)
    trees = [random_tree(i, rng, depth=3) for i in range(n)]
    every = [{node.node_id: 0.0 for node in t.turns()} for t in trees]
    with torch.no_grad():
        for (ti, nid), lp in flat_token_logprobs(model.eval(), trees, every).items():
            trees[ti][nid].logprobs = lp.tolist()
    return trees


def mean_logprob(model, trees, adv):
    with torch.no_grad():
        lps = flat_token_logprobs(model.eval(), trees, adv)
    return torch.cat(list(lps.values())).mean().item()


def test_positive_advantages_raise_the_sampled_tokens_logprobs():
    model = tiny()
    trees = on_policy_trees(model)
    adv = [{node.node_id: 1.0 for node in t.turns()} for t in trees]
    before = mean_logprob(model, trees, adv)
    cfg = UpdateConfig(micro_batch_tokens=64)
    metrics = update_policy(model, make_optimizer(model, cfg), trees, adv, cfg)
    assert mean_logprob(model, trees, adv) > before + 1e-3
    assert metrics["train/clip_frac"] == 0.0 and metrics["train/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["train/loss"] == pytest.approx(-1.0, abs=1e-5)  # -A r with r = 1, A = 1
    assert metrics["train/policy_tokens"] == sum(len(n.logprobs) for t in trees for n in t.turns())
    assert metrics["train/encoded_tokens"] >= metrics["train/tokens"]  # parts re-encode their context
    assert metrics["train/micro_batches"] > 1 and metrics["train/grad_norm"] > 0


@pytest.mark.parametrize("aggregation,epochs", [("seq-mean-token-mean", 2), ("token-mean", 1)])
def test_tree_and_flat_packing_give_the_same_step(aggregation, epochs):
    base = tiny()
    trees = on_policy_trees(base)
    rng = random.Random(2)
    adv = [{node.node_id: rng.uniform(-1, 1) for node in t.turns()} for t in trees]
    results = {}
    for packing, budget in (("tree", 10_000), ("tree", 40), ("flat", 64)):
        model = copy.deepcopy(base)
        cfg = UpdateConfig(packing=packing, micro_batch_tokens=budget, aggregation=aggregation, epochs=epochs)
        metrics = update_policy(model, make_optimizer(model, cfg), trees, adv, cfg)
        results[packing, budget] = (dict(model.named_parameters()), metrics)
    ref_params, ref_metrics = results["tree", 10_000]
    assert ref_metrics["train/encoded_tokens"] == ref_metrics["train/tokens"]
    assert results["flat", 64][1]["train/encoded_tokens"] > ref_metrics["train/tokens"]
    for key, (params, metrics) in results.items():
        for name, p in params.items():
            torch.testing.assert_close(p, ref_params[name], atol=1e-5, rtol=1e-5, msg=f"{key} {name}")
        for k in ("train/loss", "train/clip_frac", "train/grad_norm", "train/policy_tokens"):
            assert metrics[k] == pytest.approx(ref_metrics[k], abs=1e-5)
    assert any(not torch.equal(p, base.get_parameter(n)) for n, p in ref_params.items())


def test_kl_to_a_reference_model():
    model = tiny()
    trees = on_policy_trees(model, n=2)
    adv = [{node.node_id: 0.0 for node in t.turns()} for t in trees]
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    cfg = UpdateConfig(kl_coef=0.5, aggregation="token-mean")
    metrics = update_policy(model, make_optimizer(model, cfg), trees, adv, cfg, ref_model=ref)
    assert metrics["train/kl"] > 0
    assert metrics["train/loss"] == pytest.approx(0.5 * metrics["train/kl"], rel=1e-5)  # only the KL term
    with pytest.raises(ValueError, match="kl_coef > 0 needs a ref_model"):
        update_policy(model, make_optimizer(model, cfg), trees, adv, cfg)


def test_lora_trains_adapters_only_with_the_base_as_reference():
    pytest.importorskip("peft")
    model = tiny()
    trees = on_policy_trees(model, n=2)
    adv = [{node.node_id: 1.0 for node in t.turns()} for t in trees]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = UpdateConfig(lora_rank=2, kl_coef=0.1, lr=1e-2)
    opt = make_optimizer(model, cfg)
    first = update_policy(model, opt, trees, adv, cfg)
    second = update_policy(model, opt, trees, adv, cfg)
    assert first["train/kl"] == pytest.approx(0.0, abs=1e-7)  # LoRA B starts at zero: policy == base
    assert second["train/kl"] > 0
    for name, p in model.named_parameters():
        if "lora_" in name:
            assert p.requires_grad
        else:
            assert not p.requires_grad and torch.equal(p, before[name.replace(".base_layer", "")])
    assert mean_logprob(model, trees, adv) > mean_logprob(tiny(), trees, adv)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"clip_ratio": 2}, "clip_ratio must be in (0, 1), got 2"),
        ({"loss": "ppo"}, "loss must be one of"),
        ({"aggregation": "seq-mean"}, "aggregation must be one of"),
        ({"packing": "paths"}, "packing must be one of"),
        ({"lr": 0}, "lr must be > 0"),
        ({"kl_coef": -1}, "kl_coef must be >= 0"),
        ({"micro_batch_tokens": 0}, "micro_batch_tokens must be >= 1"),
        ({"epochs": 0}, "epochs must be >= 1"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c must be > 1"),
        ({"lora_rank": -1}, "lora_rank must be >= 0"),
        ({"final_lr": 1.5}, "final_lr must be in [0, 1]"),
        ({"max_update_kl": -0.1}, "max_update_kl must be >= 0"),
    ],
)
def test_config_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError) as err:
        UpdateConfig(**kwargs)
    assert str(err.value).startswith(message)


def _chain_tree():
    """root -> a (2 policy tokens, shared by two leaves) -> b (3 tokens, bare leaf, r=1) and c (1 token, branch
    continuation, r=0); d: a second bare rollout with 4 tokens, r=1."""
    from trace_rl.tree import BRANCH, RolloutTree

    t = RolloutTree(0)
    t.root.token_ids, t.root.loss_mask = [1, 2], [0, 0]
    a = t.add_turn(t.root_id, token_ids=[3, 4, 5], loss_mask=[1, 1, 0], logprobs=[-1.0, -1.0])
    t.add_turn(a.node_id, token_ids=[6, 7, 8], loss_mask=[1, 1, 1], logprobs=[-1.0] * 3, terminal=True, reward=1.0)
    t.add_turn(a.node_id, token_ids=[9], loss_mask=[1], logprobs=[-1.0], terminal=True, reward=0.0, origin=BRANCH)
    t.add_turn(t.root_id, token_ids=[3, 3, 3, 3], loss_mask=[1] * 4, logprobs=[-1.0] * 4, terminal=True, reward=1.0)
    t.compute_targets()
    return t


def test_advantage_stats_by_hand():
    from trace_rl.train.update import advantage_stats

    t = _chain_tree()
    adv = [{"0.0": 0.0, "0.0.0": 0.5, "0.0.1": -1.0, "0.1": 0.5}]
    s = advantage_stats([t], adv, "token-mean")
    # tokens: a 2 (A=0), b 3, c 1, d 4 -> 8 of 10 non-zero; turns 3 of 4
    assert s["train/adv_nonzero_token_share"] == pytest.approx(0.8)
    assert s["train/adv_nonzero_turn_share"] == pytest.approx(0.75)
    # token-mean |A| weight: b 1.5, c 1.0, d 2.0 = 4.5 over 10 tokens; c is the branch, a (shared) carries 0
    assert s["train/adv_abs"] == pytest.approx(0.45)
    assert s["train/adv_weight_branch"] == pytest.approx(1.0 / 4.5)
    assert s["train/adv_weight_shared"] == 0.0
    adv[0]["0.0"] = 1.0
    s = advantage_stats([t], adv, "seq-mean-token-mean")
    # per turn: a 1.0 (shared by two leaves), b 0.5, c 1.0, d 0.5 -> 3.0 over 4 turns
    assert s["train/adv_abs"] == pytest.approx(0.75)
    assert s["train/adv_weight_shared"] == pytest.approx(1.0 / 3.0)
    assert s["train/adv_weight_branch"] == pytest.approx(1.0 / 3.0)


def test_update_kl_measures_how_far_the_step_moved():
    model = tiny()
    trees = on_policy_trees(model)
    adv = [{node.node_id: 1.0 for node in t.turns()} for t in trees]
    free = UpdateConfig(lr=1e-2, max_update_kl=0.0)  # the bound off: the step's own size is what is measured
    moved = update_policy(model, make_optimizer(model, free), trees, adv, free)
    model = tiny()
    trees = on_policy_trees(model)
    small = update_policy(model, make_optimizer(model, UpdateConfig(lr=1e-5)), trees, adv, UpdateConfig(lr=1e-5))
    assert moved["train/update_kl"] > 10 * small["train/update_kl"] > 0
    assert moved["train/adv_nonzero_token_share"] == 1.0
    none = [{node.node_id: 0.0 for node in t.turns()} for t in trees]
    still = update_policy(model, make_optimizer(model, UpdateConfig()), trees, none, UpdateConfig())
    assert still["train/update_kl"] == pytest.approx(0.0, abs=1e-9) and still["train/adv_nonzero_token_share"] == 0


@pytest.mark.parametrize("weighting,shared", [("first", 1.0), ("leaf", 2.0)])
def test_update_weighting_setting_reaches_the_packer(weighting, shared):
    """TRACE's `weighting` decides how a turn on two paths is weighted in the step's batches."""
    from trace_rl.train.update import _batches

    tree, adv = shared_turn_tree()
    (b,) = _batches([tree], [adv], UpdateConfig(), weighting)
    assert b.by_segment(b.advantages)[(0, "0.0")].tolist() == [0.5 * shared]
    with pytest.raises(ValueError, match="weighting must be one of"):
        _batches([tree], [adv], UpdateConfig(), "none")


def test_the_learning_rate_falls_linearly_by_step_to_its_final_share():
    cfg = UpdateConfig(lr=1e-3, final_lr=0.1)
    assert [scheduled_lr(cfg, s, 4) for s in range(4)] == pytest.approx([1e-3, 7e-4, 4e-4, 1e-4])
    assert scheduled_lr(cfg, 9, 4) == pytest.approx(1e-4)  # past the last step (steps lowered on resume): the floor
    assert scheduled_lr(cfg, 0, 1) == 1e-3  # one step: the peak
    assert [scheduled_lr(UpdateConfig(lr=1e-3, final_lr=1.0), s, 4) for s in range(4)] == [1e-3] * 4  # constant
    model = tiny()
    optimizer = make_optimizer(model, cfg)
    assert schedule_lr(optimizer, cfg, 2, 4) == pytest.approx(4e-4)  # the update sets its own step's rate
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(4e-4)] * len(optimizer.param_groups)


def test_minibatches_are_successive_steps_on_dealt_groups_and_the_clip_binds_after_the_first():
    base = tiny()
    trees = on_policy_trees(base, n=4)
    rng = random.Random(3)
    adv = [{node.node_id: rng.uniform(-1, 1) for node in t.turns()} for t in trees]
    cfg = UpdateConfig(lr=3e-2, minibatches=2, clip_ratio=0.05, max_update_kl=0.0)  # the bound acts on a whole step
    split = copy.deepcopy(base)
    metrics = update_policy(split, make_optimizer(split, cfg), trees, adv, cfg)
    # by hand: one minibatch of trees 0 and 2, then one of trees 1 and 3, on one optimizer
    one = UpdateConfig(lr=3e-2, clip_ratio=0.05, max_update_kl=0.0)
    manual = copy.deepcopy(base)
    opt = make_optimizer(manual, one)
    first = update_policy(manual, opt, trees[0::2], adv[0::2], one)
    second = update_policy(manual, opt, trees[1::2], adv[1::2], one)
    for name, p in split.named_parameters():
        torch.testing.assert_close(p, manual.get_parameter(name), atol=1e-6, rtol=1e-6, msg=name)
    assert metrics["train/optimizer_steps"] == 2 and first["train/clip_frac"] == 0.0
    assert second["train/clip_frac"] > 0  # the second step's ratio has moved off 1: the clip acts
    assert metrics["train/clip_frac"] == pytest.approx((first["train/clip_frac"] + second["train/clip_frac"]) / 2)
    # update_kl is against the policy before the first minibatch's step, over every trained token
    with torch.no_grad():
        lp0 = torch.cat(list(flat_token_logprobs(base.eval(), trees, adv).values()))
        lp1 = torch.cat(list(flat_token_logprobs(split.eval(), trees, adv).values()))
    log_ratio = lp1 - lp0
    assert metrics["train/update_kl"] == pytest.approx(float((log_ratio.exp() - log_ratio - 1).mean()), rel=1e-3)


def _big_step(max_update_kl: float):
    """A step at a rate that moves the policy far (KL well above 1e-3), from a fixed start."""
    base = tiny()
    trees = on_policy_trees(base, n=4)
    rng = random.Random(5)
    adv = [{node.node_id: rng.uniform(-1, 1) for node in t.turns()} for t in trees]
    model = copy.deepcopy(base)
    cfg = UpdateConfig(lr=3e-2, max_update_kl=max_update_kl)
    return base, model, trees, adv, update_policy(model, make_optimizer(model, cfg), trees, adv, cfg)


def _k3(before, after, trees, adv) -> float:
    with torch.no_grad():
        lp0 = torch.cat(list(flat_token_logprobs(before.eval(), trees, adv).values()))
        lp1 = torch.cat(list(flat_token_logprobs(after.eval(), trees, adv).values()))
    log_ratio = lp1 - lp0
    return float((log_ratio.exp() - log_ratio - 1).mean())


def test_max_update_kl_scales_the_step_back_along_its_direction_until_within_the_bound():
    base, free, trees, adv, unbounded = _big_step(0.0)
    assert unbounded["train/update_scale"] == 1.0 and unbounded["train/update_kl"] > 5e-3
    assert unbounded["train/update_kl_unbounded"] == unbounded["train/update_kl"]
    limit = unbounded["train/update_kl"] / 10
    _, bounded, _, _, metrics = _big_step(limit)
    assert metrics["train/update_kl"] <= limit and metrics["train/update_kl"] > limit / 4  # under it, not far under
    assert metrics["train/update_kl_unbounded"] == pytest.approx(unbounded["train/update_kl"], rel=1e-5)
    scale = metrics["train/update_scale"]
    assert 0 < scale < 1
    # the parameters are the start plus that share of the unbounded step
    for name, p in bounded.named_parameters():
        start, end = base.get_parameter(name), free.get_parameter(name)
        torch.testing.assert_close(p, start + scale * (end - start), atol=1e-6, rtol=1e-5, msg=name)
    # and the reported KL is the KL of the policy the step left
    assert metrics["train/update_kl"] == pytest.approx(_k3(base, bounded, trees, adv), rel=1e-3)


def test_max_update_kl_leaves_a_step_within_the_bound_as_it_was():
    _, free, _, _, unbounded = _big_step(0.0)
    _, bounded, _, _, metrics = _big_step(unbounded["train/update_kl"] * 2)
    assert metrics["train/update_scale"] == 1.0 and metrics["train/update_kl"] == unbounded["train/update_kl"]
    for name, p in bounded.named_parameters():
        assert torch.equal(p, free.get_parameter(name)), name


def test_a_step_that_no_share_brings_within_the_bound_is_undone(monkeypatch):
    import trace_rl.train.update as update

    monkeypatch.setattr(update, "MAX_BACKTRACKS", 1)  # one try of at most 10x smaller: 1e-9 is out of reach
    base, bounded, _, _, metrics = _big_step(1e-9)
    assert metrics["train/update_scale"] == 0.0 and metrics["train/update_kl"] == 0.0
    for name, p in bounded.named_parameters():
        torch.testing.assert_close(p, base.get_parameter(name), atol=1e-7, rtol=0, msg=name)
