import asyncio
import json
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("transformers")

from helpers_calc import scripted_calc  # noqa: E402

from trace_rl.allocation import prefix_flip_prob, prefix_value  # noqa: E402
from trace_rl.backends.base import SamplingParams, ScriptedBackend  # noqa: E402
from trace_rl.envs.calculator import CalculatorEnv, make_task, make_tasks  # noqa: E402
from trace_rl.experimental.flip import FlipCalibrator  # noqa: E402
from trace_rl.experimental.root_calibration import RootCalibrator  # noqa: E402
from trace_rl.lm.tokenizer import byte_tokenizer  # noqa: E402
from trace_rl.methods import BudgetPlan, allocate_method_roots, get_method  # noqa: E402
from trace_rl.metrics import tree_budget  # noqa: E402
from trace_rl.predictors.history import RewardHistoryPredictor  # noqa: E402
from trace_rl.predictors.text import light_text_predictor  # noqa: E402
from trace_rl.rollout.engine import TreeRolloutEngine  # noqa: E402
from trace_rl.rollout.lm_actor import LMActor  # noqa: E402
from trace_rl.seeding import derive_seed  # noqa: E402
from trace_rl.tree import BRANCH  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def engine(tok, predictor, plan, wrong_every=3, env=CalculatorEnv, batching="round"):
    backend = ScriptedBackend(tok, lambda text, i: scripted_calc(text, i, wrong_every))
    actor = LMActor(backend, env, SamplingParams(max_new_tokens=64), batching=batching)
    return TreeRolloutEngine(actor, predictor, plan, seed=0)


def test_trees_carry_tokens_masks_logprobs_and_rewards(tok):
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)
    eng = engine(tok, light_text_predictor(), plan)
    res = eng.grow(make_tasks(4, seed=0, steps=(2, 3)), get_method("trace"))
    active = [t for t in res.trees if t.root.children]
    assert active and res.rollouts == sum(tree_budget([t]).rollouts for t in active)
    # every generated token is accounted for, across concurrently growing prompts
    assert res.generated_tokens == sum(len(n.logprobs) for t in active for n in t.turns())
    assert res.rollouts + res.unspent_prefix_budget == plan.total
    for tree in active:
        assert tree.root.token_ids and not any(tree.root.loss_mask)
        for node in tree.turns():
            assert len(node.token_ids) == len(node.loss_mask)
            assert sum(node.loss_mask) == len(node.logprobs) > 0
            assert node.token_ids[: len(node.logprobs)] and node.loss_mask[0] == 1
        for leaf in tree.leaves():
            assert leaf.reward in (0.0, 1.0)
            # the token path decodes to a faithful transcript: the prompt, then actions and observations
            text = tok.decode([t for n in tree.path(leaf.node_id) for t in n.token_ids])
            assert "Compute " in text and "Action: " in text
        assert tree.root.predicted is not None
    branched = [n for t in active for n in t.turns() if n.origin == BRANCH]
    assert branched and all(
        t[n.parent_id].predicted is not None
        for t in active
        for n in t.turns()
        if n.origin == BRANCH and t[n.parent_id].origin != BRANCH
    )


def test_stage2_of_a_fast_prompt_starts_before_a_slow_prompt_finishes(tok):
    rng = np.random.default_rng(0)
    fast, slow = make_task(rng, 1, 1, index=0), make_task(rng, 5, 1, index=1)
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=1, max_per_prompt=4)
    for batching in ("round", "eager"):
        eng = engine(tok, RewardHistoryPredictor(), plan, wrong_every=2, batching=batching)
        res = eng.grow([fast, slow], get_method("trace_prefix_only"))
        order = [(what, i) for what, i, _ in res.events]
        assert order.index(("stage2_start", 0)) < order.index(("bare_done", 1))


@pytest.mark.parametrize("name", ["grpo", "pcl", "knapsack_rl", "treepo", "tree_grpo", "trace_root_only"])
def test_every_baseline_runs_through_the_engine(tok, name):
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)
    pred = RewardHistoryPredictor() if name == "knapsack_rl" else light_text_predictor()
    res = engine(tok, pred, plan).grow(make_tasks(4, seed=1, steps=(2,)), get_method(name))
    assert res.rollouts + res.unspent_prefix_budget == plan.total
    assert res.generated_tokens > 0 and res.time["generate"] >= 0


def test_malformed_output_becomes_an_observation(tok):
    plan = BudgetPlan(prompts=1, rollouts_per_prompt=2, branch_factor=0, pool_factor=1, max_per_prompt=2)
    backend = ScriptedBackend(tok, lambda text, i: "I think the answer is 5")
    actor = LMActor(backend, CalculatorEnv, SamplingParams(max_new_tokens=32))
    eng = TreeRolloutEngine(actor, RewardHistoryPredictor(), plan)
    res = eng.grow(make_tasks(1, seed=2, steps=(1,)), get_method("grpo"))
    leaves = res.trees[0].leaves()
    assert len(leaves) == 2 and all(l.reward == 0.0 for l in leaves)
    assert all("Invalid action format" in n.observation for n in res.trees[0].turns())
    assert all(l.depth == 4 for l in leaves)  # the episode ran to its turn limit (1 step + 1 + 2 spare)


