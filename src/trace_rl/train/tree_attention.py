"""Attention under a tree mask, stored by structure: which node each token belongs to and which nodes are
ancestors of which. A query may attend to a key when the key's node is an ancestor-or-self of the query's
node and the key is not later in the row (parents precede children in the row).

Kernels (`KERNELS`; "auto" picks flex on CUDA, blocks elsewhere):
- "blocks": block-sparse attention by gathering. The row is cut into blocks of `BLOCK` tokens; for each query
  block the key blocks that hold at least one visible key are gathered and SDPA runs on the query block
  against them with the exact boolean mask. Query blocks are bucketed by how many key blocks they need
  (powers of two), each bucket padded to its own largest count. Work and memory grow with row length x
  (root-to-leaf context + block waste), not with the row length squared, so several trees can share a row
  at no attention cost to each other. Costs: the gathered keys and values (a copy per query block, kept for
  the backward, about work / BLOCK rows), a plan built once per micro-batch (cached on the mask), and the
  masked pairs inside gathered blocks. Plain torch ops, any device.
- "flex": torch's flex attention with a BlockMask built from the same structure (block-sparse and fused
  when compiled; compiled on CUDA). On CPU torch runs it unfused (materialising the scores) and has no
  backward, so there it serves forward-only checks.
- "dense": the (T, T) mask built in full and passed, as an additive float mask, to the model's own attention
  (eager or sdpa). Attention costs the row length squared; kept as the reference and for models whose
  attention cannot be replaced.

"blocks" and "flex" replace the model's attention function for the duration of one forward, through the
Hugging Face attention interface (registered as "trace_tree"; the model's `_attn_implementation` is set
and restored around the call), so they work for any model that dispatches attention through that
interface (Llama, Qwen2/3, Mistral, ... in transformers 5). Dropout, soft-capping, sliding windows and
attention sinks are not supported by them: a layer that asks for one is refused in one line (the update
runs with dropout off).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

KERNELS = ("auto", "blocks", "flex", "dense")
BLOCK = 64  # tokens per block of the "blocks" kernel: smaller wastes less at node edges, larger runs fewer SDPA groups
IMPL = "trace_tree"


@dataclass
class TreeMask:
    """node: (B, T) long, the node (entry) index of each token, global over the batch; ancestors: (E, E) bool,
    ancestor-or-self between entries. Padding tokens belong to a padding entry of their own row, which is its
    own only ancestor (they attend to earlier padding only: no query row is fully masked)."""

    node: torch.Tensor
    ancestors: torch.Tensor
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def dense(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(B, 1, T, T) bool, True = may attend."""
        node, anc = self.node.to(device), self.ancestors.to(device)
        T = node.shape[1]
        causal = torch.ones((T, T), dtype=torch.bool, device=device).tril()
        return (anc[node[:, :, None], node[:, None, :]] & causal)[:, None]

    def blocks(self, device: torch.device | str, size: int = BLOCK) -> BlockPlan:
        """Plan of the "blocks" kernel, cached."""
        key = ("blocks", str(device), size)
        if key not in self._cache:
            self._cache[key] = _block_plan(self.node.to(device), self.ancestors.to(device), size)
        return self._cache[key]

    def block_mask(self, device: torch.device | str, size: int = 128):
        """flex attention's BlockMask of this mask, cached."""
        key = ("flex", str(device), size)
        if key not in self._cache:
            from torch.nn.attention.flex_attention import create_block_mask

            node, anc = self.node.to(device), self.ancestors.to(device)

            def visible(b, h, q, k):
                return anc[node[b, q], node[b, k]] & (k <= q)

            B, T = node.shape
            self._cache[key] = create_block_mask(visible, B, None, T, T, device=device, BLOCK_SIZE=size)
        return self._cache[key]


@dataclass
class BlockPlan:
    """The "blocks" kernel's plan: query blocks (G = B x blocks per row) in buckets by how many key blocks
    they need, each bucket padded to its own largest count (powers of two: at most 2x the needed work)."""

    size: int  # tokens per block
    groups: int  # G
    buckets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (query blocks (Gb,), key blocks (Gb, M), mask)
    inverse: torch.Tensor | None  # puts the buckets' outputs back in query-block order; None: one bucket, in order
    _additive: dict = field(default_factory=dict, repr=False, compare=False)

    def additive(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """The buckets' masks as additive float masks (0 / -inf), cached: SDPA converts a boolean mask into
        one on every call, that is per layer, forward and backward."""
        if dtype not in self._additive:
            self._additive[dtype] = [
                torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, float("-inf"))
                for _, _, m in self.buckets
            ]
        return self._additive[dtype]


