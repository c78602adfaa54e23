import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.lm.models import create_tiny_model
from trace_rl.train.packing import flat_token_logprobs, pack_paths, pack_trees, token_logprobs
from trace_rl.tree import BRANCH, RolloutTree

VOCAB = 100


def random_tree(root_id: int, rng: random.Random, depth: int = 4) -> RolloutTree:
    """Chains of turns with branches at several depths; a turn is policy tokens then observation tokens,
    sometimes observation first (policy tokens mid-node) and sometimes no observation."""
    tree = RolloutTree(root_id)
    tree.root.token_ids = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 6))]
    tree.root.loss_mask = [0] * len(tree.root.token_ids)

    def grow(parent: str, d: int) -> None:
        kids = rng.choice([1, 1, 2, 3]) if d < depth else 0
        for k in range(kids):
            pre, pol, post = rng.choice([0, 0, 2]), rng.randint(1, 5), rng.choice([0, 3])
            ids = [rng.randrange(3, VOCAB) for _ in range(pre + pol + post)]
            last = d + 1 == depth or (k and rng.random() < 0.3)
            node = tree.add_turn(
                parent,
                token_ids=ids,
                loss_mask=[0] * pre + [1] * pol + [0] * post,
                logprobs=[-rng.random() * 3 for _ in range(pol)],
                terminal=last,
                reward=float(rng.random() < 0.5) if last else None,
                origin=BRANCH if k else "bare",
            )
            if not last:
                grow(node.node_id, d + 1)

    grow(tree.root_id, 0)
    return tree


@pytest.fixture(scope="module")
def model():
    m, _ = create_tiny_model(hidden=32, layers=2, heads=2)
    return m.float().eval()


@pytest.fixture(scope="module")
def trees():
    rng = random.Random(0)
    return [random_tree(i, rng) for i in range(3)]


def advantages_of(trees, rng=None):
    rng = rng or random.Random(1)
    return [{n.node_id: rng.uniform(-1, 1) for n in t.turns()} for t in trees]


def test_every_node_once_and_tree_tokens_encoded_once(trees):
    adv = advantages_of(trees)
    batches = pack_trees(trees, adv, max_tokens=10_000)
    keys = [k for b in batches for k in b.segments]
    assert sorted(keys) == sorted((i, n.node_id) for i, t in enumerate(trees) for n in t.turns())
    assert sum(b.encoded_tokens for b in batches) == sum(len(n.token_ids) for t in trees for n in t.nodes.values())
    flat = pack_paths(trees, adv, max_tokens=10_000)
    assert sorted(k for b in flat for k in b.segments) == sorted(keys)
    assert sum(b.encoded_tokens for b in flat) == sum(
        len(n.token_ids) for t in trees for leaf in t.leaves() for n in t.path(leaf.node_id)
    )
    for b in batches:
        for i, key in enumerate(b.segments):
            node = trees[key[0]][key[1]]
            sel = b.segment_ids == i
            assert b.old_logprobs[sel].tolist() == pytest.approx(node.logprobs)
            assert b.advantages[sel].tolist() == pytest.approx([adv[key[0]][key[1]]] * len(node.logprobs))


def test_mask_and_positions_follow_the_path():
    tree = RolloutTree(0)
    tree.root.token_ids, tree.root.loss_mask = [5, 6], [0, 0]
    a = tree.add_turn("0", token_ids=[7, 8], loss_mask=[1, 0], logprobs=[-1.0])
    tree.add_turn(a.node_id, token_ids=[9], loss_mask=[1], logprobs=[-1.0], terminal=True, reward=1.0)
    tree.add_turn(a.node_id, token_ids=[10, 11], loss_mask=[1, 1], logprobs=[-1.0, -2.0], terminal=True, reward=0.0)
    (b,) = pack_trees([tree], [{n.node_id: 1.0 for n in tree.turns()}])
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 4, 5]]
    m = b.tree.dense()[0, 0].int().tolist()
    assert m[4] == [1, 1, 1, 1, 1, 0, 0]  # token 9 sees root, its parent, itself
    assert m[5] == [1, 1, 1, 1, 0, 1, 0]  # token 10 does not see its sibling 9
    assert m[6] == [1, 1, 1, 1, 0, 1, 1]
    # 7 is predicted by 6 (col 1); 9 and 10 by the parent's last token 8 (col 3); 11 by 10 (col 5)
    assert b.target_positions.tolist() == [1, 3, 3, 5]
    assert b.target_ids.tolist() == [7, 9, 10, 11]


