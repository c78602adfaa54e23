"""The baselines reproduce their authors' code: Tree-GRPO and TreePO advantages (Knapsack RL's allocation:
test_knapsack.py; VIP's: test_vip.py).

Upstream code read for these tests (hand cases below follow it line by line, and the numpy ports are
faithful transcriptions of it, torch replaced by numpy):
- Tree-GRPO: github.com/AMAP-ML/Tree-GRPO @ 90b170995d996d772d68117e0c7bd0b8fe00d393,
  verl/trainer/ppo/core_algos.py `compute_grpo_outcome_advantage` (a group of one: mean 0, std 1; otherwise
  torch.std, i.e. n - 1) and verl/trainer/ppo/ray_trainer_ts.py `compute_advantage`, branch 'tree' (the
  estimator its train_*_tree_search.sh scripts select): inter-tree advantage over `uid` (the prompt) plus
  intra-tree advantage over `tree_uid` (one tree per initial action chain, search_r1/llm_agent/generation_ts.py).
- TreePO: github.com/multimodal-art-projection/TreePO @ f05552394e734ea2838cf9e3b8191f5093319dcf,
  verl/trainer/ppo/core_algos.py `compute_tree_reinforce_plus_plus_baseline_outcome_advantage` with
  recipe/treepo/run_treepo_train.sh's settings (adv_weight_strategy="average", subtree_std_ds=False), and
  verl/utils/torch_functional.py `masked_whiten` / `masked_var` (unbiased) over the whole batch.
"""

from collections import defaultdict

import numpy as np
import pytest

from trace_rl.advantages import batch_advantages, compute_advantages, trace, tree_grpo, treepo
from trace_rl.tree import BARE, BRANCH, RolloutTree

EPS = 1e-6


# ---------------------------------------------------------------------------------------------------------
# numpy ports of the upstream advantage code (rows = leaves, as upstream trains each leaf trajectory)


def port_grpo_outcome(scores, index, epsilon=1e-6):
    """Tree-GRPO's compute_grpo_outcome_advantage on per-row scalar scores."""
    id2score = defaultdict(list)
    for s, i in zip(scores, index):
        id2score[i].append(s)
    id2mean, id2std = {}, {}
    for idx, vals in id2score.items():
        if len(vals) == 1:
            id2mean[idx], id2std[idx] = 0.0, 1.0
        else:
            id2mean[idx], id2std[idx] = np.mean(vals), np.std(vals, ddof=1)
    return np.array([(s - id2mean[i]) / (id2std[i] + epsilon) for s, i in zip(scores, index)])


def port_tree_grpo(scores, uid, tree_uid):
    """ray_trainer_ts.compute_advantage, adv_estimator == 'tree'."""
    return port_grpo_outcome(scores, uid) + port_grpo_outcome(scores, tree_uid)


def port_treepo(scores, index, adv_weight_strategy="average"):
    """compute_tree_reinforce_plus_plus_baseline_outcome_advantage before its masked_whiten; index: '#' paths."""
    bsz = len(scores)
    adv_list = {i: [] for i in range(bsz)}
    max_tree_depth = max(len(uid.split("#")) - 1 for uid in index)
    for depth in range(max_tree_depth):
        index_by_depth = ["#".join(uid.split("#")[: depth + 1]) for uid in index]
        id2score = defaultdict(list)
        for i in range(bsz):
            id2score[index_by_depth[i]].append(scores[i])
        id2mean = {k: (0.0 if len(v) == 1 else float(np.mean(v))) for k, v in id2score.items()}
        for i in range(bsz):
            size = len(id2score[index_by_depth[i]])
            if (size > 1 and depth > 0) or depth == 0:
                adv_list[i].append((scores[i] - id2mean[index_by_depth[i]], size))
    out = np.zeros(bsz)
    for i in range(bsz):
        if adv_weight_strategy == "group_size":
            total = sum(g for _, g in adv_list[i])
            out[i] = sum(s * g / total for s, g in adv_list[i])
        else:
            out[i] = np.mean([s for s, _ in adv_list[i]])
    return out


