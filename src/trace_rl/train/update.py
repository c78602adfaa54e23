"""One policy update from a step's rollout trees: pack, forward micro-batches, accumulate, clip, step.

Each epoch runs every micro-batch once, accumulates gradients (each micro-batch's loss is its share of the
step loss, so memory is bounded by `micro_batch_tokens` and the result does not depend on how the step was
cut) and takes one optimizer step per minibatch (`minibatches`: the trees dealt into groups; one by default).
Later minibatches and epochs beyond the first see a policy that has moved: the importance ratio is
always against the sampling log-probs stored in the trees, so the clip bounds the drift from the sampling
policy, not from the previous epoch.

The forward runs with dropout off (model.eval()): on-policy the ratio must be exactly 1, which it cannot be
if the rollout (eval mode) and the update see different networks. Nothing depends on wall-clock time or on
a random draw, so one model, one set of trees and one config give one update.

Limits: a reference model for the KL term is evaluated once per step (before the first epoch); with LoRA and
no reference model the reference is the base model with its adapters switched off, which costs no copy.
A step whose gradient norm is not finite is skipped (reported as such), as verl does.

A bound on the step itself (`max_update_kl`): the PPO clip bounds each token's ratio to the sampling policy, which
a step of many small moves never reaches (measured: 4 minibatches at the default rate clip under 0.1% of tokens
while the step's KL doubles), so the step's KL is bounded directly, as TRPO's line search does. After the
optimizer steps the KL of the pre-step policy to the new one is measured (it is measured anyway, `update_kl`);
above the bound the parameters are moved back along the step, to the share s of it that a quadratic model of the
KL (KL ~ s^2) puts just under the bound, and measured again, at most `MAX_BACKTRACKS` times; a step still above
the bound after those is undone (s = 0). Costs: one copy of the trainable parameters while the step is taken, and
one no-grad forward per backtrack (none when the step is within the bound). AdamW's moments keep the step's
gradient (only the parameters are moved back), as the step direction is unchanged.

What the step carried (the chain effective ratio -> signal -> update size -> accuracy): `advantage_stats`
reports the share of trained tokens and turns with a non-zero advantage and how the loss weight |A| splits
between shared prefixes, continuation (branch) turns and the rest, under the configured aggregation; the
update reports the gradient norm before clipping and `update_kl`, the k3 KL of the pre-update policy to the
updated one on the trained tokens, from one extra no-grad forward after the last optimizer step (about a
third of a training pass: measured, because the drift from the sampling policy, `approx_kl`, is 0 on-policy
and says nothing about how far the step moved).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..lm.precision import check_dtype
from ..trace_config import TraceConfig
from ..tree import BRANCH, RolloutTree
from .losses import AGGREGATIONS, KL_CLAMP, POLICY_LOSSES
from .packing import PackedBatch, pack_paths, pack_trees, token_logprobs
from .tree_attention import KERNELS

PACKINGS = ("tree", "flat")
MAX_BACKTRACKS = 8  # line-search tries before a step over max_update_kl is undone
LLAMA_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class UpdateConfig:
    """Policy update from trees (the `update` group)."""

    loss: str = "ppo_clip"  # a name in POLICY_LOSSES: ppo_clip | pg
    aggregation: str = "seq-mean-token-mean"  # token-mean (DAPO) | seq-mean-token-mean (GRPO; a turn is a sequence)
    clip_ratio: float = 0.2  # PPO clip: the ratio is kept in (1 - clip_ratio, 1 + clip_ratio_high)
    clip_ratio_high: float | None = None  # upper clip (DAPO's clip-higher uses 0.28); None: clip_ratio
    clip_ratio_c: float | None = None  # dual clip bound for negative advantages (> 1, e.g. 3); None: off
    kl_coef: float = 0.0  # weight of the k3 KL to the reference model in the loss (0: reported only)
    # 2e-4 for the tiny warm-started model (train/sft.py trains it at 1e-3): at 3e-4 the KL of one update reaches
    # 0.01-0.02 and held-out accuracy falls in the first steps; at 1e-4 a 40-step run barely moves
    # (lab/notes/2026-12-01-accuracy-lm.md). Use about 1e-6 for 100M+ models (verl's default for Qwen-scale actors).
    lr: float = 2e-4  # AdamW learning rate
    # At a constant 2e-4, GRPO on the default task gained 12 points by step 20 and lost 8 of them by step 40; decayed
    # to 10% it kept climbing on every seed tried (lab/notes/2026-12-01-accuracy-lm.md).
    final_lr: float = 0.1  # the rate decays linearly by step to this share of lr at the last step (1: constant)
    weight_decay: float = 0.0  # AdamW decay; 0 because decay pulls a warm-started policy off regardless of reward
    max_grad_norm: float = 1.0  # clip the global gradient norm (0: no clipping, norm still reported)
    # Without it one step of KL 0.047 took GRPO from 0.483 to 0.476 on a tuning seed; at 0.01 no run fell below its
    # start and the seed-to-seed spread of each method's gain shrank (lab/notes/2026-12-02-warm-start-and-recipe.md)
    max_update_kl: float = 0.01  # bound on a step's KL(before || after): above it the step is scaled back (0: off)
    micro_batch_tokens: int = 4096  # tokens per forward (tree rows include re-encoded context); bounds memory
    epochs: int = 1  # passes over the step's trees
    # With one minibatch the only gradient step is taken at ratio 1 and the clip never acts; from the second group
    # on the ratio has moved and the clip bounds how far each token's probability goes in one step
    minibatches: int = 1  # optimizer steps per epoch: the step's trees dealt into this many groups (PPO minibatches)
    packing: str = "tree"  # tree: every tree token encoded once | flat: one row per root-to-leaf path
    tree_attention: str = "auto"  # tree mask kernel: auto (flex on CUDA, else blocks) | blocks | flex | dense
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank instead of all weights (needs peft)
    lora_alpha: float = 16.0  # LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)
    lora_targets: tuple[str, ...] = LLAMA_LINEAR  # module names that get adapters
    # the backend samples in this dtype too (hf: the same autocast; vllm: the engine's dtype), so the first ratio is 1
    dtype: str = "float32"  # forward compute dtype: float32 | bfloat16 (autocast; float32 master weights and AdamW)

    def __post_init__(self):
        check_dtype("update.dtype", self.dtype)  # the full key: policy.vllm.dtype shares the last name
        if self.loss not in POLICY_LOSSES:
            raise ValueError(f"loss must be one of {sorted(POLICY_LOSSES)}, got {self.loss!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if not 0 < self.clip_ratio < 1:
            raise ValueError(f"clip_ratio must be in (0, 1), got {self.clip_ratio}")
        if self.clip_ratio_high is not None and not self.clip_ratio_high > 0:
            raise ValueError(f"clip_ratio_high must be > 0 or None, got {self.clip_ratio_high}")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ValueError(f"clip_ratio_c must be > 1 or None, got {self.clip_ratio_c}")
        for name in ("kl_coef", "weight_decay", "max_grad_norm", "max_update_kl"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.final_lr <= 1:
            raise ValueError(f"final_lr must be in [0, 1] (a share of lr at the last step), got {self.final_lr}")
        for name in ("lr", "lora_alpha"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name, low in (("micro_batch_tokens", 1), ("epochs", 1), ("minibatches", 1), ("lora_rank", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}, got {self.packing!r}")
        if self.tree_attention not in KERNELS:
            raise ValueError(f"tree_attention must be one of {KERNELS}, got {self.tree_attention!r}")
        self.lora_targets = tuple(self.lora_targets)
        if self.lora_rank and not self.lora_targets:
            raise ValueError("lora_targets must name at least one module when lora_rank > 0")


def _has_lora(model) -> bool:
    return any(type(m).__module__.startswith("peft.") and hasattr(m, "enable_adapters") for m in model.modules())


@contextlib.contextmanager
def _adapters_disabled(model) -> Iterator[None]:
    layers = [m for m in model.modules() if type(m).__module__.startswith("peft.") and hasattr(m, "enable_adapters")]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)


def make_optimizer(model, cfg: UpdateConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters. With lora_rank > 0, LoRA adapters are first injected into `model`
    in place (peft, imported only then): base weights are frozen and only the adapters are optimised."""
    if cfg.lora_rank > 0 and not _has_lora(model):
        try:
            from peft import LoraConfig, inject_adapter_in_model
        except ImportError:
            raise ImportError("lora_rank > 0 needs peft (pip install peft)") from None
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_targets))
        inject_adapter_in_model(lora, model)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def scheduled_lr(cfg: UpdateConfig, step: int, steps: int) -> float:
    """The learning rate of update `step` (0-based) of `steps`: lr at the first, falling linearly to
    final_lr x lr at the last. A function of the step alone, so a resumed run sets the rate an uninterrupted one had."""
    frac = step / (steps - 1) if steps > 1 else 0.0
    return cfg.lr * (1.0 - (1.0 - cfg.final_lr) * min(frac, 1.0))


