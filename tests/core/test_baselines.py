"""The baselines reproduce their authors' code: Tree-GRPO and TreePO advantages (Knapsack RL's allocation:
test_knapsack.py; VIP's: test_vip.py).

Upstream code (the hand cases below follow it line by line):
- Tree-GRPO: github.com/AMAP-ML/Tree-GRPO @ 90b170995d996d772d68117e0c7bd0b8fe00d393,
  verl/trainer/ppo/ray_trainer_ts.py `compute_advantage`, branch 'tree' (the estimator its
  train_*_tree_search.sh scripts select): verl/trainer/ppo/core_algos.py `compute_grpo_outcome_advantage` over
  `uid` (the prompt: inter-tree) plus the same over `tree_uid` (one tree per initial action chain,
  search_r1/llm_agent/generation_ts.py: intra-tree); a group of one has mean 0 and std 1, otherwise torch.std
  (n - 1).
- TreePO: github.com/multimodal-art-projection/TreePO @ f05552394e734ea2838cf9e3b8191f5093319dcf,
  verl/trainer/ppo/core_algos.py `compute_tree_reinforce_plus_plus_baseline_outcome_advantage` with
  recipe/treepo/run_treepo_train.sh's settings (adv_weight_strategy="average", subtree_std_ds=False) and the
  function's default "group_size", which ends in verl/utils/torch_functional.py `masked_whiten` (unbiased
  `masked_var`) over the whole batch.

The repository ships no upstream code. Always: trace-rl's `tree_grpo` against tree_grpo_upstream.json (what
upstream's `compute_advantage(data, "tree")` returned for each leaf of 60 random trees) and `treepo` against
treepo_upstream.json (upstream's function on 48 random batches, both weightings, trees with and without tokens:
the values it whitens, read as they enter `masked_whiten`, and the whitened ones); each file says which upstream
files, torch and numpy made it. A check that an earlier or perturbed estimator does not match the tables, and
hand-worked cases. With the four TRACE_RL_TREE_GRPO*/TRACE_RL_TREEPO* variables naming upstream's files
(docs/baselines.md): the same comparisons on fresh random trees, and a check that the recorded tables are what
those files compute here. `python tests/core/test_baselines.py`, with the variables set and PYTHONPATH=src:tests,
rewrites the tables.

Upstream's files are loaded unmodified, with what they import that trace-rl's dependencies do not include provided
while they load (tests/helpers_tree_upstream.py says what). Inputs are float64 tensors; upstream computes two steps
in float32 all the same (TOL below), so trace-rl matches Tree-GRPO and the whitened TreePO values to 1e-7, and the
TreePO values before whitening to 1e-9.
"""

import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from helpers_tree_upstream import (
    TREE_GRPO,
    TREE_GRPO_TRAINER,
    TREEPO,
    TREEPO_WHITEN,
    load_tree_grpo,
    load_treepo,
    tree_from_record,
    tree_grpo_trees,
    tree_record,
    treepo_batches,
    upstream_tree_grpo,
    upstream_treepo,
)
from helpers_upstream import load_fixture, provenance, upstream_code, upstream_or_skip, write_fixture

from trace_rl.advantages import batch_advantages, compute_advantages, trace, tree_grpo, treepo, treepo_batch
from trace_rl.tree import BRANCH, RolloutTree

EPS = 1e-6
# Upstream computes in float32 even on float64 input: a lone group's `torch.tensor(1.0) + 1e-6` (1 + 9.54e-7), and
# masked_whiten's token count and Bessel factor (`mask.sum() + 1e-8`, `mask_sum / (mask_sum - 1)` on an integer
# mask). trace-rl's float64 values differ from upstream's by up to 5e-8 relative (measured on the tables); TOL is
# relative to max(1, |value|), and still sees a whitening without Bessel's correction (a test below).
TOL = 1e-7
TREE_GRPO_TABLE = Path(__file__).with_name("tree_grpo_upstream.json")
TREEPO_TABLE = Path(__file__).with_name("treepo_upstream.json")
WEIGHTINGS = ("average", "group_size")


def approx(d):
    return {k: pytest.approx(v) for k, v in d.items()}


# ---------------------------------------------------------------------------------------------------------
# against upstream's recorded outputs (no upstream code needed)


@cache
def recorded(path: Path) -> dict:
    return load_fixture(path)


