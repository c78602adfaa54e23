"""Tree-packed forward: each token of a rollout tree is encoded once per update, each turn node trained once.

A tree's nodes are laid out in depth-first order in one row; a tree attention mask lets a token attend to the
tokens of its node's ancestors and to the earlier tokens of its own node, and `position_ids` give each token
its position along its own root-to-leaf path, so every token sees exactly the context it had when sampled.
The logits that predict a node's first token come from the last token of its parent, which is not the
previous token of the row: targets are therefore gathered at explicit positions. Tree parts are packed
first-fit decreasing into rows of at most `max_tokens` tokens (several trees per row, one row per
micro-batch; or, for the dense mask, one tree part per row with rows right-padded into micro-batches).

The flat layout (`pack_paths`) is the baseline: one right-padded row per root-to-leaf path through the
standard causal mask, so a prefix shared by k leaves is encoded k times; each node is still trained once, on
the first path (depth-first) that contains it.

Both layouts take the paths, the node validation and the weighting of a shared node from `trace_rl.paths`
(stated there once). A node is trained once in either layout, with its advantage times its total weight
(`paths.node_weights`): 1 under weighting="first" (the default) and "split", which are then the same update,
and k, the paths through it, under "leaf". Folding the weight into the advantage is exact for the losses of
`train.losses` (PPO clip, dual clip and plain PG scale with the advantage for either sign); the KL term to a
reference model is not weighted.

Trade-offs and limits:
- The mask is kept by structure (`tree_attention.TreeMask`: each token's node, the nodes' ancestor matrix)
  and applied by one of `tree_attention`'s kernels. With the block-sparse ones ("blocks", "flex") attention
  work grows with row length x root-to-leaf context, so trees can share rows; with "dense" it grows with the
  row length squared (more than the sum over the tree's paths), so each tree gets its own row, and the
  model must use eager or sdpa attention (checked); the block-sparse kernels replace the model's attention
  function for the call, so they do not depend on its `attn_implementation`.
- A tree larger than `max_tokens` is split into parts: a node's children subtrees that do not fit become
  parts of their own, each preceded by a context-only copy of its ancestors (encoded again, not trained). A
  single root-to-node context longer than `max_tokens` still forms one (oversized) part: a path cannot be
  cut without losing context.
- Subtrees holding no trained node (no advantage, or no policy token) are left out.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..paths import check_node, check_weighting, copy_weights, node_weights, tree_paths
from ..tree import ROOT, RolloutTree, TurnNode
from .tree_attention import TreeMask, resolve_kernel, tree_attention

Key = tuple[int, str]  # (tree index, node id): one segment, the policy tokens of one turn node


@dataclass
class PackedBatch:
    """One micro-batch: model inputs plus, per policy token, where its logits are and what to train it with."""

    input_ids: torch.Tensor  # (B, T) long; tree layout has B = 1
    position_ids: torch.Tensor  # (B, T) long: position along the token's own root-to-leaf path
    attention_mask: torch.Tensor | None  # flat: (B, T) padding mask; tree: None (see `tree`)
    target_rows: torch.Tensor  # (P,) row of each policy token
    target_positions: torch.Tensor  # (P,) column whose logits predict the policy token
    target_ids: torch.Tensor  # (P,) the policy token
    old_logprobs: torch.Tensor  # (P,) float32 sampling log-probs stored in the tree
    advantages: torch.Tensor  # (P,) float32, the advantage of the token's node
    segment_ids: torch.Tensor  # (P,) long, index into `segments`
    segments: list[Key]  # the turn node of each segment id
    encoded_tokens: int  # non-padding tokens run through the model
    tree: TreeMask | None = None  # tree layout: who may attend to whom, by node (dense form: tree.dense())

    @property
    def policy_tokens(self) -> int:
        return int(self.target_ids.numel())

    def by_segment(self, values: torch.Tensor) -> dict[Key, torch.Tensor]:
        """Split per-token `values` (in target order) into one tensor per turn node."""
        return {key: values[self.segment_ids == i] for i, key in enumerate(self.segments)}


def _is_trained(node: TurnNode, adv: dict[str, float]) -> bool:
    return node.node_id in adv and node.origin != ROOT and any(node.loss_mask)


def _trained_paths(tree: RolloutTree, adv: dict[str, float]) -> list[list[TurnNode]]:
    """The tree's root-to-leaf paths cut to the part that holds a trained node (validated in `paths`)."""
    return tree_paths(tree, keep=lambda n: _is_trained(n, adv))


