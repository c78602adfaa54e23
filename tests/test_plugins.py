"""Issue 48's "done when": a root strategy, a predictor and a method of one's own, in a module outside the package,
run through `simulate`, `rollout` and `train` by `module:attr` (and by a registered name), with no package edit."""

import json
import sys
import textwrap

import numpy as np
import pytest

from trace_rl.cli import main
from trace_rl.registry import PREDICTORS, ROOTS
from trace_rl.trace_config import METHODS, BudgetPlan, check_method, get_method

PLUGIN = '''
import numpy as np

from trace_rl.registry import PredictorEntry, RootStrategy
from trace_rl.trace_config import Method

CALLS = {"roots": 0, "built": 0}


def even_roots(v, budget, plan, seed=0):
    """The pool's even-numbered candidates (P of them), the budget spread evenly."""
    CALLS["roots"] += 1
    m = np.zeros(v.size, dtype=np.int64)
    idx = np.arange(0, v.size, 2)[: plan.prompts]
    m[idx] = budget // idx.size
    m[idx[: budget % idx.size]] += 1
    return m


class Half:
    """V~ = 1/2 everywhere; learns nothing."""

    def predict(self, prefixes):
        return np.full(len(prefixes), 0.5)

    def update(self, prefixes, targets):
        return 0.0

    def save(self, path):
        pass

    def load(self, path):
        pass


def build(settings, seed):
    CALLS["built"] += 1
    return Half()


def testbed(env, tasks, policy, settings, seed):
    CALLS["built"] += 1
    return Half()


EVEN = RootStrategy("even", "the pool's even candidates, evenly", even_roots)
HALF = PredictorEntry("half", "V~ = 1/2", build, testbed)
FANCY = Method("fancy", "plugmod:EVEN", "random", "trace", "plugmod:HALF", changes="even roots", use="a test")
'''


@pytest.fixture
def plugmod(tmp_path, monkeypatch):
    (tmp_path / "plugmod.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("plugmod", None)
    import plugmod

    yield plugmod
    sys.modules.pop("plugmod", None)
    for registry in (METHODS, ROOTS, PREDICTORS):  # forget what this module's names resolved to
        registry._resolved.clear()


def test_entries_load_by_module_attr_and_are_named_as_the_config_names_them(plugmod):
    method = check_method("plugmod:FANCY")
    assert method.name == "plugmod:FANCY" and method.status == "experimental"
    assert method.root_strategy is plugmod.EVEN or method.root_strategy.allocate is plugmod.even_roots
    assert method.branches and not method.roots_on_value and method.own_predictor.name == "plugmod:HALF"
    m = ROOTS.resolve("plugmod:EVEN").allocate(np.zeros(8), 6, BudgetPlan(prompts=3), 0)
    assert m.tolist() == [2, 0, 2, 0, 2, 0, 0, 0]
    with pytest.raises(ValueError, match="no module 'nomod' on the Python path"):
        get_method("nomod:X")
    with pytest.raises(ValueError, match="plugmod:HALF is a PredictorEntry, not a method"):
        get_method("plugmod:HALF")


def test_simulate_runs_a_method_of_ones_own_beside_a_built_in(plugmod, tmp_path):
    out = tmp_path / "sim"
    argv = ["simulate", "methods=[plugmod:FANCY,grpo]", "steps=2", "eval_every=1", "train_tasks=512"]
    assert main([*argv, "eval_tasks=32", "progress=false", f"out={out}"]) == 0
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["method"] for r in recs} == {"plugmod:FANCY", "grpo"}
    mine = [r for r in recs if r["method"] == "plugmod:FANCY"]
    assert len(mine) == 2 and all(r["alloc/active_prompts"] == 32 and r["rollout/continuations"] > 0 for r in mine)
    assert plugmod.CALLS["roots"] == 2 and plugmod.CALLS["built"] == 1


LM = [
    "policy.model=random-tiny",
    "budget.prompts=2",
    "budget.rollouts_per_prompt=2",
    "budget.pool_factor=2",
    "budget.max_per_prompt=2",
    "policy.max_new_tokens=8",
    "progress=false",
]


def test_rollout_and_train_run_a_registered_method_on_a_predictor_kind_of_ones_own(plugmod, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    METHODS.register(get_method("plugmod:FANCY"), "fancy")  # also selectable by a plain name once registered
    try:
        out = tmp_path / "rollout"
        assert main(["rollout", *LM, "methods=[fancy,plugmod:FANCY]", "steps=1", f"out={out}"]) == 0
        recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert {r["method"] for r in recs} == {"fancy", "plugmod:FANCY"}
        assert plugmod.CALLS["roots"] == 2
        out = tmp_path / "train"
        argv = ["train", *LM, "method=grpo", "predictor.kind=plugmod:HALF", "steps=1", "eval_tasks=2"]
        assert main([*argv, "eval_samples=1", "logger=[jsonl]", f"out={out}"]) == 0
        assert plugmod.CALLS["built"] >= 1  # grpo reads predictor.kind: the module's V~ was built
        built = plugmod.CALLS["built"]
        out = tmp_path / "train_fancy"
        argv = ["train", *LM, "method=fancy", "steps=1", "eval_tasks=2", "eval_samples=1", "logger=[jsonl]"]
        assert main([*argv, f"out={out}"]) == 0
        assert plugmod.CALLS["roots"] == 3 and plugmod.CALLS["built"] > built
    finally:
        METHODS.unregister("fancy")
