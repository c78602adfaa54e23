"""The verl integration's pure parts (no verl import): budgets, leaf records, tree rebuilding, advantages."""

import copy
import json

import numpy as np
import pytest

from trace_rl.advantages import batch_advantages, trace
from trace_rl.integrations.rows import batch_rows
from trace_rl.integrations.verl.advantage import (
    flat_trace_advantages,
    leaf_record,
    merge_tree_advantages,
    rebuild_trees,
    token_advantages,
)
from trace_rl.integrations.verl.budgets import TraceSettings, expected_rows, prompt_text, prompt_trees, root_counts
from trace_rl.methods import BudgetPlan, allocate_method_roots, get_method
from trace_rl.seeding import derive_seed
from trace_rl.trace_config import PredictorSettings, TraceConfig
from trace_rl.tree import RolloutTree


def settings_of(method="trace", branch=1, max_per_prompt=8, seed=0) -> TraceSettings:
    return TraceSettings(
        TraceConfig(method, budget=BudgetPlan(branch_factor=branch, max_per_prompt=max_per_prompt)), seed
    )


@pytest.mark.parametrize("method,branch", [("trace", 1), ("trace", 3), ("grpo", 1), ("pcl", 0), ("tree_grpo", 1)])
def test_root_counts_keep_batch_times_n_rows(method, branch):
    rng = np.random.default_rng(0)
    settings = settings_of(method, branch, 16)
    for _ in range(20):
        v = rng.random(8)
        counts = root_counts(v, 8, settings, step=3)
        assert counts.shape == (8,) and counts.min() >= 0
        assert expected_rows(counts, settings) == 8 * 8
        assert not np.any(counts == 1), "a single rollout gives no contrast"


def test_root_counts_are_the_core_engine_allocation():
    settings = settings_of("trace", 1, 8, seed=5)
    v = np.linspace(0.05, 0.95, 12)
    plan = BudgetPlan(prompts=12, rollouts_per_prompt=4, branch_factor=1, pool_factor=1, max_per_prompt=8)
    want = allocate_method_roots(get_method("trace"), v, plan, seed=derive_seed(5, "roots", 2))
    assert np.array_equal(root_counts(v, 4, settings, step=2), want)
    # skipping: near-certain and hopeless prompts get nothing, uncertain ones get more than the uniform share
    counts = root_counts(np.array([0.0, 1.0, 0.5, 0.5]), 4, settings)
    assert counts[0] == counts[1] == 0 and counts[2] + counts[3] == 8


def test_root_counts_refuse_budgets_verl_cannot_batch():
    with pytest.raises(ValueError, match="divide"):
        root_counts(np.full(3, 0.5), 3, settings_of(branch=1))  # 9 rows, (1 + 1) does not divide
    with pytest.raises(ValueError, match="budget.max_per_prompt"):
        root_counts(np.full(2, 0.5), 16, settings_of("trace_root_only", 0, 4))


def test_settings_from_config_take_the_command_line_names_and_refuse_unknown_keys_and_methods():
    got = TraceSettings.from_config({"method": "trace", "budget": {"branch_factor": 2}, "seed": 4})
    assert got.branch_factor == 2 and got.seed == 4 and got.config.budget.max_per_prompt == BudgetPlan.max_per_prompt
    assert TraceSettings.from_config(None) == TraceSettings()
    both = TraceSettings.from_config({"predictor": {"kind": "history", "prefix_share": 0.25}, "advantage": "grpo"})
    assert both.config.predictor == PredictorSettings("history", 0.25) and both.advantage == "grpo"
    with pytest.raises(ValueError, match=r"trace_rl\.branchfactor: unknown setting"):
        TraceSettings.from_config({"branchfactor": 2})
    with pytest.raises(ValueError, match="unknown 'nope'"):
        TraceSettings.from_config({"method": "nope"})
    with pytest.raises(ValueError, match="exact V"):
        TraceSettings.from_config({"method": "trace_oracle"})
    with pytest.raises(ValueError, match="trace_rl.method=trace_mix pools stage 2.*one prompt at a time"):
        TraceSettings.from_config({"method": "trace_mix"})
    with pytest.raises(ValueError, match="trace_rl.method=trace_cost spends a cost budget.*rollout.n rows"):
        TraceSettings.from_config({"method": "trace_cost"})
    assert TraceSettings(TraceConfig("tree_grpo")).advantage == "tree_grpo"
    assert TraceSettings(TraceConfig("tree_grpo", advantage="trace")).advantage == "trace"