def weighted_backward(model, trees, per_key):
    """Backward of a fixed random weighting of every policy token's log-prob; returns (grads, log-probs)."""
    model.zero_grad()
    keys = sorted((i, n.node_id) for i, t in enumerate(trees) for n in t.turns())
    gen = torch.Generator().manual_seed(0)
    weights = {k: torch.randn(len(trees[k[0]][k[1]].logprobs), generator=gen) for k in keys}
    sum((weights[k] * v).sum() for k, v in per_key.items()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, {k: v.detach() for k, v in per_key.items()}


@pytest.fixture(scope="module")
def reference(model, trees):
    return weighted_backward(model, trees, flat_token_logprobs(model, trees, advantages_of(trees)))


LAYOUTS = [
    (pack_trees, {"max_tokens": 10_000}, "blocks"),  # all trees share one row
    (pack_trees, {"max_tokens": 24}, "blocks"),  # trees split into parts, parts of several trees share rows
    (pack_trees, {"max_tokens": 10_000, "share_rows": False}, "dense"),  # one tree per row, padded rows
    (pack_trees, {"max_tokens": 24, "share_rows": False}, "dense"),
    (pack_trees, {"max_tokens": 10_000, "share_rows": False}, "blocks"),  # padding rows through the blocks
    (pack_trees, {"max_tokens": 60}, "dense"),  # several trees in a row under the dense mask
    (pack_paths, {"max_tokens": 60}, "auto"),
]


@pytest.mark.parametrize("packer,kwargs,attention", LAYOUTS)
def test_logprobs_and_gradients_match_flat_per_path(model, trees, reference, packer, kwargs, attention):
    ref_grads, ref = reference
    batches = packer(trees, advantages_of(trees), **kwargs)
    if kwargs["max_tokens"] < 10_000:
        assert len(batches) > 1  # several micro-batches; for trees, the split into parts is exercised
    per_key = {}
    for b in batches:
        per_key.update(b.by_segment(token_logprobs(model, b, attention=attention)))
    grads, got = weighted_backward(model, trees, per_key)
    assert got.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], atol=1e-5, rtol=1e-5)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-5, rtol=1e-5)


def test_oversized_path_and_rejects_bad_nodes(trees):
    adv = advantages_of(trees)
    batches = pack_trees(trees, adv, max_tokens=3)
    assert sorted(k for b in batches for k in b.segments) == sorted(
        (i, n.node_id) for i, t in enumerate(trees) for n in t.turns()
    )
    bad = RolloutTree(0)
    bad.root.token_ids, bad.root.loss_mask = [1], [0]
    bad.add_turn("0", token_ids=[2, 3], loss_mask=[1, 1], logprobs=[-1.0])
    with pytest.raises(ValueError, match="2 policy tokens but 1 log-probs"):
        pack_trees([bad], [{"0.0": 1.0}])
    with pytest.raises(ValueError, match="one dict per tree"):
        pack_trees([bad], [])


def test_eager_attention_honours_the_tree_mask(trees, reference):
    m, _ = create_tiny_model(hidden=32, layers=2, heads=2)  # same seed, same weights as the module's model
    m.set_attn_implementation("eager")
    assert m.config._attn_implementation == "eager"
    (b,) = pack_trees(trees, advantages_of(trees), max_tokens=10_000)
    got = b.by_segment(token_logprobs(m.float().eval(), b, attention="dense").detach())
    for k, v in reference[1].items():
        torch.testing.assert_close(got[k], v, atol=1e-5, rtol=1e-5)


def shared_turn_tree() -> tuple[RolloutTree, dict[str, float]]:
    """A prompt, one turn (0.0) and two leaves under it, with advantages: turn 0.0 lies on both paths."""
    tree = RolloutTree(0)
    tree.root.token_ids, tree.root.loss_mask = [5, 6], [0, 0]
    a = tree.add_turn("0", token_ids=[7, 8], loss_mask=[1, 0], logprobs=[-1.0])
    tree.add_turn(a.node_id, token_ids=[9], loss_mask=[1], logprobs=[-1.0], terminal=True, reward=1.0)
    tree.add_turn(a.node_id, token_ids=[10], loss_mask=[1], logprobs=[-1.0], terminal=True, reward=0.0)
    return tree, {"0.0": 0.5, "0.0.0": 1.0, "0.0.1": -1.0}


