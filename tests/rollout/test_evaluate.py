"""Held-out evaluation is the engine's flat evaluation (`TreeRolloutEngine.evaluate`, the step's own episode loop):
a sample's result depends on its own seed (not the batch size), it equals episodes played one by one outside the
engine, and the report's episodes come back as valid trees."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers_calc import scripted_calc  # noqa: E402

from trace_rl.agent.react import ChatFormat, apply_generation, start_episode  # noqa: E402
from trace_rl.backends.base import SamplingParams, ScriptedBackend  # noqa: E402
from trace_rl.backends.hf import HFBackend  # noqa: E402
from trace_rl.envs.calculator import CalculatorEnv, make_tasks  # noqa: E402
from trace_rl.envs.registry import get_env  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402
from trace_rl.lm.tokenizer import byte_tokenizer  # noqa: E402
from trace_rl.rollout.engine import TreeRolloutEngine  # noqa: E402
from trace_rl.rollout.evaluate import evaluate, pass_at_k, success_by_group  # noqa: E402
from trace_rl.rollout.lm_actor import LMActor  # noqa: E402
from trace_rl.seeding import derive_seed  # noqa: E402
from trace_rl.tree import BARE  # noqa: E402


@pytest.fixture(scope="module")
def actor():
    model, tok = create_tiny_model(seed=1)
    spec = get_env("calculator")
    return LMActor(HFBackend(model, tok), spec.make, SamplingParams(temperature=1.0, max_new_tokens=10))


def play_alone(actor: LMActor, task: dict, seed: int):
    """One episode played on its own, outside the engine: one row per backend call, turn t sampled from
    derive_seed(seed, t), the env's max-turns limit enforced as the actor does."""
    fmt = ChatFormat(actor.backend.tokenizer)
    ep = start_episode(actor.env_factory(), task, fmt)
    while not ep.done:
        [gen] = actor.backend.generate([ep.token_ids], actor.params, seeds=[derive_seed(seed, len(ep.turns))])
        apply_generation(ep, gen, fmt)
        ep.done = ep.done or len(ep.turns) >= ep.env.max_turns
    return ep


def test_results_do_not_depend_on_the_batch_size(actor):
    tasks = get_env("calculator").held_out(5, 3)
    runs = []
    for batch in (64, 3, 1):
        results: list = []
        evaluate(actor, tasks, samples=2, ks=(1, 2), batch=batch, seed=7, progress=False, results=results)
        runs.append(results)
    assert runs[0] == runs[1] == runs[2]
    other: list = []
    evaluate(actor, tasks, samples=2, batch=4, seed=8, progress=False, results=other)
    assert [r["generation"] for r in other] != [r["generation"] for r in runs[0]]  # the seed matters


def test_the_engine_evaluation_equals_episodes_played_one_by_one(actor):
    tasks = get_env("calculator").held_out(4, 11)
    results: list = []
    summary = evaluate(actor, tasks, samples=3, ks=(1, 3), batch=5, seed=4, progress=False, results=results)
    assert [(r["index"], r["sample"]) for r in results] == [
        (t.get("index", i), s) for i, t in enumerate(tasks) for s in range(3)
    ]
    for r, (i, s) in zip(results, [(i, s) for i in range(len(tasks)) for s in range(3)]):
        ep = play_alone(actor, tasks[i], derive_seed(4, i, s))  # the seed is a function of (seed, task, sample)
        assert r["score"] == float(ep.reward) and r["turns"] == len(ep.turns)
        assert r["generation"] == [
            {"thought": t.thought, "action": t.action, "observation": t.observation} for t in ep.turns
        ]
    assert summary == {"tasks": 4, "samples": 3, "pass@1": 0.0, "pass@3": 0.0}  # a random model solves nothing


def test_scores_and_pass_at_k_follow_the_rewards_of_each_sample():
    tok = byte_tokenizer()
    # right or wrong by the history's length only: the tasks get mixed outcomes, whatever the batch
    backend = ScriptedBackend(tok, lambda text, i: scripted_calc(text, 0, wrong_every=3))
    actor = LMActor(backend, CalculatorEnv, SamplingParams(max_new_tokens=64))
    tasks = make_tasks(6, seed=2, steps=(1, 2))
    results: list = []
    summary = evaluate(actor, tasks, samples=2, ks=(1, 2), batch=5, seed=0, progress=False, results=results)
    scores = [play_alone(actor, t, 0).reward for t in tasks]
    assert 0 < sum(scores) < len(tasks)  # some right, some wrong: the check below can fail
    assert [r["score"] for r in results] == [float(x) for x in scores for _ in range(2)]
    correct = [2 * int(x > 0.5) for x in scores]
    assert summary["pass@1"] == pytest.approx(sum(pass_at_k(2, c, 1) for c in correct) / len(tasks))
    assert summary["pass@2"] == pytest.approx(sum(pass_at_k(2, c, 2) for c in correct) / len(tasks))


def test_the_engine_evaluates_without_a_predictor_and_refuses_to_grow_without_one(actor):
    from trace_rl.methods import METHODS

    engine = TreeRolloutEngine(actor)
    tasks = get_env("calculator").held_out(2, 0)
    run = engine.evaluate(tasks, samples=2, batch=3)
    assert [len(run.rollouts(i)) for i in range(2)] == [2, 2]
    for tree in run.trees:  # bare chains, one per sample, each ending in a rewarded terminal turn
        assert all(n.origin == BARE for n in tree.turns())
        assert [n.terminal for n in tree.leaves()] == [True, True] and len(tree.anchors()) == len(tree) - 3
    assert run.generated_tokens == sum(len(n.logprobs) for t in run.trees for n in t.turns())
    default = engine.evaluate(tasks, samples=2, seeds=lambda i, s: derive_seed(engine.seed, i, s), batch=3)
    assert [t.to_dict() for t in default.trees] == [t.to_dict() for t in run.trees]
    with pytest.raises(ValueError, match="evaluates"):
        engine.grow(tasks, METHODS["grpo"])
    with pytest.raises(ValueError, match="samples must be >= 1"):
        engine.evaluate(tasks, samples=0)


def test_the_report_returns_each_episode_as_a_one_rollout_tree(actor):
    spec = get_env("calculator")
    tasks = spec.held_out(4, 5)
    report, trees = success_by_group(actor, tasks, spec.group, seed=0, batch=3)
    assert {"overall", "well_formed"} <= set(report)
    assert {spec.group(t) for t in tasks} <= set(report)
    for i, tree in enumerate(trees):
        leaves = [n for n in tree.turns() if n.terminal]
        assert len(leaves) == 1 and tree.root.token_ids and leaves[0].reward is not None
        assert all(len(n.loss_mask) == len(n.token_ids) for n in tree.turns())
        ep = play_alone(actor, tasks[i], derive_seed(0, "report", i))
        assert [n.action for n in tree.path(leaves[0].node_id)[1:]] == [t.action for t in ep.turns]
    again, _ = success_by_group(actor, tasks, spec.group, seed=0, batch=64)
    assert again == report