def test_agrow_runs_inside_a_running_event_loop(tok):
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=2, branch_factor=1, pool_factor=1, max_per_prompt=2)
    eng = engine(tok, RewardHistoryPredictor(), plan)
    tasks = make_tasks(2, seed=5, steps=(2,))

    async def caller():  # e.g. a verl agent-loop worker or a notebook
        with pytest.raises(RuntimeError, match="agrow"):
            eng.grow(tasks, get_method("trace"))
        with pytest.raises(RuntimeError, match="aevaluate"):
            eng.evaluate(tasks)
        return await eng.agrow(tasks, get_method("trace"))

    res = asyncio.run(caller())
    assert res.rollouts + res.unspent_prefix_budget == plan.total


class GatedCalc(CalculatorEnv):
    """Prompt 0's first tool call blocks until prompt 1's episodes have all ended (a slow sandbox call)."""

    gate = threading.Event()
    ended: list = []

    def step(self, action):
        if self.task["index"] == 0 and self.turn == 0:
            assert GatedCalc.gate.wait(timeout=20), "prompt 1 was held back by prompt 0's slow tool call"
        out = super().step(action)
        if self.task["index"] == 1 and out[2]:
            GatedCalc.ended.append(1)
            if len(GatedCalc.ended) == 2:
                GatedCalc.gate.set()
        return out


def test_a_slow_tool_call_does_not_stall_other_prompts_under_eager_batching(tok):
    GatedCalc.gate.clear()
    GatedCalc.ended.clear()
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=2, branch_factor=0, pool_factor=1, max_per_prompt=2)
    eng = engine(tok, RewardHistoryPredictor(), plan, env=GatedCalc, batching="eager")
    res = eng.grow(make_tasks(2, seed=6, steps=(2,)), get_method("grpo"))
    order = [(what, i) for what, i, _ in res.events]
    assert order.index(("bare_done", 1)) < order.index(("bare_done", 0))
    assert all(leaf.reward is not None for t in res.trees for leaf in t.leaves())


class SlowCalc(CalculatorEnv):
    """Prompt `slow`'s environment steps take longer, so its requests reach the micro-batcher after the others'."""

    slow = 0

    def step(self, action):
        if self.task["index"] == SlowCalc.slow:
            time.sleep(0.02)
        return super().step(action)


@dataclass
class RowSensitiveBackend(ScriptedBackend):
    """Log-probs that move in the last bits with a row's place in the batch, as a CPU kernel's fp32 logits can."""

    def generate(self, prompts, params, seed=None, seeds=None):
        out = super().generate(prompts, params, seed, seeds)
        for row, gen in enumerate(out):
            gen.logprobs = [lp - row * 2.0**-22 for lp in gen.logprobs]
        return out


def _trees_json(res) -> str:
    return "\n".join(json.dumps(t.to_dict()) for t in res.trees)  # what save_trees writes, log-probs included


def test_round_batches_lay_rows_out_alike_whichever_prompt_is_slow(tok):
    plan = BudgetPlan(prompts=3, rollouts_per_prompt=2, branch_factor=1, pool_factor=1, max_per_prompt=2)
    tasks = make_tasks(3, seed=7, steps=(2, 3))
    runs = []
    for slow in (0, 2):  # the first prompt's requests arrive last, then the last prompt's
        SlowCalc.slow = slow
        backend = RowSensitiveBackend(tok, lambda text, i: scripted_calc(text, 0, 0))
        actor = LMActor(backend, SlowCalc, SamplingParams(max_new_tokens=64))
        res = TreeRolloutEngine(actor, RewardHistoryPredictor(), plan, seed=3).grow(tasks, get_method("trace_uniform"))
        runs.append((_trees_json(res), backend.calls))
    assert runs[0][1] == runs[1][1] and max(runs[0][1]) > 2  # the same calls, several prompts' rows in one
    assert runs[0][0] == runs[1][0]


def test_a_seed_reproduces_sampled_trees_bit_for_bit_whatever_the_timing():
    torch = pytest.importorskip("torch")
    from trace_rl.backends.hf import HFBackend
    from trace_rl.lm.models import create_tiny_model

    plan = BudgetPlan(prompts=3, rollouts_per_prompt=2, branch_factor=1, pool_factor=1, max_per_prompt=2)
    tasks = make_tasks(3, seed=7, steps=(1, 2))
    runs = []
    for slow in (0, 2):
        SlowCalc.slow = slow
        model, tok = create_tiny_model(hidden=32, layers=1, heads=2, seed=1)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(4)
        actor = LMActor(HFBackend(model, tok), SlowCalc, SamplingParams(max_new_tokens=12))
        res = TreeRolloutEngine(actor, light_text_predictor(), plan, seed=3).grow(tasks, get_method("trace_uniform"))
        assert len(res.active) == 3  # every prompt's rows share the calls
        runs.append(_trees_json(res))
    assert runs[0] == runs[1]