def tree_grpo_misses(estimator) -> tuple[int, int]:
    """(leaves where `estimator` departs from upstream's recorded advantage by more than TOL, leaves)."""
    misses = total = 0
    for case in recorded(TREE_GRPO_TABLE)["compute_advantage_tree"]:
        got = estimator(tree_from_record(case["tree"]))
        misses += sum(abs(got[leaf] - want) > TOL * max(1.0, abs(want)) for leaf, want in case["advantage"].items())
        total += len(case["advantage"])
    return misses, total


def test_tree_grpo_is_upstreams_on_recorded_random_trees():
    misses, leaves = tree_grpo_misses(tree_grpo)
    assert leaves > 250 and misses == 0
    cases = recorded(TREE_GRPO_TABLE)["compute_advantage_tree"]
    assert len(cases) == 60
    branched = sum(any(t[1] == BRANCH for t in c["tree"]["turns"]) for c in cases)
    assert 10 < branched < 60  # the table holds branched trees and lone unbranched rollouts


def test_the_tree_grpo_table_tells_other_estimators_apart():
    """The earlier nested-group estimator (docs/baselines.md: it agreed on 11 of 325 leaves) and Tree-GRPO
    without the std scaling would not pass: the comparison can fail."""
    for estimator in (lambda t: compute_advantages("tree_grpo_nested", t), lambda t: tree_grpo(t, scale="none")):
        misses, leaves = tree_grpo_misses(estimator)
        assert misses > leaves // 2


def treepo_cases(weighting=None):
    cases = recorded(TREEPO_TABLE)["compute_tree_reinforce_plus_plus_baseline_outcome_advantage"]
    return [c for c in cases if weighting in (None, c["weighting"])]


def treepo_misses(case, weighting=None, whiten=True) -> tuple[int, int]:
    """(leaves where trace-rl departs from upstream's values, leaves compared): the per-tree values before
    whitening (to 1e-9), and the batch's whitened ones where upstream has a token to hold one (to TOL)."""
    trees = [tree_from_record(t) for t in case["trees"]]
    weighting = weighting or case["weighting"]
    per_tree = {}
    for tree in trees:
        per_tree.update(compute_advantages("treepo", tree, weighting=weighting))
    pairs = [(per_tree[leaf], want, 1e-9) for leaf, want in case["raw"].items()]
    if case["whitened"] is not None:
        batch = {k: v for adv in treepo_batch(trees, weighting=weighting, whiten=whiten) for k, v in adv.items()}
        pairs += [(batch[leaf], want, TOL) for leaf, want in case["whitened"].items() if want is not None]
    return sum(abs(got - want) > tol * max(1.0, abs(want)) for got, want, tol in pairs), len(pairs)


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_treepo_is_upstreams_on_recorded_random_batches(weighting):
    cases = treepo_cases(weighting)
    assert len(cases) == 24
    compared = 0
    for case in cases:
        misses, n = treepo_misses(case)
        assert misses == 0, case
        compared += n
    assert compared > 300
    # some leaves have no policy token: upstream masks their row to 0, so no whitened value is recorded
    assert any(v is None for c in cases if c["whitened"] for v in c["whitened"].values())


def test_the_treepo_table_tells_other_estimators_apart():
    """The other weighting, and the batch left unwhitened, would not pass: the comparison can fail."""
    swapped = {"average": "group_size", "group_size": "average"}
    assert sum(treepo_misses(c, weighting=swapped[c["weighting"]])[0] for c in treepo_cases()) > 20
    assert all(treepo_misses(c, whiten=False)[0] > 0 for c in treepo_cases() if c["whitened"])


def test_the_treepo_table_sees_the_variance_without_bessels_correction(monkeypatch):
    """A whitening with the population variance (masked_var(unbiased=False)) moves values by a factor
    sqrt((N - 1) / N), N the batch's tokens: within TOL it would still fail on most batches."""
    import trace_rl.advantages as advantages

    def population(values, weights):
        total = float(weights.sum())
        centred = values - float(np.dot(values, weights)) / (total + 1e-8)
        return centred / np.sqrt(float(np.dot(centred**2, weights)) / (total + 1e-8) + 1e-8)

    monkeypatch.setattr(advantages, "masked_whiten", population)
    cases = [c for c in treepo_cases() if c["whitened"]]
    assert sum(treepo_misses(c)[0] > 0 for c in cases) > len(cases) // 2


# ---------------------------------------------------------------------------------------------------------
# Tree-GRPO by hand


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


# ---------------------------------------------------------------------------------------------------------
# TreePO by hand


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


# ---------------------------------------------------------------------------------------------------------
# upstream's own files, when the TRACE_RL_TREE_GRPO* / TRACE_RL_TREEPO* variables name them


