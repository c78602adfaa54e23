import math

import pytest

torch = pytest.importorskip("torch")

from trace_rl.train.losses import POLICY_LOSSES, aggregate, k3_kl, ppo_clip_loss


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_aggregations_by_hand():
    vals, seg = t(1.0, 3.0, 5.0, 10.0), torch.tensor([0, 0, 0, 1])
    assert aggregate(vals, seg, "token-mean").item() == pytest.approx(19 / 4)
    assert aggregate(vals, seg, "seq-mean-token-mean").item() == pytest.approx((3.0 + 10.0) / 2)
    # step-wide normalisers: the micro-batch's share of the step loss
    assert aggregate(vals, seg, "token-mean", num_tokens=10).item() == pytest.approx(1.9)
    assert aggregate(vals, seg, "seq-mean-token-mean", num_segments=4).item() == pytest.approx(13 / 4)
    with pytest.raises(ValueError, match="aggregation must be one of"):
        aggregate(vals, seg, "seq-sum")


def test_micro_batches_add_up_to_the_step_loss():
    gen = torch.Generator().manual_seed(0)
    lp, old, adv = (torch.randn(9, generator=gen, dtype=torch.float64) * 0.3 for _ in range(3))
    seg = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 3])
    for agg in ("token-mean", "seq-mean-token-mean"):
        whole = ppo_clip_loss(lp, old, adv, seg, aggregation=agg).loss
        parts = sum(
            ppo_clip_loss(lp[s], old[s], adv[s], seg[s], aggregation=agg, num_tokens=9, num_segments=4).loss
            for s in (slice(0, 5), slice(5, 9))
        )
        assert parts.item() == pytest.approx(whole.item())


def test_ppo_clip_by_hand():
    # ratios 1.5 (A=+1: clipped at 1.2), 0.5 (A=-1: clipped at 0.8), 1.1 (A=+2: inside), 0.5 (A=+1: unclipped side)
    ratio = t(1.5, 0.5, 1.1, 0.5)
    old = t(-1.0, -2.0, -0.5, -3.0)
    lp = (old + ratio.log()).requires_grad_()
    adv = t(1.0, -1.0, 2.0, 1.0)
    seg = torch.tensor([0, 0, 1, 1])
    out = ppo_clip_loss(lp, old, adv, seg, aggregation="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2)
    per_token = [-1.2, 0.8, -2.2, -0.5]
    assert out.loss.item() == pytest.approx(sum(per_token) / 4)
    assert out.clip_frac.item() == pytest.approx(0.5)
    out.loss.backward()
    # clipped tokens get no gradient; d(-A r)/d logp = -A r for the others
    assert lp.grad.tolist() == pytest.approx([0.0, 0.0, -2.0 * 1.1 / 4, -0.5 / 4])
    seq = ppo_clip_loss(lp, old, adv, seg, aggregation="seq-mean-token-mean")
    assert seq.loss.item() == pytest.approx(((-1.2 + 0.8) / 2 + (-2.2 - 0.5) / 2) / 2)
    # asymmetric clip (DAPO's clip-higher): 1.5 is inside (0.8, 1.6)
    high = ppo_clip_loss(lp, old, adv, seg, aggregation="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.6)
    assert high.loss.item() == pytest.approx((-1.5 + 0.8 - 2.2 - 0.5) / 4)


def test_dual_clip_caps_negative_advantages():
    old = t(0.0, 0.0)
    lp = t(math.log(5.0), math.log(5.0))
    adv = t(-1.0, 1.0)
    seg = torch.tensor([0, 1])
    plain = ppo_clip_loss(lp, old, adv, seg, aggregation="token-mean")
    dual = ppo_clip_loss(lp, old, adv, seg, aggregation="token-mean", clip_ratio_c=3.0)
    assert plain.loss.item() == pytest.approx((5.0 - 1.2) / 2)  # -A r = 5 beats -A 1.2 = 1.2
    assert dual.loss.item() == pytest.approx((3.0 - 1.2) / 2)  # capped at -A c = 3
    assert dual.clip_frac.item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        ppo_clip_loss(lp, old, adv, seg, clip_ratio_c=0.5)


def test_kl_k3_by_hand_and_weighted_into_the_loss():
    lp, ref = t(-1.0, -2.0), t(-1.5, -1.0)
    expected = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    assert k3_kl(lp, ref).tolist() == pytest.approx(expected)
    seg, adv = torch.tensor([0, 0]), t(0.0, 0.0)
    out = ppo_clip_loss(lp, lp, adv, seg, aggregation="token-mean", ref_logprobs=ref, kl_coef=0.1)
    assert out.kl.item() == pytest.approx(sum(expected) / 2)
    assert out.loss.item() == pytest.approx(0.1 * sum(expected) / 2)
    assert out.approx_kl.item() == pytest.approx(0.0)  # on-policy: current == sampling policy
    no_ref = ppo_clip_loss(lp, lp, adv, seg)
    assert no_ref.kl.item() == 0.0 and no_ref.loss.item() == 0.0


def test_pg_loss_is_reinforce_on_policy():
    lp = t(-1.0, -2.0, -0.3).requires_grad_()
    adv = t(1.0, -2.0, 0.5)
    out = POLICY_LOSSES["pg"](
        lp, lp.detach(), adv, torch.tensor([0, 1, 1]), aggregation="token-mean", clip_ratio_low=0.2
    )
    out.loss.backward()
    assert lp.grad.tolist() == pytest.approx((-adv / 3).tolist())
    assert set(POLICY_LOSSES) >= {"ppo_clip", "pg"}
