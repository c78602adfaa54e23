"""The kernel checks of bench/gpu_check.py: the tree-attention kernel against the dense mask, the packed update's
gradients against the flat update's, and the HF backend's KV-cache branching against recomputation, each in
float32 and bfloat16 (autocast over float32 weights, as `update.dtype=bfloat16` runs).

On CUDA the kernel under test is `flex` (compiled flex attention: the default there); on CPU it is `blocks`, the CPU
default, because torch has no flex backward on CPU. So `--device cpu` runs every check's code, not the CUDA kernel.
Models are the project's tiny random Llama (0.82M parameters; the HF check scales its weights for peaked, varied
outputs) on synthetic rollout trees: these check numerics and plumbing, not speed.

Each check returns a row: {"check", "passed", "value" (the measured figure), "tolerance" (the bound, in words), and
"seconds"}. Tolerances: float32 is rounding only (bound 1e-4; 1e-3 for the KV cache, whose batched decode sums in
another order). The bfloat16 bounds are set from the same comparisons measured on CPU under bfloat16 autocast
(2026-12-06, `python bench/gpu_check.py --device cpu`): log-probs 2.0e-3 (bound 0.02), kernel gradients 2.9e-3
relative (bound 0.03), update gradients 4.3e-3 relative (bound 0.05), KV cache 0.16 (bound 0.5: the HF check's
weights are scaled 6x for peaked outputs, so bf16's relative rounding is large in nats; a lost context moves
log-probs by whole nats). A GPU rounds bfloat16 matmuls in another order: a first GPU run that fails only a bf16
bound, by a small factor, says the bound needs a second look before the kernel does.
"""

from __future__ import annotations

import random
import time

# (check, dtype) -> bound; the docstring says where the bfloat16 ones come from
TOL = {
    ("kernel_logprobs", "float32"): 1e-4,  # max |log-prob difference|
    ("kernel_logprobs", "bfloat16"): 0.02,
    ("kernel_grads", "float32"): 1e-4,  # ||g - g_ref|| / ||g_ref|| over every parameter
    ("kernel_grads", "bfloat16"): 0.03,
    ("update_grads", "float32"): 1e-4,
    ("update_grads", "bfloat16"): 0.05,
    ("kv_logprobs", "float32"): 1e-3,  # max |cached - uncached log-prob|
    ("kv_logprobs", "bfloat16"): 0.5,
}
DTYPES = ("float32", "bfloat16")


def row(check: str, passed: bool, value: float, tolerance: str, seconds: float, **extra) -> dict:
    return {"check": check, "passed": bool(passed), "value": value, "tolerance": tolerance, "seconds": seconds, **extra}


def synthetic_trees(count: int, vocab: int, seed: int = 0, depth: int = 4) -> list:
    """Rollout trees with branches at several depths; a turn is policy tokens then observation tokens, sometimes
    observation first and sometimes none, with random sampling log-probs, rewards and origins."""
    from trace_rl.tree import BRANCH, RolloutTree

    rng = random.Random(seed)
    trees = []
    for root_id in range(count):
        tree = RolloutTree(root_id)
        tree.root.token_ids = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 12))]
        tree.root.loss_mask = [0] * len(tree.root.token_ids)
        todo = [(tree.root_id, 0)]
        while todo:
            parent, d = todo.pop()
            for k in range(rng.choice([1, 1, 2, 3]) if d < depth else 0):
                pre, pol, post = rng.choice([0, 0, 2]), rng.randint(2, 8), rng.choice([0, 4])
                last = d + 1 == depth or (k and rng.random() < 0.3)
                node = tree.add_turn(
                    parent,
                    token_ids=[rng.randrange(3, vocab) for _ in range(pre + pol + post)],
                    loss_mask=[0] * pre + [1] * pol + [0] * post,
                    logprobs=[-rng.random() * 3 for _ in range(pol)],
                    terminal=last,
                    reward=float(rng.random() < 0.5) if last else None,
                    origin=BRANCH if k else "bare",
                )
                if not last:
                    todo.append((node.node_id, d + 1))
        trees.append(tree)
    return trees


def random_advantages(trees: list, seed: int = 1) -> list[dict[str, float]]:
    rng = random.Random(seed)
    return [{n.node_id: rng.uniform(-1, 1) for n in t.turns()} for t in trees]


def _rel(got: list, ref: list) -> float:
    """||got - ref|| / ||ref|| over lists of tensors, in float64."""
    num = sum(float((g.double() - r.double()).pow(2).sum()) for g, r in zip(got, ref))
    den = sum(float(r.double().pow(2).sum()) for r in ref)
    return (num / max(den, 1e-30)) ** 0.5


def _tiny(device: str, scale: float = 1.0):
    import torch

    from trace_rl.lm.models import create_tiny_model

    model, tok = create_tiny_model(seed=0)
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(scale)
    return model.float().eval().to(device), tok


def _kernel_pass(model, batches, attention: str, dtype: str, weights: list):
    """Log-probs (concatenated) and parameter gradients of a fixed weighting of them, through one kernel."""
    import torch

    from trace_rl.train.packing import token_logprobs

    model.zero_grad(set_to_none=True)
    lps = [token_logprobs(model, b, attention=attention, dtype=dtype) for b in batches]
    sum((w * lp).sum() for w, lp in zip(weights, lps)).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    return torch.cat([lp.detach() for lp in lps]), grads