def upstream_or_skip_with_torch(var, provide=None):
    pytest.importorskip("torch")  # upstream's files are torch code; torch comes with the `lm` extra
    return upstream_or_skip(var, provide)


@pytest.fixture(scope="module")
def upstream_trainer():
    return load_tree_grpo(upstream_or_skip_with_torch)


@pytest.fixture(scope="module")
def upstream_treepo_core():
    return load_treepo(upstream_or_skip_with_torch)


def test_the_recorded_tree_grpo_table_is_what_upstream_computes(upstream_trainer):
    for case in recorded(TREE_GRPO_TABLE)["compute_advantage_tree"]:
        fresh = upstream_tree_grpo(upstream_trainer, tree_from_record(case["tree"]))
        assert fresh == pytest.approx(case["advantage"], abs=1e-12)


def test_tree_grpo_is_upstreams_on_fresh_random_trees(upstream_trainer):
    for tree in tree_grpo_trees(100, seed=12):
        want, got = upstream_tree_grpo(upstream_trainer, tree), tree_grpo(tree)
        assert {leaf: got[leaf] for leaf in want} == pytest.approx(want, rel=TOL, abs=TOL)


def test_the_recorded_treepo_table_is_what_upstream_computes(upstream_treepo_core):
    for case in treepo_cases():
        fresh = upstream_treepo(upstream_treepo_core, [tree_from_record(t) for t in case["trees"]], case["weighting"])
        assert fresh["raised"] == case["raised"] and fresh["raw"] == pytest.approx(case["raw"], abs=1e-12)
        for leaf, want in (case["whitened"] or {}).items():
            got = fresh["whitened"][leaf]
            assert got is None if want is None else got == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_treepo_is_upstreams_on_fresh_random_batches(upstream_treepo_core, weighting):
    for tokens, seed in ((False, 7), (True, 8)):
        for trees in treepo_batches(20, seed, tokens):
            misses, compared = treepo_misses(upstream_treepo(upstream_treepo_core, trees, weighting))
            assert misses == 0 and compared > 0


# ---------------------------------------------------------------------------------------------------------
# the recorded tables: `python tests/core/test_baselines.py` with the variables set


def main() -> None:
    import os

    import numpy
    import torch

    versions = f"torch {torch.__version__}, numpy {numpy.__version__}"
    script, written = "tests/core/test_baselines.py", 0
    trainer = load_tree_grpo(upstream_code.load)
    if trainer is not None:
        cases = [{"tree": tree_record(t), "advantage": upstream_tree_grpo(trainer, t)} for t in tree_grpo_trees(60, 11)]
        what = (
            'ray_trainer_ts.compute_advantage(data, "tree") (core_algos.compute_grpo_outcome_advantage over uid and '
            "over tree_uid): one float64 row per leaf, its reward on one response token, uid the tree's root, "
            "tree_uid the leaf's depth-1 ancestor; the advantage of each leaf"
        )
        prov = provenance((TREE_GRPO, TREE_GRPO_TRAINER), script, versions, what)
        write_fixture(TREE_GRPO_TABLE, prov, {"compute_advantage_tree": cases})
        print(f"wrote {TREE_GRPO_TABLE}")
        written += 1
    core = load_treepo(upstream_code.load)
    if core is not None:
        cases = [
            upstream_treepo(core, trees, weighting)
            for weighting in WEIGHTINGS
            for tokens, seed in ((False, 6), (True, 5))
            for trees in treepo_batches(12, seed, tokens)
        ]
        what = (
            "compute_tree_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index, "
            "remove_no_std_subgroup=False, adv_weight_strategy=weighting) on one float64 row per leaf, index its "
            "'#'-joined path; raw: what it passes to masked_whiten (every row 2 tokens); whitened: its output with "
            "each row the leaf's policy tokens (1 per turn in a tree without tokens), reward on the last, null for "
            "a row of no token; raised: its error where it raises"
        )
        prov = provenance((TREEPO, TREEPO_WHITEN), script, versions, what)
        write_fixture(TREEPO_TABLE, prov, {"compute_tree_reinforce_plus_plus_baseline_outcome_advantage": cases})
        print(f"wrote {TREEPO_TABLE}")
        written += 1
    for var in (TREE_GRPO, TREE_GRPO_TRAINER, TREEPO, TREEPO_WHITEN):
        if not os.environ.get(var, "").strip():
            print(upstream_code.unset_line(var))
    if not written:
        sys.exit(1)


if __name__ == "__main__":
    main()