@pytest.mark.parametrize(
    "block, names",
    [
        ({"estimator": "trace"}, "trace_rl.advantage"),
        ({"branch_factor": 2}, "trace_rl.budget.branch_factor"),
        ({"max_per_prompt": 16}, "trace_rl.budget.max_per_prompt"),
        ({"prefix_share": 0.1}, "trace_rl.predictor.prefix_share"),
        ({"predictor": "light_text"}, "trace_rl.predictor.kind"),
        ({"predictor": {"kind": "light_text"}}, "light"),
        ({"budget": {"prompts": 4}}, "data.train_batch_size"),
        ({"budget": {"rollouts_per_prompt": 4}}, "rollout.n"),
        ({"predictor": {"kind": "smollm2-135m"}}, "trace_rl.predictor.kind"),
        ({"predictor": {"prefix_share": 1.5}}, "trace_rl.predictor.prefix_share must be in [0, 1)"),
        ({"weighting": "half"}, "trace_rl.weighting must be one of"),
        ({"budget": {"max_per_prompt": 1}}, "trace_rl.budget.max_per_prompt must be >= 2"),
    ],
)
def test_an_old_or_bad_verl_key_is_one_line_naming_the_key_to_set(block, names):
    """A YAML written for the names before one configuration never silently changes meaning."""
    with pytest.raises(ValueError) as err:
        TraceSettings.from_config(block)
    assert names in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_prompt_text_reads_the_last_user_message():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "first"}, {"role": "user", "content": "Q?"}]
    assert prompt_text(msgs) == "Q?"
    assert prompt_text("plain") == "plain"
    blocks = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert prompt_text([{"role": "user", "content": blocks}]) == "a b"
    assert prompt_text(np.array(msgs, dtype=object)) == "Q?"  # how verl's batch holds raw_prompt
    assert prompt_text(None) == ""
    trees = prompt_trees(["u-1", "u-2"], [msgs, "x"])
    assert [t.root_id for t in trees] == ["u-1", "u-2"] and trees[0].prompt == {"question": "Q?"}


def _records(trees):
    """Leaf records as the worker writes them (after V^), round-tripped through JSON (they travel through Ray)."""
    recs, rewards, lengths = [], [], []
    for tree in trees:
        tree.compute_targets()
        for leaf in tree.leaves():
            recs.append(json.loads(json.dumps({**leaf_record(tree, leaf.node_id), "unspent": 0})))
            rewards.append(leaf.reward)
            lengths.append(sum(len(n.token_ids) for n in tree.path(leaf.node_id)[1:]))
    return recs, rewards, lengths


def _by_id(tree: RolloutTree) -> str:
    """The tree as JSON with its nodes in id order: rows that arrive in another order list them differently."""
    data = tree.to_dict()
    return json.dumps({**data, "nodes": sorted(data["nodes"], key=lambda n: n["node_id"])})


def _without(tree: RolloutTree, leaf_id: str) -> RolloutTree:
    """`tree` with one leaf cut off (and the turns that led to it alone), targets recomputed."""
    out = copy.deepcopy(tree)
    nid = leaf_id
    while nid != out.root_id and not out[nid].children:
        parent = out[nid].parent_id
        del out.nodes[nid]
        out[parent].children.remove(nid)
        nid = parent
    out.compute_targets()
    return out


def test_leaf_records_are_tree_paths_and_rebuild_the_trees_byte_for_byte(trees):
    recs, rewards, _ = _records(trees)
    rec = recs[-1]
    assert sorted(rec) == ["leaf", "nodes", "prompt", "root_id", "unspent"]
    tree = {t.root_id: t for t in trees}[rec["root_id"]]
    assert {k: rec[k] for k in ("root_id", "prompt", "nodes")} == tree.path_dict(rec["leaf"])
    rebuilt, where = rebuild_trees(recs, rewards)
    assert [json.dumps(t.to_dict()) for t in rebuilt] == [json.dumps(t.to_dict()) for t in trees]
    assert where == [(i, leaf.node_id) for i, t in enumerate(trees) for leaf in t.leaves()]
    # rows arrive in any order: the same trees, nodes listed in the order the rows brought them
    order = np.random.default_rng(1).permutation(len(recs))
    shuffled, where = rebuild_trees([recs[i] for i in order], [rewards[i] for i in order])
    assert sorted(_by_id(t) for t in shuffled) == sorted(_by_id(t) for t in trees)
    assert [shuffled[i].root_id + ":" + leaf for i, leaf in where] == [
        recs[i]["root_id"] + ":" + recs[i]["leaf"] for i in order
    ]


def test_a_missing_row_rebuilds_its_tree_without_that_leaf(trees):
    recs, rewards, _ = _records(trees[:1])
    tree = trees[0]
    for drop in range(len(recs)):
        keep = [i for i in range(len(recs)) if i != drop]
        rebuilt, _ = rebuild_trees([recs[i] for i in keep], [rewards[i] for i in keep])
        assert _by_id(rebuilt[0]) == _by_id(_without(tree, recs[drop]["leaf"]))  # a branch may now bring its anchor


def test_rows_of_rebuilt_trees_are_the_rows_of_the_originals(trees):
    """Token ids, loss masks (template tokens before the policy's) and log-probs come back as the worker had
    them: the former records rebuilt placeholders, zeros with the policy tokens first."""
    assert any(n.loss_mask[:1] == [0] and sum(n.loss_mask) for t in trees for n in t.turns())
    recs, rewards, _ = _records(trees)
    rebuilt, _ = rebuild_trees(recs, rewards)
    for estimator in ("trace", "tree_grpo"):
        assert batch_rows(rebuilt, estimator) == batch_rows(trees, estimator)


