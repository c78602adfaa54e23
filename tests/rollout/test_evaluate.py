"""Held-out evaluation plays its episodes through the TRACE step's actor: a sample's result depends on its own
seed (not the batch size), and the report's episodes come back as valid trees."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.backends.base import SamplingParams  # noqa: E402
from trace_rl.backends.hf import HFBackend  # noqa: E402
from trace_rl.envs.registry import get_env  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402
from trace_rl.rollout.evaluate import evaluate, success_by_group  # noqa: E402
from trace_rl.rollout.lm_actor import LMActor  # noqa: E402


@pytest.fixture(scope="module")
def actor():
    model, tok = create_tiny_model(seed=1)
    spec = get_env("calculator")
    return LMActor(HFBackend(model, tok), spec.make, SamplingParams(temperature=1.0, max_new_tokens=10))


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


def test_the_report_returns_each_episode_as_a_one_rollout_tree(actor):
    spec = get_env("calculator")
    tasks = spec.held_out(4, 5)
    report, trees = success_by_group(actor, tasks, spec.group, seed=0, batch=3)
    assert {"overall", "well_formed"} <= set(report)
    assert {spec.group(t) for t in tasks} <= set(report)
    for tree in trees:
        leaves = [n for n in tree.turns() if n.terminal]
        assert len(leaves) == 1 and tree.root.token_ids and leaves[0].reward is not None
        assert all(len(n.loss_mask) == len(n.token_ids) for n in tree.turns())
    again, _ = success_by_group(actor, tasks, spec.group, seed=0, batch=64)
    assert again == report