def _weighted(tree: RolloutTree, adv: dict[str, float], weighting: str) -> dict[str, float]:
    """Each trained node's advantage times its total weight under `weighting` (trace_rl.paths)."""
    for node in tree.nodes.values():
        if _is_trained(node, adv):
            check_node(node, need_logprobs=True)  # the ratio needs the sampling log-prob of every policy token
    weights = node_weights(_trained_paths(tree, adv), weighting)
    return {nid: float(a) * weights.get(nid, 1.0) for nid, a in adv.items()}


# An entry of a row layout: (tree index, node, trained here, index of the parent entry or -1).
Entry = tuple[int, TurnNode, bool, int]


def _tree_units(ti: int, tree: RolloutTree, adv: dict[str, float], max_tokens: int) -> list[list[Entry]]:
    """Split one tree into parts of at most max_tokens tokens (context copies included), depth-first."""
    kept = {n.node_id for path in _trained_paths(tree, adv) for n in path}
    needed = {nid: nid in kept for nid in tree.nodes}
    size: dict[str, int] = {}
    for node in sorted(tree.nodes.values(), key=lambda n: -n.depth):
        size[node.node_id] = len(node.token_ids) + sum(size[c] for c in node.children if needed[c])

    def subtree(node: TurnNode, parent: int, out: list[Entry]) -> None:
        out.append((ti, node, _is_trained(node, adv), parent))
        me = len(out) - 1
        for c in node.children:
            if needed[c]:
                subtree(tree[c], me, out)

    def split(node: TurnNode, context: list[TurnNode]) -> list[list[Entry]]:
        unit: list[Entry] = [(ti, n, False, i - 1) for i, n in enumerate(context)]
        used = sum(len(n.token_ids) for n in context)
        if used + size[node.node_id] <= max_tokens:
            subtree(node, len(unit) - 1, unit)
            return [unit]
        unit.append((ti, node, _is_trained(node, adv), len(unit) - 1))
        me, used, rest = len(unit) - 1, used + len(node.token_ids), []
        for c in node.children:
            if not needed[c]:
                continue
            if used + size[c] <= max_tokens:
                subtree(tree[c], me, unit)
                used += size[c]
            else:
                rest += split(tree[c], context + [node])
        return ([unit] if any(e[2] for e in unit) else []) + rest

    return split(tree.root, []) if needed[tree.root_id] else []


def _targets(entries: list[Entry], offsets: list[int], last: list[int], adv: list[dict[str, float]], row: int):
    """Per policy token of the trained entries: row, predicting column, token, old log-prob, advantage, segment."""
    cols: dict[str, list] = {k: [] for k in ("rows", "pos", "ids", "old", "adv", "seg")}
    segments: list[Key] = []
    for e, (ti, node, trained, parent) in enumerate(entries):
        if not trained:
            continue
        seg = len(segments)
        segments.append((ti, node.node_id))
        lp = iter(node.logprobs)
        for j, (tok, m) in enumerate(zip(node.token_ids, node.loss_mask)):
            if not m:
                continue
            src = offsets[e] + j - 1 if j else (last[parent] if parent >= 0 else -1)
            if src < 0:
                raise ValueError(f"tree {ti}, node {node.node_id!r}: a policy token has no context to predict it from")
            cols["rows"].append(row)
            cols["pos"].append(src)
            cols["ids"].append(tok)
            cols["old"].append(next(lp))
            cols["adv"].append(float(adv[ti][node.node_id]))
            cols["seg"].append(seg)
    return cols, segments