@pytest.mark.parametrize("estimator", ["trace", "tree_grpo", "treepo"])
def test_token_advantages_match_the_core_rows_on_the_same_trees(trees, estimator):
    recs, rewards, lengths = _records(trees)
    got, _ = token_advantages(recs, rewards, lengths, estimator=estimator)
    want = batch_rows(trees, estimator)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.allclose(g, w.weighted_advantages, atol=1e-12)


def test_token_advantages_truncate_and_pad_to_the_response_length(trees):
    recs, rewards, lengths = _records(trees[:1])
    full, _ = token_advantages(recs, rewards, lengths)
    short, _ = token_advantages(recs, rewards, [n - 1 for n in lengths])
    long, _ = token_advantages(recs, rewards, [n + 3 for n in lengths])
    for f, s, l_ in zip(full, short, long):
        assert np.array_equal(s, f[:-1]) and np.array_equal(l_[: len(f)], f) and not l_[len(f) :].any()


def test_a_leaf_takes_its_rows_score_as_reward(trees):
    recs, rewards, _ = _records(trees[:1])
    flipped = [1.0 - r for r in rewards]
    rebuilt, where = rebuild_trees(recs, flipped)
    assert [rebuilt[i][leaf].reward for i, leaf in where] == flipped


def test_rebuild_rejects_inconsistent_rows_in_one_line(trees):
    recs, rewards, _ = _records(trees[:1])

    def refused(records, match, scores=None):
        with pytest.raises(ValueError, match=match) as err:
            rebuild_trees(records, scores or rewards[: len(records)])
        assert "\n" not in str(err.value)

    refused(recs + recs[:1], "appears in two rows", rewards + rewards[:1])
    every, _, _ = _records(trees)
    first, other = next((a, b) for a in every for b in every if a is not b and a["nodes"][:2] == b["nodes"][:2])
    other = copy.deepcopy(other)
    other["nodes"][1]["token_ids"][0] += 1  # one token of a shared turn
    refused([first, other], "disagree on node")
    refused([{**recs[0], "leaf": "t0.9"}], "does not end at the leaf")
    inner = copy.deepcopy(recs[0])
    inner["nodes"] = inner["nodes"][:-1]
    refused([{**inner, "leaf": inner["nodes"][-1]["node_id"]}], "a terminal node")
    orphan = copy.deepcopy(recs[0])
    del orphan["nodes"][1]  # the leaf's parent is missing from its path
    refused([orphan], "is not a child of")
    refused([{"tree": "t0", "leaf": "t0.0.0", "turns": []}], "not a leaf record")
    refused(recs[:2], "2 records for 1 rewards", rewards[:1])


def test_flat_trace_equals_core_trace_on_chains():
    rng = np.random.default_rng(3)
    scores, index, want = [], [], []
    for p in range(4):
        tree = RolloutTree(f"p{p}")
        for _ in range(int(rng.integers(2, 6))):
            tree.add_turn(tree.add_turn(tree.root_id).node_id, terminal=True, reward=float(rng.integers(0, 2)))
        adv = trace(tree)
        for leaf in tree.leaves():
            scores.append(leaf.reward)
            index.append(tree.root_id)
            want.append(adv[leaf.node_id])
    assert np.allclose(flat_trace_advantages(np.array(scores), index), want)
    assert np.allclose(
        batch_advantages("trace", [tree])[0][tree.leaves()[0].node_id],
        flat_trace_advantages(np.array(scores), index)[len(scores) - len(tree.leaves())],
    )


def test_merge_replaces_tree_rows_and_keeps_flat_and_padding_rows(trees):
    recs, rewards, lengths = _records(trees[:2])
    extra = [{"trace": r, "turn_scores": []} for r in recs]
    # a flat row without a record, and a padding row that copies the first row's fields
    extra += [{"turn_scores": []}, dict(extra[0])]
    scores = rewards + [1.0, rewards[0]]
    lens = lengths + [4, lengths[0]]
    padding = [False] * len(recs) + [False, True]
    base = [np.full(n, 9.0) for n in lens]
    merged, rebuilt = merge_tree_advantages(extra, scores, lens, padding, base)
    want, _ = token_advantages(recs, rewards, lengths)
    for got, w in zip(merged, want):
        assert np.array_equal(got, w)
    assert np.array_equal(merged[-2], base[-2]) and np.array_equal(merged[-1], base[-1])
    assert [t.root_id for t in rebuilt] == [t.root_id for t in trees[:2]]
    same, none = merge_tree_advantages([None, {}], [0.0, 1.0], [2, 2], [False, False], [np.ones(2), np.zeros(2)])
    assert none == [] and np.array_equal(same[0], np.ones(2))