def test_the_calibrated_flip_layer_is_what_stage_2_reads_and_it_learns_each_step(tok):
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)
    eng = engine(tok, light_text_predictor(), plan)
    eng.flip_model = layer = FlipCalibrator()
    seen = 0
    for step in range(2):
        theta = layer.theta.copy()  # what stage 2 reads this step: the fit of the steps before
        res = eng.grow(make_tasks(4, seed=step, steps=(2, 3)), get_method("trace"), step)
        anchors = [(t, node, r) for t in res.active for node, r in t.anchors()]
        assert anchors
        for _, node, r in anchors:
            q = float(prefix_flip_prob(float(r > 0.5), node.predicted))
            probe = FlipCalibrator()
            probe.theta = theta
            assert node.flip_predicted == pytest.approx(probe.predict([r], [node.predicted], [node.depth])[0])
            if step == 0:  # nothing seen yet: the prior, half of q from V~
                assert node.flip_predicted == pytest.approx(q / 2)
        seen += sum(1 for t, node, _ in anchors if t.started_rewards(node.node_id))
        assert layer.steps_seen == step + 1 and len(layer.state_dict()["rows"]) == seen
    assert not np.array_equal(layer.theta, 0 * layer.theta)  # it moved off the prior


def test_the_root_layer_is_what_tracess_root_allocator_reads_and_it_learns_each_step(tok):
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=3, max_per_prompt=4)
    eng = engine(tok, light_text_predictor(), plan)
    eng.root_model = layer = RootCalibrator()
    differs = []  # whether V~ itself would have allocated otherwise: the check can tell the two apart
    for step, name in enumerate(["trace", "pcl", "trace", "trace"]):
        # far from the identity (what it fits is tested with the layer): these easy tasks' V~ shifted down a lot
        layer.theta = theta = np.array([-3.0, 1.0])
        seen = layer.steps_seen
        res = eng.grow(make_tasks(6, seed=step, steps=(2, 3)), get_method(name), step)
        v = np.array([t.root.predicted for t in res.trees])  # the trees keep V~ itself
        probe = RootCalibrator()
        probe.theta = theta
        want = probe.predict(v) if name == "trace" else v  # only TRACE's root allocator reads the layer
        m = allocate_method_roots(get_method(name), want, plan, seed=derive_seed(0, "roots", step))
        assert [len(t.started_rewards(t.root_id)) for t in res.trees] == m.tolist()
        other = allocate_method_roots(get_method(name), v, plan, seed=derive_seed(0, "roots", step))
        differs.append(not np.array_equal(m, other))
        assert layer.steps_seen == seen + (name == "trace")  # and only TRACE's steps teach it
    assert any(differs)


def test_without_the_layer_stage_2_reads_q_from_v_and_records_it(tok):
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)
    res = engine(tok, light_text_predictor(), plan).grow(make_tasks(4, seed=0, steps=(2, 3)), get_method("trace"))
    anchors = [(node, r) for t in res.active for node, r in t.anchors()]
    assert anchors and all(n.flip_predicted == prefix_flip_prob(r, n.predicted) for n, r in anchors)


@pytest.mark.parametrize("batching", ["round", "eager"])
def test_pooled_stage2_spends_the_step_budget_on_trees_whose_bare_rollouts_agree(tok, batching):
    from trace_rl.allocation import allocate_tree_mixing, tree_mixing_value

    plan = BudgetPlan(prompts=4, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)
    runs = []
    for _ in range(2):
        eng = engine(tok, light_text_predictor(), plan, wrong_every=4, batching=batching)
        res = eng.grow(make_tasks(8, seed=4, steps=(2, 3)), get_method("trace_mix"), step=1)
        runs.append(_trees_json(res))
    if batching == "round":  # the barrier and the pooled allocation leave a seed's trees reproducible (eager
        assert runs[0] == runs[1]  # batches as requests come, and the scripted backend reads the call order)
    assert res.rollouts + res.unspent_prefix_budget == plan.total and res.unspent_prefix_budget == 0
    qs, agree, counts = [], [], []
    for t in res.active:
        anchors = t.anchors()
        qs.append(np.array([n.flip_predicted for n, _ in anchors]))
        agree.append(len({r > 0.5 for r in t.started_rewards(t.root_id)}) == 1)
        counts.append(np.array([len(t.started_rewards(n.node_id)) for n, _ in anchors]))
    assert sum(int(c.sum()) for c in counts) == res.continuations > 0
    best = allocate_tree_mixing(qs, agree, res.continuations)
    if any(a and q.size for q, a in zip(qs, agree)):
        for q, a, c in zip(qs, agree, counts):  # a tree's continuations all branch from its likeliest flip
            assert not c.sum() or (a and c[int(np.argmax(q))] == c.sum())
        assert tree_mixing_value(qs, agree, counts) == pytest.approx(tree_mixing_value(qs, agree, best), abs=1e-12)
    else:  # every tree mixed already: stage 2's own objective over every anchor of the step
        assert prefix_value(np.concatenate(qs), np.concatenate(counts)) == pytest.approx(
            prefix_value(np.concatenate(qs), np.concatenate(best)), abs=1e-12
        )
    if batching == "round":  # this step holds both kinds of tree: the test says something
        assert any(agree) and not all(agree)