def port_masked_whiten(scores, lengths):
    """verl masked_whiten of scores tiled over each row's response tokens (lengths), as TreePO applies it."""
    width = max(max(lengths), 1)
    mask = (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(float)
    values = np.asarray(scores)[:, None] * np.ones(width)[None, :] * mask
    mean = (values * mask).sum() / (mask.sum() + 1e-8)
    var = ((values - mean) ** 2 * mask).sum() / (mask.sum() + 1e-8) * mask.sum() / (mask.sum() - 1)
    whitened = (values - mean) / np.sqrt(var + 1e-8) * mask
    # every token of a row carries the same value; read it off the first token (rows of 0 tokens: recompute)
    return np.array([(s - mean) / np.sqrt(var + 1e-8) for s in scores]), whitened


# ---------------------------------------------------------------------------------------------------------
# random trees: bare rollouts of random length, continuations from random anchors (also on continuations)


def _chain(rng, tree, parent, origin, length, tokens):
    for i in range(length):
        last = i == length - 1
        reward = float(rng.choice([0.0, 1.0])) if rng.random() < 0.8 else float(np.round(rng.random(), 2))
        mask = [1] * int(rng.integers(0, 4)) + [0] * int(rng.integers(0, 2)) if tokens else []
        node = tree.add_turn(parent, origin=origin, terminal=last, reward=reward if last else None, loss_mask=mask)
        parent = node.node_id


def random_tree(rng, root_id, tokens=False):
    tree = RolloutTree(root_id)
    for _ in range(int(rng.integers(1, 5))):
        _chain(rng, tree, tree.root_id, BARE, int(rng.integers(1, 5)), tokens)
    for _ in range(int(rng.integers(0, 7))):
        anchors = [n for n in tree.turns() if not n.terminal]
        if not anchors:
            break
        _chain(rng, tree, anchors[int(rng.integers(len(anchors)))].node_id, BRANCH, int(rng.integers(1, 4)), tokens)
    return tree


def rows(trees):
    """Upstream's view: one row per leaf with its reward, prompt uid, tree uid, '#' path and token count."""
    out = []
    for tree in trees:
        for leaf in tree.leaves():
            path = tree.path(leaf.node_id)
            out.append(
                {
                    "tree": tree,
                    "id": leaf.node_id,
                    "r": float(leaf.reward),
                    "uid": tree.root_id,
                    "tree_uid": ".".join(leaf.node_id.split(".")[:2]),
                    "path": "#".join(n.node_id for n in path),
                    "tokens": sum(sum(n.loss_mask) for n in path[1:]),
                }
            )
    return out


def approx(d):
    return {k: pytest.approx(v) for k, v in d.items()}


# ---------------------------------------------------------------------------------------------------------
# Tree-GRPO


def test_tree_grpo_by_hand(small_tree):
    """small_tree: tree '0.0' holds leaf 0.0.0 (r=1) alone; tree '0.1' holds 0.1.0 (r=0) and 0.1.1 (r=1).
    Inter-tree over [1, 0, 1]: mean 2/3, unbiased std sqrt(1/3). Intra-tree: the lone leaf gets r / (1 + eps)
    (upstream's group of one: mean 0, std 1); tree 0.1: [0, 1], mean 1/2, unbiased std sqrt(1/2)."""
    s3, s2 = np.sqrt(1 / 3) + EPS, np.sqrt(1 / 2) + EPS
    leaf = {"0.0.0": (1 / 3) / s3 + 1 / (1 + EPS), "0.1.0": (-2 / 3) / s3 - 0.5 / s2, "0.1.1": (1 / 3) / s3 + 0.5 / s2}
    want = dict(leaf, **{"0.0": leaf["0.0.0"], "0.1": (leaf["0.1.0"] + leaf["0.1.1"]) / 2})
    assert tree_grpo(small_tree) == approx(want)
    assert tree_grpo(small_tree, scale="none") == approx(
        {"0.0": 4 / 3, "0.0.0": 4 / 3, "0.1": -1 / 6, "0.1.0": -7 / 6, "0.1.1": 5 / 6}
    )
    # the earlier nested-group variant stays available by name, unchanged
    assert compute_advantages("tree_grpo_nested", small_tree, scale="none") == approx(
        {"0.0": 1 / 3, "0.0.0": 1 / 3, "0.1": -1 / 6, "0.1.0": -7 / 6, "0.1.1": 5 / 6}
    )


def test_tree_grpo_lone_rollouts_get_their_reward_added():
    """Upstream edge case: every bare rollout unbranched -> each tree is a group of one -> +r on top of GRPO."""
    tree = RolloutTree(0)
    for r in (1.0, 0.0, 0.0, 1.0):
        tree.add_turn(tree.add_turn("0").node_id, terminal=True, reward=r)
    std = np.std([1, 0, 0, 1], ddof=1) + EPS
    adv = tree_grpo(tree)
    for leaf in tree.leaves():
        assert adv[leaf.node_id] == pytest.approx((leaf.reward - 0.5) / std + leaf.reward / (1 + EPS))


def test_tree_grpo_matches_upstream_port_on_random_trees():
    rng = np.random.default_rng(11)
    for t in range(60):
        tree = random_tree(rng, str(t))
        rs = rows([tree])
        want = port_tree_grpo([r["r"] for r in rs], [r["uid"] for r in rs], [r["tree_uid"] for r in rs])
        got = tree_grpo(tree)
        assert [got[r["id"]] for r in rs] == pytest.approx(want.tolist(), abs=1e-9)


# ---------------------------------------------------------------------------------------------------------
# TreePO


def test_treepo_by_hand(small_tree):
    """Leaf 0.0.0: only the prompt group counts (its prefix 0.0 holds no other leaf): 1 - 2/3. Leaves under
    0.1 average the prompt term and the shared-prefix term: (-2/3 - 1/2) / 2 and (1/3 + 1/2) / 2."""
    assert treepo(small_tree) == approx(
        {"0.0": 1 / 3, "0.0.0": 1 / 3, "0.1": -1 / 12, "0.1.0": -7 / 12, "0.1.1": 5 / 12}
    )
    # the function's default weighting (launch scripts choose "average"): terms weighted by group size 3, 2
    got = treepo(small_tree, weighting="group_size")
    assert got["0.1.0"] == pytest.approx((-2 / 3 * 3 - 1 / 2 * 2) / 5)
    assert got["0.0.0"] == pytest.approx(1 / 3)


def test_treepo_unbranched_rollout_is_not_diluted_by_its_length():
    """An unbranched rollout of L turns gets r - mean (its deeper prefixes are shared with no other leaf),
    not (r - mean) / L; a prompt with a single leaf gets r (upstream's group of one has mean 0)."""
    tree = RolloutTree(0)
    for r, length in ((1.0, 3), (0.0, 5)):
        parent = "0"
        for i in range(length):
            parent = tree.add_turn(parent, terminal=i == length - 1, reward=r if i == length - 1 else None).node_id
    adv = treepo(tree)
    assert adv["0.0.0.0"] == pytest.approx(0.5) and adv["0.1.0.0.0.0"] == pytest.approx(-0.5)
    assert adv["0.0"] == pytest.approx(0.5)
    lone = RolloutTree(1)
    lone.add_turn(lone.add_turn("1").node_id, terminal=True, reward=0.7)
    assert treepo(lone)["1.0.0"] == pytest.approx(0.7)


def test_treepo_batch_whitening_by_hand(small_tree):
    """Trees without tokens weigh 1 per turn: every leaf of small_tree has a 2-turn path, the chain tree's
    leaves 2 turns too. Leaf values [1/3, -7/12, 5/12, 1/2, -1/2] (weights 2 each): mean 1/30; variance with
    Bessel's correction over the 10 tokens."""
    tree = small_tree
    for node in tree.turns():
        node.loss_mask = []
    chain = RolloutTree(1)
    for r in (1.0, 0.0):
        chain.add_turn(chain.add_turn("1").node_id, terminal=True, reward=r)
    vals = np.array([1 / 3, -7 / 12, 5 / 12, 1 / 2, -1 / 2])
    mean = np.sum(vals * 2) / (10 + 1e-8)
    var = np.sum((vals - mean) ** 2 * 2) / (10 + 1e-8) * 10 / 9
    white = (vals - mean) / np.sqrt(var + 1e-8)
    got_a, got_b = batch_advantages("treepo", [tree, chain])
    assert [got_a["0.0.0"], got_a["0.1.0"], got_a["0.1.1"], got_b["1.0.0"], got_b["1.1.0"]] == pytest.approx(white)
    assert got_a["0.1"] == pytest.approx((white[1] + white[2]) / 2)
    # per tree, compute_advantages stays unwhitened
    assert compute_advantages("treepo", tree)["0.1.0"] == pytest.approx(-7 / 12)


@pytest.mark.parametrize("weighting", ["average", "group_size"])
@pytest.mark.parametrize("tokens", [False, True])
def test_treepo_matches_upstream_port_on_random_batches(weighting, tokens):
    rng = np.random.default_rng(5 if tokens else 6)
    for _ in range(12):
        trees = [random_tree(rng, str(t), tokens=tokens) for t in range(int(rng.integers(1, 6)))]
        rs = rows(trees)
        raw = port_treepo([r["r"] for r in rs], [r["path"] for r in rs], weighting)
        lengths = [r["tokens"] if tokens else r["path"].count("#") for r in rs]
        if sum(lengths) <= 1:
            continue  # upstream raises on a batch of one token
        white, tiled = port_masked_whiten(raw, lengths)
        for _r, w, row, n in zip(rs, white, tiled, lengths):
            if n:
                assert row[:n] == pytest.approx(np.full(n, w))  # the port's token view agrees with its row view
        per_tree = {id(t): compute_advantages("treepo", t, weighting=weighting) for t in trees}
        assert [per_tree[id(r["tree"])][r["id"]] for r in rs] == pytest.approx(raw.tolist(), abs=1e-9)
        batch = dict(zip(map(id, trees), batch_advantages("treepo", trees, weighting=weighting)))
        assert [batch[id(r["tree"])][r["id"]] for r in rs] == pytest.approx(white.tolist(), rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------------------------------------------------
# targets follow the tree as it grows


def _grown_pair():
    """Two copies of one tree; the first had advantages computed before its branch was added."""

    def base():
        tree = RolloutTree(0)
        tree.add_turn(tree.add_turn("0").node_id, terminal=True, reward=1.0)
        a = tree.add_turn("0")
        b = tree.add_turn(a.node_id)
        tree.add_turn(b.node_id, terminal=True, reward=0.0)
        return tree

    def grow(tree):
        tree.add_turn("0.1", origin=BRANCH, terminal=True, reward=1.0)
        c = tree.add_turn("0.1.0", origin=BRANCH)
        tree.add_turn(c.node_id, origin=BRANCH, terminal=True, reward=0.0)

    early, fresh = base(), base()
    for name in ("trace", "treepo", "tree_grpo", "grpo"):
        compute_advantages(name, early)
    grow(early)
    grow(fresh)
    return early, fresh


@pytest.mark.parametrize("name", ["trace", "treepo", "tree_grpo", "tree_grpo_nested", "grpo"])
def test_advantages_follow_a_tree_that_grew(name):
    early, fresh = _grown_pair()
    assert compute_advantages(name, early) == approx(compute_advantages(name, fresh))


def test_grown_tree_values_by_hand():
    """After growth the leaves are 0.0.0 (1), 0.1.0.0 (0), 0.1.1 (1), 0.1.0.1.0 (0): V^(0.1) = 1/3,
    V^(0.1.0) = 0, V^(root) = 1/2. TreePO for 0.1.1: terms 1 - 1/2 and 1 - 1/3 -> 7/12."""
    early, _ = _grown_pair()
    assert treepo(early)["0.1.1"] == pytest.approx(7 / 12)
    adv = trace(early, scale="none")
    assert adv["0.1.1"] == pytest.approx((1 - 1 / 2) + (1 - (0 + 1) / 2))
