"""Tree growth from agent-loop sessions through the core engine (no verl: sessions are scripted)."""

import asyncio
import copy
import json

import numpy as np
import pytest

from trace_rl.integrations.rows import tree_rows
from trace_rl.integrations.verl.advantage import leaf_record, rebuild_trees
from trace_rl.integrations.verl.predictor_state import load_bytes, shared_predictor, to_bytes
from trace_rl.integrations.verl.tree_actor import grow_prompt_tree, single_prompt_plan
from trace_rl.methods import BudgetPlan, get_method
from trace_rl.predictors.base import training_examples
from trace_rl.predictors.build import build_predictor
from trace_rl.trace_config import PredictorSettings, TraceConfig
from trace_rl.tree import BRANCH


class ScriptedSession:
    """Three-turn episodes; the token history grows like an agent loop's (policy tokens, then a tool reply);
    a turn fails with probability 0.4 from the session's own stream, and one failure sinks the episode."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.history: list[int] = []
        self.turns, self.failed, self.done, self.reward, self.output = 0, False, False, None, None

    async def step(self) -> dict:
        await asyncio.sleep(0)
        self.turns += 1
        policy = [int(x) for x in self.rng.integers(10, 99, 2)]
        obs = [7] if self.turns < 3 else []
        self.failed |= bool(self.rng.random() < 0.4)
        self.history += policy + obs
        if self.turns == 3:
            self.done, self.reward = True, 0.0 if self.failed else 1.0
            self.output = list(self.history)
        return {
            "token_ids": policy + obs,
            "loss_mask": [1, 1] + [0] * len(obs),
            "logprobs": [-0.5, -0.5],
            "action": f"t{self.turns}",
            "observation": "ok" if obs else "",
        }

    def fork(self):
        twin = copy.copy(self)
        twin.history = list(self.history)
        twin.rng = np.random.default_rng(self.rng.integers(2**31))
        return twin


def _opener():
    counter = iter(range(10_000))
    return lambda k: [ScriptedSession(next(counter)) for _ in range(k)]


def _config(method: str, branch: int) -> TraceConfig:
    return TraceConfig(method, budget=BudgetPlan(branch_factor=branch))


def _predictor(kind: str, seed: int = 0):
    return build_predictor(PredictorSettings(kind), get_method("trace"), seed)


@pytest.mark.parametrize("roots,branch", [(4, 1), (3, 2), (2, 0)])
def test_one_prompt_grows_roots_plus_continuations_and_every_leaf_is_a_finished_session(roots, branch):
    config = _config("trace" if branch else "pcl", branch)
    method = config.method_spec
    tree, leaves, result = asyncio.run(
        grow_prompt_tree("u-1", {"question": "q"}, roots, _opener(), _predictor("light"), config, seed=3, step=0)
    )
    assert tree.root_id == "u-1" and result.bare_rollouts == roots
    assert result.continuations + result.unspent_prefix_budget == roots * (branch if method.branches else 0)
    assert len(leaves) == len(tree.leaves()) == roots + result.continuations
    assert len({id(s) for _, s in leaves}) == len(leaves)
    for leaf_id, session in leaves:
        assert session.done and session.reward == tree[leaf_id].reward
        # the session's own history is exactly the tree path: a fork carried the prefix it continued from
        assert session.output == [t for n in tree.path(leaf_id)[1:] for t in n.token_ids]
    if branch:
        assert any(n.origin == BRANCH for n in tree.turns())
        anchors = [tree[n.parent_id] for n in tree.turns() if n.origin == BRANCH and tree[n.parent_id].origin != BRANCH]
        assert anchors and all(a.predicted is not None for a in anchors)  # V~ scored every branched prefix
    # the leaves' rows and records are well formed
    tree.compute_targets()
    assert len(tree_rows(tree, {n.node_id: 0.0 for n in tree.turns()})) == len(leaves)
    # each leaf's record is its path in tree.py's format, and the records give back the grown tree (the engine
    # grew the rollouts turn by turn in lockstep, so only the order the nodes are listed in differs)
    records = [json.loads(json.dumps(leaf_record(tree, lid))) for lid, _ in leaves]
    assert all(rec["nodes"] == tree.path_dict(lid)["nodes"] for rec, (lid, _) in zip(records, leaves))
    (rebuilt,), _ = rebuild_trees(records, [s.reward for _, s in leaves])
    assert sorted(json.dumps(n) for n in rebuilt.to_dict()["nodes"]) == sorted(
        json.dumps(n) for n in tree.to_dict()["nodes"]
    )


def test_single_prompt_plan_spends_exactly_the_given_roots():
    plan, one = single_prompt_plan(5, _config("trace", 2))
    assert one.root == "uniform" and one.prefix == "active" and plan.root_budget(one) == 5
    assert (plan.prompts, plan.rollouts_per_prompt, plan.branch_factor, plan.pool_factor) == (1, 15, 2, 1)
    plan, one = single_prompt_plan(1, _config("grpo", 2))
    assert plan.root_budget(one) == 1 and plan.branch_factor == 0 and plan.max_per_prompt == 2
    with pytest.raises(ValueError, match="at least one root"):
        asyncio.run(grow_prompt_tree("u", None, 0, _opener(), _predictor("history"), _config("grpo", 0), 0, 0))


@pytest.mark.parametrize("name", ["light", "history"])
def test_predictor_weights_travel_as_bytes(name):
    trees = []
    for i in range(6):
        tree, _, _ = asyncio.run(
            grow_prompt_tree(
                f"u{i}",
                {"question": f"q {i} {'7' * i}"},
                4,
                _opener(),
                _predictor(name),
                _config("trace", 1),
                seed=i,
                step=0,
            )
        )
        trees.append(tree)
    src = _predictor(name, seed=1)
    examples, targets = training_examples(trees, 0.5, np.random.default_rng(0))
    src.update(examples, targets)
    dst = _predictor(name, seed=1)
    prefixes = [(t, t.root_id) for t in trees]
    assert not np.allclose(dst.predict(prefixes), src.predict(prefixes))
    load_bytes(dst, to_bytes(src))
    assert np.allclose(dst.predict(prefixes), src.predict(prefixes))
    config = TraceConfig(predictor=PredictorSettings(name))
    assert shared_predictor(config, 9) is shared_predictor(config, 9)
    assert shared_predictor(config, 9) is not shared_predictor(config, 8)
    # the method's own V~ first, as on the command line: Knapsack RL reads a reward history whatever the kind
    knapsack = shared_predictor(TraceConfig("knapsack_rl", predictor=PredictorSettings(name)), 9)
    assert type(knapsack).__name__ == "RewardHistoryPredictor"