def kernel_vs_dense(device: str) -> list[dict]:
    """The tree-attention kernel (flex on CUDA, blocks on CPU) against the dense mask on the same packed rows:
    log-probs (forward) and gradients (backward) in each dtype."""
    import torch

    from trace_rl.train.packing import pack_trees

    kernel = "flex" if device.startswith("cuda") else "blocks"
    model, tok = _tiny(device)
    trees = synthetic_trees(6 if kernel == "flex" else 3, len(tok))  # fewer on CPU: its bf16 autocast is slow
    batches = pack_trees(trees, random_advantages(trees), max_tokens=96)  # several rows, trees split across rows
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(b.policy_tokens, generator=gen).to(device) for b in batches]
    out = []
    for dtype in DTYPES:
        t0 = time.perf_counter()
        lp_ref, g_ref = _kernel_pass(model, batches, "dense", dtype, weights)
        lp, g = _kernel_pass(model, batches, kernel, dtype, weights)
        secs = time.perf_counter() - t0
        gap, rel = float((lp - lp_ref).abs().max()), _rel(g, g_ref)
        tol_lp, tol_g = TOL["kernel_logprobs", dtype], TOL["kernel_grads", dtype]
        tokens = int(lp.numel())
        out.append(row(f"{kernel} vs dense mask: log-probs, {dtype}", gap <= tol_lp, gap, f"max abs <= {tol_lp:g}",
                       secs, tokens=tokens))  # fmt: skip
        out.append(row(f"{kernel} vs dense mask: gradients, {dtype}", rel <= tol_g, rel, f"relative <= {tol_g:g}",
                       0.0, tokens=tokens))  # fmt: skip
    return out


def _grad_tap(params):
    """An optimizer whose step records the gradients it is handed and leaves the parameters alone, so the real
    update (`update_policy`: packing, loss, accumulation) runs end to end and its gradients can be compared."""
    import torch

    class GradTap(torch.optim.Optimizer):
        def __init__(self, ps):
            super().__init__(ps, {"lr": 0.0})
            self.grads: list = []

        def step(self, closure=None):
            self.grads = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]

    return GradTap(params)


def packed_vs_flat_update(device: str) -> list[dict]:
    """`update_policy` with packing=tree (kernel auto: flex on CUDA, blocks on CPU) against packing=flat (one row
    per root-to-leaf path, the model's causal attention): the gradients the optimizer step receives, per dtype.
    Clipping, the step-KL bound and the reference model are off, so the gradients are the loss's alone."""
    from trace_rl.train.update import UpdateConfig, update_policy

    model, tok = _tiny(device)
    trees = synthetic_trees(6 if device.startswith("cuda") else 3, len(tok), seed=2)
    adv = random_advantages(trees, seed=3)
    out = []
    for dtype in DTYPES:
        t0, grads, losses = time.perf_counter(), {}, {}
        for packing in ("flat", "tree"):
            cfg = UpdateConfig(packing=packing, dtype=dtype, max_grad_norm=0.0, max_update_kl=0.0,
                               micro_batch_tokens=128)  # fmt: skip
            tap = _grad_tap(model.parameters())
            metrics = update_policy(model, tap, trees, adv, cfg)
            grads[packing], losses[packing] = tap.grads, metrics["train/loss"]
        rel = _rel(grads["tree"], grads["flat"])
        tol = TOL["update_grads", dtype]
        out.append(row(f"packed update vs flat update: gradients, {dtype}", rel <= tol, rel, f"relative <= {tol:g}",
                       time.perf_counter() - t0, loss_tree=losses["tree"], loss_flat=losses["flat"]))  # fmt: skip
    return out


def _uncached(model, prompt: list[int], gen, dtype: str, device: str) -> list[float]:
    import torch

    from trace_rl.lm.precision import compute_context

    ids = torch.tensor([prompt + gen.token_ids], device=device)
    with torch.no_grad(), compute_context(dtype, device):
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(gen.token_ids)]


def kv_branching(device: str) -> list[dict]:
    """The HF backend's cached sampling (a shared prefix encoded once, k continuations branched off its KV cache,
    a next turn that encodes only its new tokens, a fork from an earlier turn) against an uncached forward over the
    same tokens in the same dtype; the cache must have been used (prefix tokens computed < prompt tokens)."""
    from trace_rl.backends.base import SamplingParams
    from trace_rl.backends.hf import HFBackend

    model, tok = _tiny(device, scale=6.0)
    enc = lambda text: tok(text, add_special_tokens=False).input_ids
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    out = []
    for dtype in DTYPES:
        t0 = time.perf_counter()
        backend = HFBackend(model, tok, compute_dtype=dtype)
        shared = enc("a system prompt and a question about numbers " * 3)
        prompts = [shared + enc(" then turn one"), shared + enc(" then another turn"), shared]
        rows = list(zip(prompts, backend.generate(prompts * 2, params, seed=0)))
        turn2 = [p + g.token_ids + enc(" observation") for p, g in rows[:3]]
        rows += list(zip(turn2, backend.generate(turn2, params, seed=1)))
        fork = rows[1][0] + rows[1][1].token_ids + enc(" other")
        rows += list(zip([fork] * 2, backend.generate([fork] * 2, params, seed=2)))
        computed = sum(g.prefix_tokens_computed for _, g in rows)
        prompt_tokens = sum(len(p) for p, _ in rows)
        gaps = [abs(a - b) for p, g in rows for a, b in zip(_uncached(model, p, g, dtype, device), g.logprobs)]
        gap, tol = max(gaps, default=float("inf")), TOL["kv_logprobs", dtype]
        used = computed < prompt_tokens
        out.append(row(f"HF backend KV branching vs recomputation, {dtype}", gap <= tol and used, gap,
                       f"max abs <= {tol:g}; cache used", time.perf_counter() - t0, tokens=len(gaps),
                       prefix_tokens_computed=computed, prompt_tokens=prompt_tokens))  # fmt: skip
    return out


def all_checks(device: str) -> list[dict]:
    return kernel_vs_dense(device) + packed_vs_flat_update(device) + kv_branching(device)