def test_pooled_stage2_needs_the_local_executor(tok):
    class Elsewhere:
        async def run(self, ctx, jobs):
            raise AssertionError("never reached")

    plan = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=1, max_per_prompt=4)
    eng = engine(tok, light_text_predictor(), plan)
    eng.executor = Elsewhere()
    with pytest.raises(ValueError, match="trace_mix pools stage 2.*executor=local"):
        eng.grow(make_tasks(2, seed=0, steps=(2,)), get_method("trace_mix"))


def test_a_prompt_that_fails_before_the_pooled_stage2_ends_the_step_with_its_error(tok):
    class FailsOnOnePrompt:  # the light predictor, except on the anchors of the first prompt to finish its bare
        def __init__(self):  # rollouts: that prompt fails before it hands in, the others wait at the barrier
            self.inner, self.failed = light_text_predictor(), False

        def predict(self, items):
            if not self.failed and any(node != t.root_id for t, node in items):
                self.failed = True
                raise RuntimeError("predictor broke on one prompt")
            return self.inner.predict(items)

        def update(self, examples, targets):
            return self.inner.update(examples, targets)

    plan = BudgetPlan(prompts=3, rollouts_per_prompt=4, branch_factor=1, pool_factor=1, max_per_prompt=4)
    eng = engine(tok, FailsOnOnePrompt(), plan)

    async def step():  # inside a caller's event loop, which nothing ends: the prompts left waiting must end
        with pytest.raises(RuntimeError, match="predictor broke on one prompt"):
            await eng.agrow(make_tasks(3, seed=2, steps=(2, 3)), get_method("trace_mix"))
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for _ in range(3000):  # prompts still in their bare rollouts reach the barrier, then end (30 s at most)
            if all(t.done() for t in others):
                break
            await asyncio.sleep(0.01)
        return [t for t in others if not t.done()]

    assert asyncio.run(step()) == []


def test_pooled_stage2_is_refused_with_ray_before_anything_runs():
    from trace_rl.rollout.engine import check_executor

    check_executor("local", methods=["trace_mix"])
    check_executor("ray", methods=["trace", "grpo"])
    with pytest.raises(ValueError, match="executor=ray: trace_mix pools stage 2.*executor=local"):
        check_executor("ray", methods=["grpo", "trace_mix"])
    with pytest.raises(ValueError, match="trace_mix:grpo pools stage 2"):
        check_executor("ray", methods=["trace_mix:grpo"])


def test_cost_budget_stage2_spends_each_prompts_rollout_tokens_at_each_anchors_price(tok):
    from trace_rl.allocation import allocate_prefixes_under_cost, quantise_costs

    plan = BudgetPlan(prompts=4, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)
    res = engine(tok, light_text_predictor(), plan, wrong_every=3).grow(
        make_tasks(8, seed=4, steps=(2, 3)), get_method("trace_cost"), step=1
    )
    counted = engine(tok, light_text_predictor(), plan, wrong_every=3).grow(
        make_tasks(8, seed=4, steps=(2, 3)), get_method("trace"), step=1
    )
    assert res.continuations > counted.continuations  # continuations cost less than whole rollouts
    for t in res.active:
        anchors = t.anchors()
        if not anchors:
            continue
        q = np.array([n.flip_predicted for n, _ in anchors])
        counts = np.array([len(t.started_rewards(n.node_id)) for n, _ in anchors])
        cost, rollout_cost = t.anchor_costs()
        bare = len(t.started_rewards(t.root_id))
        budget = int(bare * plan.branch_factor * rollout_cost)
        assert int(counts @ np.array(cost)) <= budget  # priced at the bare rollouts' lengths: within the budget
        units, spend = quantise_costs(cost, budget)
        best = allocate_prefixes_under_cost(q, units, spend)
        assert prefix_value(q, counts) == pytest.approx(prefix_value(q, best), abs=1e-12)