def _block_plan(node: torch.Tensor, anc: torch.Tensor, size: int) -> BlockPlan:
    B, T = node.shape
    dev = node.device
    nb = math.ceil(T / size)
    tp, G = nb * size, B * nb
    E = anc.shape[0]
    # tokens added to reach whole blocks get an extra entry that only sees itself (their output is dropped)
    anc = F.pad(anc, (0, 1, 0, 1))
    anc[E, E] = True
    flat = F.pad(node, (0, tp - T), value=E).reshape(-1)  # entry of each token of the padded rows
    # block i needs key block j (j <= i) when some entry of i has an ancestor in j: exact for j < i, since all
    # of j's keys precede all of i's queries; the diagonal block always holds the query itself
    has = torch.zeros((G, E + 1), dtype=torch.float32, device=dev)
    has[torch.arange(G, device=dev).repeat_interleave(size), flat] = 1.0
    has = has.view(B, nb, E + 1)
    need = torch.einsum("bie,ef,bjf->bij", has, anc.float(), has) > 0
    need = (need & torch.ones((nb, nb), dtype=torch.bool, device=dev).tril()).reshape(G, nb)
    count = need.sum(-1)  # (G,)
    bucket = torch.ceil(torch.log2(count.float())).long()
    ar, within = torch.arange(nb, device=dev), torch.arange(size, device=dev)
    buckets = []
    for k in bucket.unique().tolist():
        qb = (bucket == k).nonzero()[:, 0]
        M = int(count[qb].max())
        # needed blocks first, in row order; the rest pad the list up to M and are masked out
        order = torch.where(need[qb], ar, ar + nb).argsort(-1)[:, :M]  # (Gb, M)
        valid = torch.arange(M, device=dev) < count[qb, None]
        kidx = ((qb // nb * tp)[:, None, None] + order[..., None] * size + within).reshape(len(qb), M * size)
        qidx = qb[:, None] * size + within  # flat token index of each query (G x size = B x tp)
        # each query's ancestor row, then the keys' entries picked out of it (a gather: much cheaper than
        # indexing the (E, E) matrix with two broadcast index tensors)
        keys = flat[kidx][:, None, :].expand(len(qb), size, M * size)
        mask = anc[flat[qidx]].gather(-1, keys) & (kidx[:, None, :] <= qidx[:, :, None])
        mask &= valid.repeat_interleave(size, -1)[:, None, :]
        buckets.append((qb, (qb // nb * nb)[:, None] + order, mask[:, None]))  # key blocks, numbered as G
    order = torch.cat([qb for qb, _, _ in buckets])
    inverse = None if len(buckets) == 1 else order.argsort()
    return BlockPlan(size, G, buckets, inverse)


def _blocks_attention(query, key, value, tree: TreeMask, scaling: float | None) -> torch.Tensor:
    B, H, T, d = query.shape
    plan = tree.blocks(query.device, BLOCK)  # BLOCK read at call time (tests shrink it)
    S, G = plan.size, plan.groups
    nb = G // B
    pad = nb * S - T
    q = F.pad(query, (0, 0, 0, pad)).view(B, H, nb, S, d).transpose(1, 2).reshape(G, H, S, d)
    hk = key.shape[1]
    # whole key blocks (S tokens x Hk x d) are gathered: index_select's backward, an index_add, then adds a
    # few hundred block-sized slices rather than one small row per key token (slow on CPU)
    k_blocks = F.pad(key, (0, 0, 0, pad)).transpose(1, 2).reshape(G, S, hk, d)
    v_blocks = F.pad(value, (0, 0, 0, pad)).transpose(1, 2).reshape(G, S, hk, d)
    outs = []
    for (qb, kb, _), mask in zip(plan.buckets, plan.additive(query.dtype)):
        k, v = (x.index_select(0, kb.view(-1)).view(len(qb), -1, hk, d).transpose(1, 2) for x in (k_blocks, v_blocks))
        if hk != H:  # grouped-query attention: SDPA's enable_gqa is not taken by every kernel with a mask
            k, v = k.repeat_interleave(H // hk, dim=1), v.repeat_interleave(H // hk, dim=1)
        qs = q if plan.inverse is None else q.index_select(0, qb)
        outs.append(F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scaling))  # (Gb, H, S, d)
    out = outs[0] if plan.inverse is None else torch.cat(outs).index_select(0, plan.inverse)
    return out.view(B, nb, H, S, d).permute(0, 1, 3, 2, 4).reshape(B, nb * S, H, d)[:, :T]


_COMPILED: dict[str, object] = {}


def _flex_attention(query, key, value, tree: TreeMask, scaling: float | None) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention
    if query.is_cuda:  # compiled: the fused, block-sparse kernel (eager flex materialises the scores)
        if "flex" not in _COMPILED:
            _COMPILED["flex"] = torch.compile(flex_attention, dynamic=True)
        fn = _COMPILED["flex"]
    gqa = key.shape[1] != query.shape[1]
    out = fn(query, key, value, block_mask=tree.block_mask(query.device), scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2)


def _forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """Attention function in the Hugging Face interface's signature; returns ((B, T, H, d), None)."""
    tree, kernel = kwargs.get("tree_mask"), kwargs.get("tree_kernel")
    if tree is None or kernel not in ("blocks", "flex"):
        raise ValueError("trace_tree attention runs only inside packing.token_logprobs() (it passes the tree mask)")
    if dropout:
        raise ValueError("tree attention does not support attention dropout (run the update in eval mode)")
    if kwargs.get("sliding_window") or kwargs.get("softcap") or getattr(module, "sinks", None) is not None:
        # the result would silently differ from the model's own attention: refuse, name the way out
        raise ValueError("tree attention: no sliding windows, soft-capping or sinks (set tree_attention=dense)")
    attend = _blocks_attention if kernel == "blocks" else _flex_attention
    return attend(query, key, value, tree, scaling), None


def resolve_kernel(kernel: str, device: torch.device) -> str:
    if kernel not in KERNELS:
        raise ValueError(f"tree_attention must be one of {KERNELS}, got {kernel!r}")
    if kernel == "auto":
        return "flex" if device.type == "cuda" else "blocks"
    return kernel


@contextlib.contextmanager
def tree_attention(model) -> Iterator[None]:
    """The model's attention dispatched to this module's kernels while inside (restored after)."""
    from transformers import AttentionInterface

    if IMPL not in AttentionInterface._global_mapping:
        AttentionInterface.register(IMPL, _forward)
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = IMPL
    try:
        yield
    finally:
        config._attn_implementation = before
