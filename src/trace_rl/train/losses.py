"""Policy losses as pure functions (verl `core_algos` style): per-token tensors in, a scalar loss out.

Every loss takes the current log-probs of the policy tokens, the sampling log-probs stored in the trees
(`old_logprobs`: the importance ratio is taken against the policy that generated the tokens, not against a
recomputed copy, so one update needs one forward pass per micro-batch), one advantage per token and one
segment id per token, and returns a `LossOutput`.

What a "sequence" is in a tree: the policy tokens of one turn node form one segment. A node shared by several
leaves is one segment, trained once with its node advantage; a root-to-leaf trajectory is not a sequence here,
because its turns are shared with other leaves. So `seq-mean-token-mean` weighs every turn node equally (GRPO's
per-response mean applied per turn), while `token-mean` (DAPO) weighs every policy token equally, so long turns
count more.

Micro-batches: a turn node lies in exactly one micro-batch, so pass the step-wide `num_tokens` / `num_segments`
and the losses of all micro-batches add up to the loss of the whole step (gradient accumulation without
re-weighting). Without them the normalisers are those of the tensors given. Metrics (`clip_frac`, `kl`,
`approx_kl`) are always token means over the tensors given; a caller weighs them by token count.

KL to a frozen reference uses the k3 estimator exp(ref - logp) - (ref - logp) - 1 (Schulman; GRPO, verl's
`low_var_kl`), clamped to [-10, 10] as verl does, and is aggregated like the policy term. `approx_kl` is the
same estimator of KL(sampling policy || current policy), a drift diagnostic that is not part of the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
KL_CLAMP = 10.0


class LossOutput(NamedTuple):
    loss: torch.Tensor  # scalar to back-propagate: policy term + kl_coef * KL term
    pg_loss: torch.Tensor  # the policy term alone (detached)
    clip_frac: torch.Tensor  # share of tokens whose gradient the clip removed (detached)
    kl: torch.Tensor  # token-mean k3 KL to the reference, 0 without one (detached)
    approx_kl: torch.Tensor  # token-mean k3 KL of the sampling policy to the current one (detached)


def aggregate(
    values: torch.Tensor,
    segment_ids: torch.Tensor,
    aggregation: str,
    num_tokens: int | None = None,
    num_segments: int | None = None,
) -> torch.Tensor:
    """Sum of per-token `values` normalised by `aggregation`: token-mean divides by the token count;
    seq-mean-token-mean averages within each segment, sums the segment means and divides by the segment count."""
    if aggregation == "token-mean":
        return values.sum() / (num_tokens if num_tokens is not None else max(values.numel(), 1))
    if aggregation == "seq-mean-token-mean":
        if values.numel() == 0:
            return values.sum()
        ids, inverse, counts = torch.unique(segment_ids, return_inverse=True, return_counts=True)
        sums = torch.zeros(len(ids), dtype=values.dtype, device=values.device).index_add(0, inverse, values)
        means = sums / counts.to(values.dtype)
        return means.sum() / (num_segments if num_segments is not None else len(ids))
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(current || ref) on tokens drawn from the current policy: non-negative,
    unbiased, lower variance than log(p / ref)."""
    log_ratio = (ref_logprobs - logprobs).clamp(-KL_CLAMP, KL_CLAMP)
    return (log_ratio.exp() - log_ratio - 1.0).clamp(-KL_CLAMP, KL_CLAMP)


def _finish(
    pg_per_token: torch.Tensor,
    clipped: torch.Tensor,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    segment_ids: torch.Tensor,
    aggregation: str,
    ref_logprobs: torch.Tensor | None,
    kl_coef: float,
    num_tokens: int | None,
    num_segments: int | None,
) -> LossOutput:
    agg = lambda v: aggregate(v, segment_ids, aggregation, num_tokens, num_segments)
    pg_loss = agg(pg_per_token)
    loss = pg_loss
    zero = logprobs.new_zeros(())
    tok_mean = (lambda v: v.float().mean()) if logprobs.numel() else (lambda v: zero)
    kl = zero
    if ref_logprobs is not None:
        kl_tokens = k3_kl(logprobs, ref_logprobs)
        if kl_coef:
            loss = loss + kl_coef * agg(kl_tokens)
        kl = tok_mean(kl_tokens.detach())
    approx_kl = tok_mean(k3_kl(old_logprobs, logprobs.detach()))  # samples come from the sampling policy
    return LossOutput(loss, pg_loss.detach(), tok_mean(clipped), kl, approx_kl)


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    segment_ids: torch.Tensor,
    *,
    aggregation: str = "seq-mean-token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    num_tokens: int | None = None,
    num_segments: int | None = None,
) -> LossOutput:
    """PPO-clip: max(-A r, -A clip(r, 1 - low, 1 + high)) per token, r = exp(logp - old_logp); with
    `clip_ratio_c` (> 1) the dual clip bounds the loss of negative-advantage tokens by -A c (Ye et al. 2020).
    clip_frac counts the tokens where the clipped branch is the larger one (their gradient is zero)."""
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)  # exp of a stale 30-nat gap would overflow fp16
    ratio = log_ratio.exp()
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = torch.maximum(loss1, loss2)
    clipped = (loss2 > loss1).detach()
    if clip_ratio_c is not None:
        if clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
        loss3 = -advantages * clip_ratio_c
        capped = ((advantages < 0) & (loss3 < per_token)).detach()
        per_token = torch.where(advantages < 0, torch.minimum(per_token, loss3), per_token)
        clipped = clipped | capped
    return _finish(
        per_token,
        clipped,
        logprobs,
        old_logprobs,
        segment_ids,
        aggregation,
        ref_logprobs,
        kl_coef,
        num_tokens,
        num_segments,
    )


def pg_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    segment_ids: torch.Tensor,
    *,
    aggregation: str = "seq-mean-token-mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    num_tokens: int | None = None,
    num_segments: int | None = None,
    **_clip: float | None,
) -> LossOutput:
    """Unclipped importance-weighted policy gradient -A r: on-policy (r = 1) its gradient is REINFORCE's
    -A grad log p; off-policy nothing bounds the step. Clip arguments are accepted and ignored, so a config
    can switch losses by name."""
    ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0).exp()
    clipped = torch.zeros_like(ratio, dtype=torch.bool)
    return _finish(
        -advantages * ratio,
        clipped,
        logprobs,
        old_logprobs,
        segment_ids,
        aggregation,
        ref_logprobs,
        kl_coef,
        num_tokens,
        num_segments,
    )


POLICY_LOSSES: dict[str, Callable[..., LossOutput]] = {"ppo_clip": ppo_clip_loss, "pg": pg_loss}