@pytest.mark.parametrize("weighting,shared", [("first", 1.0), ("split", 1.0), ("leaf", 2.0)])
@pytest.mark.parametrize("packer", [pack_trees, pack_paths])
def test_weighting_of_a_shared_turn_on_a_hand_built_tree(packer, weighting, shared):
    """Turn 0.0 lies on both paths: trained once in either layout, with its advantage times 1, 1 or 2."""
    tree, adv = shared_turn_tree()
    (b,) = packer([tree], [adv], weighting=weighting)
    assert sorted(b.segments) == [(0, "0.0"), (0, "0.0.0"), (0, "0.0.1")]
    got = {key: v.tolist() for key, v in b.by_segment(b.advantages).items()}
    assert got == {(0, "0.0"): [0.5 * shared], (0, "0.0.0"): [1.0], (0, "0.0.1"): [-1.0]}
    with pytest.raises(ValueError, match="weighting must be one of"):
        packer([tree], [adv], weighting="none")


def test_trees_share_rows_first_fit_decreasing(trees):
    adv = advantages_of(trees)
    keys = sorted((i, n.node_id) for i, t in enumerate(trees) for n in t.turns())
    (one,) = pack_trees(trees, adv, max_tokens=10_000)  # every tree fits one row: one row, no padding
    assert one.input_ids.shape[0] == 1 and len({k[0] for k in one.segments}) == len(trees)
    assert one.encoded_tokens == one.input_ids.numel() == sum(len(n.token_ids) for t in trees for n in t.nodes.values())
    batches = pack_trees(trees, adv, max_tokens=80)
    assert sorted(k for b in batches for k in b.segments) == keys
    assert all(b.input_ids.shape[0] == 1 and b.encoded_tokens == b.input_ids.numel() <= 80 for b in batches)
    assert any(len({k[0] for k in b.segments}) > 1 for b in batches)  # parts of different trees share a row

    # a token never attends across the trees (or parts) sharing its row: only within its root's entries
    def roots(b):  # the top ancestor of each token's entry
        anc = b.tree.ancestors
        return (anc & (anc.sum(1) == 1)[None, :]).int().argmax(1)[b.tree.node[0]]

    for b in batches:
        q, k = b.tree.dense()[0, 0].nonzero(as_tuple=True)
        assert torch.equal(roots(b)[q], roots(b)[k])
    assert len(set(roots(one).tolist())) == len(trees)


