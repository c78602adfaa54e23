"""executor=ray: the same trees as the local executor for the same seed, and a worker that dies mid-tree has
its prompt retried on another worker with the budget counted once. Two local workers on CPU."""

import os
import subprocess
import sys

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # as the executor does: Ray on 127.0.0.1 only
ray = pytest.importorskip("ray")

from trace_rl.methods import BudgetPlan, get_method  # noqa: E402
from trace_rl.predictors.text import light_text_predictor  # noqa: E402
from trace_rl.rollout.engine import TreeRolloutEngine  # noqa: E402
from trace_rl.rollout.ray_executor import RayConfig, RayExecutor  # noqa: E402
from trace_rl.rollout.records import step_record  # noqa: E402
from trace_rl.testbed.actor import TestbedActor  # noqa: E402
from trace_rl.testbed.env import TestbedConfig, make_tasks  # noqa: E402
from trace_rl.testbed.policy import SoftmaxPolicy  # noqa: E402
from trace_rl.testbed.simulate import SimulateConfig, run_simulation  # noqa: E402

SMALL = dict(
    steps=2,
    train_tasks=64,
    eval_tasks=16,
    eval_every=2,
    progress=False,
    budget=BudgetPlan(prompts=4, rollouts_per_prompt=4, pool_factor=2, max_per_prompt=4),
)


@pytest.fixture(scope="module")
def executor():
    # the workers import this module (DyingActor) and helpers_calc by name: put tests/ on their path
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    ex = RayExecutor(RayConfig(workers=2))
    yield ex
    ray.shutdown()


def test_the_executors_own_cluster_is_on_loopback():
    """A fresh process, no Ray settings in its environment: the cluster the executor starts has 127.0.0.1 as
    its node address, where Ray then binds every listener (measured with ss: see the module docstring)."""
    code = (
        "from trace_rl.rollout.ray_executor import RayConfig, RayExecutor\n"
        "RayExecutor(RayConfig(workers=1))\n"
        "import ray\n"
        "print(ray.nodes()[0]['NodeManagerAddress'], ray.get_runtime_context().gcs_address)\n"
        "ray.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
    env["PYTHONPATH"] = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    node, gcs = proc.stdout.split()[-2:]
    assert node == "127.0.0.1" and gcs.startswith("127.0.0.1:")


def _untimed(res):
    return [{k: v for k, v in r.items() if not k.startswith("timing_s/")} for rs in res.values() for r in rs]


def test_simulate_on_ray_gives_the_local_trees(executor, tmp_path):
    local = run_simulation(SimulateConfig(methods=["grpo", "trace"], seed=2, **SMALL), out=tmp_path / "local")
    remote = run_simulation(
        SimulateConfig(methods=["grpo", "trace"], seed=2, executor="ray", **SMALL), out=tmp_path / "ray"
    )
    assert _untimed(local) == _untimed(remote)


class DyingActor(TestbedActor):
    """Kills its worker process the first time any worker starts a prompt's rollouts (a crash mid-tree)."""

    def __init__(self, config, policy, marker):
        super().__init__(config, policy)
        self.marker = marker

    def start(self, tree, task, seeds):
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))  # exactly one worker wins this
        except FileExistsError:
            return super().start(tree, task, seeds)
        os._exit(1)


def _grow(actor, executor=None):
    plan = BudgetPlan(prompts=3, rollouts_per_prompt=4, branch_factor=1, pool_factor=1, max_per_prompt=4)
    engine = TreeRolloutEngine(actor, light_text_predictor(), plan, seed=5, executor=executor)
    res = engine.grow(TASKS, get_method("trace"), step=0)
    return res, [(t.root_id, n.node_id, n.action, n.reward) for t in res.trees for n in t.nodes.values()], plan


CONFIG = TestbedConfig()
TASKS = make_tasks(CONFIG, 3, seed=1)


def test_a_worker_that_dies_mid_tree_is_replaced_and_the_prompt_retried(executor, tmp_path):
    policy = SoftmaxPolicy(CONFIG, 2.0)
    want, trees, plan = _grow(TestbedActor(CONFIG, policy))
    actor = DyingActor(CONFIG, policy, str(tmp_path / "died"))
    before = executor.retries
    got, got_trees, _ = _grow(actor, executor)
    assert os.path.exists(tmp_path / "died")  # the worker did die
    assert executor.retries == before + 1
    assert got.worker_retries == 1 and step_record(got).rollout["worker_retries"] == 1  # in the step's metrics
    assert want.worker_retries == 0
    assert got_trees == trees
    assert got.rollouts + got.unspent_prefix_budget == plan.total == want.rollouts + want.unspent_prefix_budget


def test_lm_rollouts_on_ray_match_the_local_executor(executor):
    pytest.importorskip("transformers")
    from helpers_calc import scripted_calc

    from trace_rl.backends.base import SamplingParams, ScriptedBackend
    from trace_rl.envs.calculator import CalculatorEnv
    from trace_rl.envs.calculator import make_tasks as calc_tasks
    from trace_rl.lm.tokenizer import byte_tokenizer
    from trace_rl.rollout.lm_actor import LMActor

    tok = byte_tokenizer()
    plan = BudgetPlan(prompts=2, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)
    tasks = calc_tasks(4, seed=3, steps=(2, 3))
    out = []
    for ex in (None, executor):
        backend = ScriptedBackend(tok, lambda text, i: scripted_calc(text, len(text), 3))
        actor = LMActor(backend, CalculatorEnv, SamplingParams(max_new_tokens=64))
        res = TreeRolloutEngine(actor, light_text_predictor(), plan, seed=1, executor=ex).grow(
            tasks, get_method("trace"), 0
        )
        out.append([(t.root_id, n.node_id, n.token_ids, n.reward) for t in res.trees for n in t.nodes.values()])
    assert out[0] == out[1]