def _tree_row(entries: list[Entry]):
    """(ids, positions, (E, E) ancestor-or-self, (L,) entry of each token, offsets, last token index per entry)
    of entries laid out in one row (one or several tree parts; parents precede children)."""
    offsets, last, pos0, ids = [], [], [], []
    for _ti, node, _, parent in entries:
        offsets.append(len(ids))
        pos0.append(pos0[parent] + len(entries[parent][1].token_ids) if parent >= 0 else 0)
        ids.extend(node.token_ids)
        last.append(len(ids) - 1 if node.token_ids else (last[parent] if parent >= 0 else -1))
    E, L = len(entries), len(ids)
    # ancestor-or-self relation between entries; parents precede children, so one pass over entries suffices
    anc = torch.zeros((E, E), dtype=torch.bool)
    for e, (_, _, _, parent) in enumerate(entries):
        if parent >= 0:
            anc[e] = anc[parent]
        anc[e, e] = True
    lengths = torch.tensor([len(n.token_ids) for _, n, _, _ in entries], dtype=torch.long)
    token_entry = torch.repeat_interleave(torch.arange(E), lengths)
    within = torch.arange(L) - torch.tensor(offsets, dtype=torch.long)[token_entry]
    positions = torch.tensor(pos0, dtype=torch.long)[token_entry] + within
    return ids, positions, anc, token_entry, offsets, last


def _tree_batch(rows: list[list[Entry]], advantages: list[dict[str, float]]) -> PackedBatch:
    laid = [_tree_row(r) for r in rows]
    width = max(len(x[0]) for x in laid)
    input_ids = torch.zeros((len(rows), width), dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    # entries numbered over the batch, then one padding entry per row (its own only ancestor: a padding
    # token attends to earlier padding of its row, so no query row is fully masked, a softmax over nothing)
    sizes = [x[2].shape[0] for x in laid]
    total = sum(sizes) + len(rows)
    ancestors = torch.zeros((total, total), dtype=torch.bool)
    node = torch.empty((len(rows), width), dtype=torch.long)
    cols: dict[str, list] = {k: [] for k in ("rows", "pos", "ids", "old", "adv", "seg")}
    segments: list[Key] = []
    base = 0
    for r, (entries, (ids, positions, anc, token_entry, offsets, last)) in enumerate(zip(rows, laid)):
        n, e = len(ids), anc.shape[0]
        input_ids[r, :n] = torch.tensor(ids, dtype=torch.long)
        position_ids[r, :n] = positions
        ancestors[base : base + e, base : base + e] = anc
        pad = sum(sizes) + r
        ancestors[pad, pad] = True
        node[r] = pad
        node[r, :n] = token_entry + base
        base += e
        row_cols, row_segs = _targets(entries, offsets, last, advantages, r)
        row_cols["seg"] = [s + len(segments) for s in row_cols["seg"]]
        for k in cols:
            cols[k] += row_cols[k]
        segments += row_segs
    encoded = sum(len(x[0]) for x in laid)
    return _batch(input_ids, position_ids, None, cols, segments, encoded, TreeMask(node, ancestors))


def _batch(input_ids, position_ids, mask, cols, segments, encoded, tree=None) -> PackedBatch:
    return PackedBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=mask,
        target_rows=torch.tensor(cols["rows"], dtype=torch.long),
        target_positions=torch.tensor(cols["pos"], dtype=torch.long),
        target_ids=torch.tensor(cols["ids"], dtype=torch.long),
        old_logprobs=torch.tensor(cols["old"], dtype=torch.float32),
        advantages=torch.tensor(cols["adv"], dtype=torch.float32),
        segment_ids=torch.tensor(cols["seg"], dtype=torch.long),
        segments=segments,
        encoded_tokens=encoded,
        tree=tree,
    )


def _check_args(
    trees: list[RolloutTree], advantages: list[dict[str, float]], max_tokens: int, weighting: str
) -> list[dict[str, float]]:
    """Validated arguments; returns each tree's advantages times the nodes' weights."""
    if len(trees) != len(advantages):
        raise ValueError(f"advantages must have one dict per tree, got {len(advantages)} for {len(trees)} trees")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    check_weighting(weighting)
    return [_weighted(t, a, weighting) for t, a in zip(trees, advantages)]