def scatter_plan(plan, B, T):
    """The dense (B, T, T) mask that the blocks kernel's plan (gathered key indices + mask) stands for."""
    S, G = plan.size, plan.groups
    dense = torch.zeros((G * S, G * S), dtype=torch.bool)
    seen = []
    for qb, kb, mask in plan.buckets:
        kidx = (kb[:, :, None] * S + torch.arange(S)).reshape(len(qb), -1)  # the key tokens of the key blocks
        K = kidx.shape[1]
        q = (qb[:, None] * S + torch.arange(S))[:, :, None].expand(len(qb), S, K)
        k = kidx[:, None, :].expand(len(qb), S, K)
        dense[q[mask[:, 0]], k[mask[:, 0]]] = True
        seen += qb.tolist()
    assert sorted(seen) == list(range(G))  # every query block in exactly one bucket
    dense = dense.view(B, G * S // B, B, G * S // B)
    assert not any(dense[b, :, c].any() for b in range(B) for c in range(B) if b != c)  # rows never mix
    return torch.stack([dense[b, :T, b, :T] for b in range(B)])


def planned_keys(plan) -> int:
    return sum(kb.numel() * plan.size for _, kb, _ in plan.buckets) * plan.size


@pytest.mark.parametrize("share_rows", [True, False])
@pytest.mark.parametrize("size", [4, 8, 64])
def test_block_plan_is_the_dense_mask(trees, share_rows, size):
    for b in pack_trees(trees, advantages_of(trees), max_tokens=80, share_rows=share_rows):
        plan = b.tree.blocks("cpu", size)
        B, T = b.input_ids.shape
        assert torch.equal(scatter_plan(plan, B, T), b.tree.dense()[:, 0])
        if size == 4 and share_rows:
            assert len(plan.buckets) > 1  # query blocks needing few key blocks are not padded to the most
            assert planned_keys(plan) < (T + 3) ** 2  # some key blocks are skipped: the plan is sparse


def test_blocks_kernel_with_small_blocks_matches_flat(model, trees, reference, monkeypatch):
    """Many blocks per row: query blocks gather different key blocks, in several buckets."""
    from trace_rl.train import tree_attention

    monkeypatch.setattr(tree_attention, "BLOCK", 8)
    ref_grads, ref = reference
    per_key = {}
    for b in pack_trees(trees, advantages_of(trees), max_tokens=10_000):
        plan = b.tree.blocks("cpu", 8)
        assert len(plan.buckets) > 1 and planned_keys(plan) < b.input_ids.shape[1] ** 2
        per_key.update(b.by_segment(token_logprobs(model, b, attention="blocks")))
    grads, got = weighted_backward(model, trees, per_key)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], atol=1e-5, rtol=1e-5)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_kernel_forward_matches_flat_on_cpu(model, trees, reference):
    """torch runs flex attention on CPU unfused and forward only: the forward is checked here, the gradients
    on CUDA (next test)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    with torch.no_grad():
        for b in pack_trees(trees, advantages_of(trees), max_tokens=60):
            for k, v in b.by_segment(token_logprobs(model, b, attention="flex")).items():
                torch.testing.assert_close(v, reference[1][k], atol=1e-5, rtol=1e-5)


def assert_packed_matches_flat(m, trees, max_tokens: int, attention: str, tol: float) -> None:
    """Per-token log-probs and gradients of the packed rows (this kernel) equal those of flat rows."""
    ref_grads, ref = weighted_backward(m, trees, flat_token_logprobs(m, trees, advantages_of(trees)))
    per_key = {}
    for b in pack_trees(trees, advantages_of(trees), max_tokens=max_tokens):
        per_key.update(b.by_segment(token_logprobs(m, b, attention=attention)))
    grads, got = weighted_backward(m, trees, per_key)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], atol=tol, rtol=tol)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=tol, rtol=tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex attention has no backward on CPU in torch; needs CUDA")
def test_flex_kernel_logprobs_and_gradients_match_flat_on_cuda(trees):
    m, _ = create_tiny_model(hidden=32, layers=2, heads=2)
    m = m.float().eval().cuda()
    assert_packed_matches_flat(m, trees, max_tokens=60, attention="auto", tol=1e-4)  # auto is flex on CUDA


def test_bad_tree_attention_is_one_line(trees):
    from trace_rl.train.update import UpdateConfig

    with pytest.raises(ValueError, match="tree_attention must be one of"):
        UpdateConfig(tree_attention="sparse")
    (b,) = pack_trees(trees, advantages_of(trees))
    with pytest.raises(ValueError, match="tree_attention must be one of"):
        token_logprobs(create_tiny_model(hidden=32, layers=2, heads=2)[0], b, attention="sparse")


def test_blocks_kernel_with_grouped_query_attention(trees):
    """Fewer key/value heads than query heads: the gathered keys are repeated per group."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa",
    )  # fmt: skip
    m = LlamaForCausalLM(config).float().eval()
    assert_packed_matches_flat(m, trees, max_tokens=80, attention="blocks", tol=1e-5)


def test_tree_kernels_refuse_what_they_do_not_implement(trees):
    """A layer asking for a sliding window (or soft-capping, sinks) would silently differ: refused in one line."""
    from trace_rl.train.tree_attention import _forward

    (b,) = pack_trees(trees, advantages_of(trees))
    q = torch.zeros(1, 2, b.input_ids.shape[1], 4)
    with pytest.raises(ValueError, match="no sliding windows"):
        _forward(torch.nn.Module(), q, q, q, None, tree_mask=b.tree, tree_kernel="blocks", sliding_window=16)
    with pytest.raises(ValueError, match="runs only inside"):
        _forward(torch.nn.Module(), q, q, q, None)