def schedule_lr(optimizer: torch.optim.Optimizer, cfg: UpdateConfig, step: int, steps: int) -> float:
    """Set the optimizer's rate to update `step`'s (`scheduled_lr`) before the update; returns it (the record's
    train/lr)."""
    lr = scheduled_lr(cfg, step, steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def _batches(
    trees: list[RolloutTree], advantages: list[dict[str, float]], cfg: UpdateConfig, weighting: str = "first"
) -> list[PackedBatch]:
    """The step's micro-batches; `weighting`: how a turn shared by k leaves counts (TRACE's `weighting`)."""
    if cfg.packing == "flat":
        return pack_paths(trees, advantages, max_tokens=cfg.micro_batch_tokens, weighting=weighting)
    # trees share rows unless the mask is dense (whose attention work covers every pair of a row)
    share = cfg.tree_attention != "dense"
    return pack_trees(trees, advantages, max_tokens=cfg.micro_batch_tokens, weighting=weighting, share_rows=share)


def advantage_stats(
    trees: list[RolloutTree], advantages: list[dict[str, float]], aggregation: str, eps: float = 1e-8
) -> dict[str, float]:
    """How much of a step's loss carries signal: train/adv_nonzero_token_share and adv_nonzero_turn_share
    (trained tokens and turns whose advantage is non-zero), adv_abs (mean |A| under `aggregation`: per token for
    token-mean, per turn for seq-mean-token-mean), and the shares of that |A| weight on shared turns (on the
    path of 2+ leaves, trained once for all of them) and on continuation turns (origin branch)."""
    weight = {"all": 0.0, "shared": 0.0, "branch": 0.0}
    tokens = nonzero_tokens = turns = nonzero_turns = 0
    for tree, adv in zip(trees, advantages):
        for node in tree.turns():
            n = sum(node.loss_mask)
            if n == 0:
                continue
            a = abs(float(adv.get(node.node_id, 0.0)))
            tokens, turns = tokens + n, turns + 1
            if a > eps:
                nonzero_tokens, nonzero_turns = nonzero_tokens + n, nonzero_turns + 1
            w = a * n if aggregation == "token-mean" else a
            weight["all"] += w
            weight["shared"] += w if node.leaves > 1 else 0.0
            weight["branch"] += w if node.origin == BRANCH else 0.0
    units = tokens if aggregation == "token-mean" else turns
    total = weight["all"]
    return {
        "train/adv_nonzero_token_share": nonzero_tokens / tokens if tokens else 0.0,
        "train/adv_nonzero_turn_share": nonzero_turns / turns if turns else 0.0,
        "train/adv_abs": total / units if units else 0.0,
        "train/adv_weight_shared": weight["shared"] / total if total else 0.0,
        "train/adv_weight_branch": weight["branch"] / total if total else 0.0,
    }


def _reference_logprobs(
    model, ref_model, batches: list[PackedBatch], cfg: UpdateConfig, temperature: float
) -> list | None:
    if ref_model is None and not _has_lora(model):
        if cfg.kl_coef > 0:
            raise ValueError("kl_coef > 0 needs a ref_model (or LoRA, whose base model is the reference)")
        return None
    context = _adapters_disabled(model) if ref_model is None else contextlib.nullcontext()
    ref = ref_model if ref_model is not None else model
    was_training = ref.training
    ref.eval()
    with torch.no_grad(), context:
        out = [token_logprobs(ref, b, temperature, cfg.tree_attention, cfg.dtype) for b in batches]
    ref.train(was_training)
    return out


def update_policy(
    model,
    optimizer: torch.optim.Optimizer,
    trees: list[RolloutTree],
    advantages: list[dict[str, float]],
    cfg: UpdateConfig,
    ref_model=None,
    temperature: float = 1.0,
    weighting: str = TraceConfig.weighting,
) -> dict[str, float]:
    """`cfg.epochs` x `cfg.minibatches` optimizer steps on the trees' policy tokens (tree i goes to minibatch
    i mod minibatches, each minibatch's loss normalised over its own tokens), their log-probs taken at the sampling
    `temperature` (the trainer passes `policy.temperature`); returns metrics averaged over the optimizer steps:
    train/loss, train/pg_loss, train/clip_frac, train/kl (to the reference, 0 without one), train/approx_kl
    (sampling policy to current), train/grad_norm, and train/skipped_steps, train/optimizer_steps; per epoch:
    train/tokens (distinct tokens of the trees), train/encoded_tokens (tokens run through the model),
    train/policy_tokens (trained tokens), train/micro_batches; and `advantage_stats`, and train/update_kl (k3 KL
    of the policy before the step to the policy after it, token mean over the trained tokens), with
    train/update_kl_unbounded and train/update_scale (the step's KL before `max_update_kl` scaled it back, and the
    share of the step kept: 1 when the bound did not act). `weighting`: how a turn shared by k leaves counts
    (TRACE's configuration, `trace_config.TraceConfig.weighting`; checked by the packer)."""
    groups = [
        _batches(trees[j :: cfg.minibatches], advantages[j :: cfg.minibatches], cfg, weighting)
        for j in range(min(cfg.minibatches, max(len(trees), 1)))
    ]
    batches = [b for group in groups for b in group]
    num_tokens = sum(b.policy_tokens for b in batches)
    sums = dict.fromkeys(("loss", "pg_loss", "clip_frac", "kl", "approx_kl", "grad_norm", "skipped_steps"), 0.0)
    signal = advantage_stats(trees, advantages, cfg.aggregation)
    counts = {
        "tokens": float(sum(len(n.token_ids) for t in trees for n in t.nodes.values())),
        "encoded_tokens": float(sum(b.encoded_tokens for b in batches)),
        "policy_tokens": float(num_tokens),
        "micro_batches": float(len(batches)),
    }
    if num_tokens == 0:
        zero = {**sums, "optimizer_steps": 0.0, **counts}
        bound = {"train/update_kl": 0.0, "train/update_kl_unbounded": 0.0, "train/update_scale": 1.0}
        return {**{f"train/{k}": v for k, v in zero.items()}, **signal, **bound}
    ref_lps = [_reference_logprobs(model, ref_model, group, cfg, temperature) for group in groups]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    was_training = model.training
    model.eval()
    before: list[torch.Tensor] = []  # the pre-update policy's log-probs
    start = [p.detach().clone() for p in params] if cfg.max_update_kl > 0 else None
    steps = 0
    try:
        if len(groups) > 1:  # the first epoch's forwards come after earlier minibatches' steps: take them first
            with torch.no_grad():
                before = [token_logprobs(model, b, temperature, cfg.tree_attention, cfg.dtype) for b in batches]
        for epoch in range(cfg.epochs):
            for group, refs in zip(groups, ref_lps):
                if sum(b.policy_tokens for b in group) == 0:
                    continue
                keep = before if epoch == 0 and len(groups) == 1 else None  # one minibatch: its first forwards
                _minibatch_step(model, optimizer, params, group, refs, cfg, temperature, sums, keep)
                steps += 1
        measure = lambda: _update_kl(model, batches, before, temperature, num_tokens, cfg.tree_attention, cfg.dtype)
        update_kl = unbounded_kl = measure()
        scale = 1.0
        if start is not None and update_kl > cfg.max_update_kl:
            update_kl, scale = _bound_step(params, start, measure, update_kl, cfg.max_update_kl)
    finally:
        model.train(was_training)
    means = {k: v / steps for k, v in sums.items() if k != "skipped_steps"}
    extra = {"skipped_steps": sums["skipped_steps"], "optimizer_steps": float(steps), **counts}
    out = {f"train/{k}": v for k, v in {**means, **extra}.items()}
    bound = {"train/update_kl": update_kl, "train/update_kl_unbounded": unbounded_kl, "train/update_scale": scale}
    return {**out, **signal, **bound}


def _minibatch_step(
    model,
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    group: list[PackedBatch],
    refs: list | None,
    cfg: UpdateConfig,
    temperature: float,
    sums: dict[str, float],
    before: list[torch.Tensor] | None,
) -> None:
    """One optimizer step on one minibatch (`group`, with at least one trained token): forward and backward each
    micro-batch, clip the gradient, step unless its norm is not finite. Adds to `sums` (loss and pg_loss summed over
    the micro-batches, the rest token-weighted) and appends each micro-batch's log-probs to `before` when given."""
    loss_fn = POLICY_LOSSES[cfg.loss]
    clip = {"clip_ratio_low": cfg.clip_ratio, "clip_ratio_high": cfg.clip_ratio_high or cfg.clip_ratio}
    if cfg.clip_ratio_c is not None:
        clip["clip_ratio_c"] = cfg.clip_ratio_c
    device = next(model.parameters()).device
    group_tokens = sum(b.policy_tokens for b in group)
    group_segments = sum(len(b.segments) for b in group)
    optimizer.zero_grad(set_to_none=True)
    for i, b in enumerate(group):
        lp = token_logprobs(model, b, temperature, cfg.tree_attention, cfg.dtype)
        if before is not None:
            before.append(lp.detach())
        out = loss_fn(
            lp,
            b.old_logprobs.to(device),
            b.advantages.to(device),
            b.segment_ids.to(device),
            aggregation=cfg.aggregation,
            ref_logprobs=None if refs is None else refs[i],
            kl_coef=cfg.kl_coef,
            num_tokens=group_tokens,
            num_segments=group_segments,
            **clip,
        )
        out.loss.backward()
        share = b.policy_tokens / group_tokens  # token-weighted means across micro-batches
        sums["loss"] += out.loss.item()
        sums["pg_loss"] += out.pg_loss.item()
        for k in ("clip_frac", "kl", "approx_kl"):
            sums[k] += getattr(out, k).item() * share
    limit = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(params, limit)
    sums["grad_norm"] += float(norm)
    if math.isfinite(float(norm)):
        optimizer.step()
    else:
        sums["skipped_steps"] += 1
    optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def _bound_step(
    params: list[torch.nn.Parameter], start: list[torch.Tensor], measure, kl: float, limit: float
) -> tuple[float, float]:
    """Move `params` from the end of the step back towards `start` (their values before it) until `measure()`
    (the step's KL) is at most `limit`; returns (that KL, the share of the step kept). `start` is overwritten with
    the step (after - before), so the bound costs one copy of the parameters."""
    for p, d in zip(params, start):
        d.sub_(p).neg_()  # d = p - start: the step
    scale = 1.0
    for _ in range(MAX_BACKTRACKS):
        # KL grows as the square of the share for a small step: aim just under the limit, shrink by 10x at most
        new = scale * min(max(0.95 * math.sqrt(limit / kl), 0.1), 0.9)
        for p, d in zip(params, start):
            p.add_(d, alpha=new - scale)
        scale, kl = new, measure()
        if kl <= limit:
            return kl, scale
    for p, d in zip(params, start):
        p.sub_(d, alpha=scale)  # still over the limit: the step is undone
    return 0.0, 0.0


def _update_kl(
    model,
    batches: list[PackedBatch],
    before: list[torch.Tensor],
    temperature: float,
    n: int,
    attention: str,
    dtype: str = "float32",
) -> float:
    """Token mean of the k3 estimator of KL(before || after) over the trained tokens, the tokens being samples
    of the sampling policy (= the pre-update policy on-policy), as `approx_kl` estimates the drift."""
    total = 0.0
    with torch.no_grad():
        for b, lp_before in zip(batches, before):
            log_ratio = (token_logprobs(model, b, temperature, attention, dtype) - lp_before).clamp(-KL_CLAMP, KL_CLAMP)
            total += float((torch.exp(log_ratio) - log_ratio - 1).sum())
    return total / max(n, 1)