def _group(rows: list[list[Entry]], max_tokens: int) -> list[list[list[Entry]]]:
    """Rows sorted by length (longest first, ties in order) and grouped while rows x longest row stays
    within max_tokens; a longer row is a micro-batch of its own. Sorting keeps padding small."""
    size = [sum(len(e[1].token_ids) for e in r) for r in rows]
    groups: list[list[list[Entry]]] = []
    width = 0
    for i in sorted(range(len(rows)), key=lambda i: -size[i]):
        if groups and width * (len(groups[-1]) + 1) <= max_tokens:
            groups[-1].append(rows[i])  # sorted, so the group's width is its first row's
        else:
            groups.append([rows[i]])
            width = size[i]
    return groups


def _bins(units: list[list[Entry]], max_tokens: int) -> list[list[Entry]]:
    """Tree parts packed into rows of at most max_tokens tokens, first-fit decreasing (a part longer than
    max_tokens gets a row of its own); a part's parent indices are shifted to its place in the row."""
    size = [sum(len(e[1].token_ids) for e in u) for u in units]
    rows: list[list[Entry]] = []
    free: list[int] = []
    for i in sorted(range(len(units)), key=lambda i: -size[i]):
        r = next((r for r, f in enumerate(free) if size[i] <= f), len(rows))
        if r == len(rows):
            rows.append([])
            free.append(max_tokens)
        shift = len(rows[r])
        rows[r] += [(ti, n, t, p + shift if p >= 0 else -1) for ti, n, t, p in units[i]]
        free[r] -= size[i]
    return rows


def pack_trees(
    trees: list[RolloutTree],
    advantages: list[dict[str, float]],
    max_tokens: int = 4096,
    weighting: str = "first",
    share_rows: bool = True,
) -> list[PackedBatch]:
    """Tree layout. share_rows=True (for the block-sparse kernels): tree parts packed first-fit decreasing
    into rows of at most `max_tokens` tokens, one row per micro-batch, so rows are full and unpadded.
    share_rows=False (for the dense mask, whose attention work covers every pair of a row, masked or not):
    one tree part per row, rows grouped into micro-batches of at most `max_tokens` padded tokens.
    `weighting`: how a shared node counts (trace_rl.paths)."""
    advantages = _check_args(trees, advantages, max_tokens, weighting)
    units = [unit for ti, tree in enumerate(trees) for unit in _tree_units(ti, tree, advantages[ti], max_tokens)]
    if share_rows:
        return [_tree_batch([row], advantages) for row in _bins(units, max_tokens)]
    return [_tree_batch(g, advantages) for g in _group(units, max_tokens)]


def _paths(ti: int, tree: RolloutTree, adv: dict[str, float]) -> list[list[Entry]]:
    """Root-to-leaf paths of the trained part of a tree; each trained node trained on its first path (the
    copies "first" weighting keeps; the node's total weight is already in `adv`)."""
    paths = _trained_paths(tree, adv)
    return [
        [(ti, n, _is_trained(n, adv) and w > 0, i - 1) for i, (n, w) in enumerate(zip(path, ws))]
        for path, ws in zip(paths, copy_weights(paths, "first"))
    ]


def pack_paths(
    trees: list[RolloutTree], advantages: list[dict[str, float]], max_tokens: int = 4096, weighting: str = "first"
) -> list[PackedBatch]:
    """Flat layout: one right-padded row per root-to-leaf path, grouped into micro-batches of at most
    `max_tokens` padded tokens (a longer path is a micro-batch of its own). `weighting` as in `pack_trees`."""
    advantages = _check_args(trees, advantages, max_tokens, weighting)
    paths = [p for ti, tree in enumerate(trees) for p in _paths(ti, tree, advantages[ti])]
    return [_flat_batch(g, advantages) for g in _group(paths, max_tokens)]


def _flat_batch(paths: list[list[Entry]], advantages: list[dict[str, float]]) -> PackedBatch:
    width = max(sum(len(e[1].token_ids) for e in p) for p in paths)
    input_ids = torch.zeros((len(paths), width), dtype=torch.long)
    mask = torch.zeros((len(paths), width), dtype=torch.long)
    cols: dict[str, list] = {k: [] for k in ("rows", "pos", "ids", "old", "adv", "seg")}
    segments: list[Key] = []
    for r, path in enumerate(paths):
        offsets, last, ids = [], [], []
        for _, node, _, parent in path:
            offsets.append(len(ids))
            ids.extend(node.token_ids)
            last.append(len(ids) - 1 if node.token_ids else (last[parent] if parent >= 0 else -1))
        input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[r, : len(ids)] = 1
        row_cols, row_segs = _targets(path, offsets, last, advantages, r)
        row_cols["seg"] = [s + len(segments) for s in row_cols["seg"]]
        for k in cols:
            cols[k] += row_cols[k]
        segments += row_segs
    positions = torch.arange(width).expand(len(paths), width).clone()
    return _batch(input_ids, positions, mask, cols, segments, int(mask.sum()))


def token_logprobs(
    model, batch: PackedBatch, temperature: float = 1.0, attention: str = "auto", dtype: str = "float32"
) -> torch.Tensor:
    """Log-probs (float32, with grad) of the batch's policy tokens under `model`, in target order, from the
    temperature-scaled distribution (match the sampling temperature, or the ratios are off). `attention`: the
    tree mask's kernel (train.tree_attention.KERNELS); flat batches use the model's causal attention. `dtype`:
    the forward's compute dtype (lm.precision; match the sampler's too)."""
    from ..lm.precision import compute_context

    device = next(model.parameters()).device
    inputs = {"input_ids": batch.input_ids.to(device), "position_ids": batch.position_ids.to(device)}
    context = contextlib.nullcontext()
    if batch.tree is None:
        inputs["attention_mask"] = batch.attention_mask.to(device)
    elif resolve_kernel(attention, device) == "dense":
        impl = getattr(model.config, "_attn_implementation", None)
        if impl not in ("eager", "sdpa"):
            raise ValueError(f"tree packing needs eager or sdpa attention (a dense 4-D mask), the model uses {impl!r}")
        # additive float mask: eager adds it to the scores, sdpa accepts it as is (a bool mask eager would add)
        mask_dtype = model.dtype if dtype == "float32" else getattr(torch, dtype)  # the scores' dtype
        mask = batch.tree.dense(device)
        inputs["attention_mask"] = torch.zeros(mask.shape, dtype=mask_dtype, device=device).masked_fill_(
            ~mask, torch.finfo(mask_dtype).min
        )
    else:
        inputs.update(tree_mask=batch.tree, tree_kernel=resolve_kernel(attention, device))
        context = tree_attention(model)
    # only the columns that predict a policy token go through the LM head (the vocabulary is the big matrix)
    keep, col = torch.unique(batch.target_positions, return_inverse=True)
    with context, compute_context(dtype, device):
        out = model(**inputs, logits_to_keep=keep.to(device), use_cache=False)
    logits = out.logits[batch.target_rows.to(device), col.to(device)].float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(-1, batch.target_ids.to(device)[:, None])[:, 0]


def flat_token_logprobs(
    model, trees: list[RolloutTree], advantages: list[dict[str, float]], temperature: float = 1.0
) -> dict[Key, torch.Tensor]:
    """Reference: every root-to-leaf path as its own unpadded row through the model's default causal
    attention; each trained node's policy-token log-probs taken from the first path holding it."""
    device = next(model.parameters()).device
    out: dict[Key, torch.Tensor] = {}
    for ti, tree in enumerate(trees):
        for leaf in [n for n in tree.nodes.values() if not n.children]:
            path = tree.path(leaf.node_id)
            todo = {n.node_id for n in path if _is_trained(n, advantages[ti]) and (ti, n.node_id) not in out}
            if not todo:
                continue
            ids = [t for n in path for t in n.token_ids]
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0].float()
            logp = torch.log_softmax(logits / temperature, -1)
            start = 0
            for n in path:
                if n.node_id in todo:
                    cols = [start + j - 1 for j, m in enumerate(n.loss_mask) if m]
                    if cols[0] < 0:
                        raise ValueError(f"tree {ti}, node {n.node_id!r}: a policy token has no context")
                    toks = [t for t, m in zip(n.token_ids, n.loss_mask) if m]
                    out[ti, n.node_id] = logp[cols, toks]
                start += len(n.token_ids)
    return out
