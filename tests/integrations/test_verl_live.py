"""The verl-facing classes against the installed verl 0.9.1 (skipped where verl is not installed).

No Ray cluster, vLLM server or TransferQueue runs here: the LLM server is a scripted fake that returns token
ids, the reward and TransferQueue calls are replaced by recorders, and the manager, worker and trainer are
built without their verl constructors (which start Ray actors and load models). What runs is verl's own
ToolAgentLoop code (chat templating, tool parsing and calls, token merging) under our sessions, our worker's
per-prompt tree growth and TransferQueue protocol, the manager's allocation, the trainer's advantage and
predictor steps on verl's nested tensors, and verl's plugin loader on our entry point.
"""

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

verl = pytest.importorskip("verl")
if verl.__version__ != "0.9.1":
    pytest.skip(f"written against verl 0.9.1, found {verl.__version__}", allow_module_level=True)

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap  # noqa: E402
from verl.tools.function_tool import FunctionTool  # noqa: E402
from verl.tools.schemas import OpenAIFunctionToolSchema  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402
from verl_launch import launch_overrides  # noqa: E402

from trace_rl.integrations.verl import manager as manager_mod  # noqa: E402
from trace_rl.integrations.verl import trainer as trainer_mod  # noqa: E402
from trace_rl.integrations.verl import worker as worker_mod  # noqa: E402
from trace_rl.integrations.verl.advantage import leaf_record, token_advantages  # noqa: E402
from trace_rl.integrations.verl.budgets import TraceSettings, expected_rows  # noqa: E402
from trace_rl.integrations.verl.loop import TraceToolAgentLoop  # noqa: E402
from trace_rl.integrations.verl.predictor_state import shared_layers  # noqa: E402
from trace_rl.lm.tokenizer import byte_tokenizer  # noqa: E402
from trace_rl.methods import BudgetPlan, get_method  # noqa: E402
from trace_rl.predictors.build import build_predictor  # noqa: E402
from trace_rl.rollout.engine import calibration_layers  # noqa: E402
from trace_rl.trace_config import PredictorSettings, TraceConfig  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
TOK = byte_tokenizer()
CALC = FunctionTool(
    name="calc",
    fn=lambda expression: str(eval(expression, {})),
    tool_schema=(
        OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": "calc",
                    "description": "Evaluate an arithmetic expression.",
                    "parameters": {
                        "type": "object",
                        "properties": {"expression": {"type": "string", "description": "e"}},
                        "required": ["expression"],
                    },
                },
            }
        )
    ),
)
CONFIG = {
    "actor_rollout_ref": {
        "rollout": {
            "n": 4,
            "prompt_length": 512,
            "response_length": 1024,
            "full_determinism": False,
            "name": "vllm",
            "multi_turn": {
                "max_user_turns": 6,
                "max_assistant_turns": 6,
                "max_parallel_calls": 1,
                "max_tool_response_length": 256,
                "tool_response_truncate_side": "middle",
                "format": "hermes",
            },
        }
    },
    "data": {"apply_chat_template_kwargs": {}, "mm_processor_kwargs": {}},
    "trace_rl": {"method": "trace", "budget": {"branch_factor": 1, "max_per_prompt": 8}},
}


class FakeServer:
    """verl's LLMServerClient.generate, scripted: up to two calculator calls, then an answer that is right
    (5) or wrong (6) by a seeded draw; records the sticky request id of every call."""

    def __init__(self, seed: int = 0, p_right: float = 0.5):
        self.rng, self.p_right, self.request_ids = np.random.default_rng(seed), p_right, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.request_ids.append(request_id)
        calls = TOK.decode(prompt_ids).count("<|im_start|>tool")
        if calls < 2 and self.rng.random() < 0.7:
            reply = '<tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call>'
        else:
            reply = "answer 5" if self.rng.random() < self.p_right else "answer 6"
        ids = TOK(reply, add_special_tokens=False).input_ids + [TOK.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids), stop_reason="completed")


def _loop(server) -> TraceToolAgentLoop:
    cfg = OmegaConf.create(CONFIG)
    return TraceToolAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=server,
        tokenizer=TOK,
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(cfg.data),
        hf_model_type=None,
        tools=ToolListWrap([CALC]),
    )


def _reward(output) -> float:
    return 1.0 if "answer 5" in TOK.decode(output.response_ids) else 0.0


def test_tool_loop_sessions_step_fork_and_close_like_run():
    async def main():
        server = FakeServer(seed=1, p_right=1.0)
        loop = _loop(server)

        async def score(out):
            return _reward(out)

        prompt = [{"role": "user", "content": "What is 2+3?"}]
        s = loop.session({"temperature": 1.0}, "trace-u1", score, raw_prompt=prompt)
        turns = [await s.step()]
        twin = s.fork()
        while not s.done:
            turns.append(await s.step())
        out = s.output
        # the turns tile the response exactly: tokens, mask, and the policy tokens' log-probs
        assert [t for turn in turns for t in turn["token_ids"]] == out.response_ids
        assert [m for turn in turns for m in turn["loss_mask"]] == out.response_mask
        assert sum(len(t["logprobs"]) for t in turns) == sum(out.response_mask)
        text = TOK.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        assert out.prompt_ids == TOK(text, add_special_tokens=False).input_ids
        assert s.reward == 1.0 and "5" in turns[0]["observation"]  # the calculator ran
        # the fork resumed from the first turn, with its own history
        assert not twin.done and twin.data.prompt_ids == out.prompt_ids + turns[0]["token_ids"]
        while not twin.done:
            await twin.step()
        assert twin.output.response_ids[: len(turns[0]["token_ids"])] == turns[0]["token_ids"]
        assert s.output.response_ids == out.response_ids  # the source did not move
        assert set(server.request_ids) == {"trace-u1"}
        # as a plain agent loop it is verl's tool agent
        plain = await loop.run({"temperature": 1.0}, raw_prompt=prompt)
        assert plain.prompt_ids == out.prompt_ids and sum(plain.response_mask) > 0

    asyncio.run(main())


class Recorder:
    def __init__(self):
        self.tags, self.outputs = [], []

    async def async_kv_put(self, key, partition_id, tag):
        self.tags.append((key, partition_id, tag["status"]))


def _worker(monkeypatch, server, recorder):
    w = object.__new__(worker_mod._TraceAgentLoopWorker)
    w.config = OmegaConf.create(CONFIG)
    w.trace = TraceSettings.from_config(w.config.trace_rl)
    w.predictor = build_predictor(PredictorSettings(), get_method("trace"), 0)
    w.flip_model = calibration_layers(w.trace.config)[0]  # as __init__ sets it (raw here: None)
    w.llm_client, w.tokenizer, w.processor, w.hf_model_type, w.dataset_cls = server, TOK, None, None, None
    w.tools = [CALC]

    async def compute_score(outputs, kwargs):
        outputs[-1].reward_score = _reward(outputs[-1])

    async def postprocess(output, validate, **kwargs):
        recorder.outputs.append((output, kwargs))

    w._compute_score, w._agent_loop_postprocess = compute_score, postprocess
    monkeypatch.setattr(worker_mod, "tq", recorder)
    return w


def test_worker_grows_a_tree_per_prompt_and_puts_every_leaf_as_a_session(monkeypatch):
    server, rec = FakeServer(seed=2), Recorder()
    w = _worker(monkeypatch, server, rec)
    prompt = {
        "uid": "u-7",
        "agent_name": "trace_tool_agent",
        "raw_prompt": [{"role": "user", "content": "2+3?"}],
        "__rollout_n__": torch.tensor(4),
        "__trace_value__": torch.tensor(0.5),
        "data_source": "toy",
    }
    trajectory = {"step": 3, "sample_index": 0, "rollout_n": 0, "validate": False}
    asyncio.run(w._run_prompt(dict(prompt), {"temperature": 1.0}, trajectory))
    assert rec.tags == [("u-7", "train", "running"), ("u-7", "train", "finished")]
    records = [out.extra_fields["trace"] for out, _ in rec.outputs]
    assert [kw["session_id"] for _, kw in rec.outputs] == list(range(len(rec.outputs)))  # ints, as verl expects
    assert 4 < len(rec.outputs) <= 8 and len({r["leaf"] for r in records}) == len(records)
    assert all(kw["uid"] == "u-7" and "agent_name" not in kw for _, kw in rec.outputs)
    assert set(server.request_ids) == {"trace-u-7"}  # one sticky id per tree
    for out, _ in rec.outputs:
        rec_ = out.extra_fields["trace"]
        assert rec_["root_id"] == "u-7" and rec_["nodes"][-1]["node_id"] == rec_["leaf"] and "unspent" in rec_
        # the record's path holds the row's own response: its token ids, loss mask and log-probs, turn by turn
        turns = rec_["nodes"][1:]
        assert [t for n in turns for t in n["token_ids"]] == list(out.response_ids)
        assert [m for n in turns for m in n["loss_mask"]] == list(out.response_mask)
        assert [lp for n in turns for lp in n["logprobs"]] == [
            lp for lp, m in zip(out.response_logprobs, out.response_mask) if m
        ]
        assert out.reward_score == _reward(out) and rec_["nodes"][0]["predicted"] == 0.5
    assert any(n["origin"] == "branch" for r in records for n in r["nodes"])
    advs, trees = token_advantages(
        records, [o.reward_score for o, _ in rec.outputs], [len(o.response_ids) for o, _ in rec.outputs]
    )
    assert len(trees) == 1 and len(trees[0].leaves()) == len(records) and all(len(a) for a in advs)


def test_worker_reports_failure_and_leaves_validation_to_verl(monkeypatch):
    rec = Recorder()
    w = _worker(monkeypatch, FakeServer(seed=3), rec)

    async def no_reward(outputs, kwargs):
        outputs[-1].reward_score = None  # a colocated reward model scores after sampling: too late for a tree

    w._compute_score = no_reward
    prompt = {
        "uid": "u-8",
        "agent_name": "trace_tool_agent",
        "raw_prompt": [{"role": "user", "content": "2+3?"}],
        "__rollout_n__": torch.tensor(2),
    }
    asyncio.run(w._run_prompt(dict(prompt), {}, {"step": 1, "validate": False}))
    assert rec.tags[-1] == ("u-8", "train", "failure") and not rec.outputs
    seen = []

    async def flat(self, prompt, sampling_params, trajectory, trace=False):
        seen.append(prompt["uid"])

    monkeypatch.setattr(worker_mod.compat.AgentLoopWorkerBase, "_run_prompt", flat)
    asyncio.run(w._run_prompt(dict(prompt), {}, {"step": 1, "validate": True}))
    asyncio.run(w._run_prompt({**prompt, "agent_name": "tool_agent"}, {}, {"step": 1, "validate": False}))
    assert seen == ["u-8", "u-8"]


def test_manager_writes_root_counts_that_keep_batch_times_n():
    m = object.__new__(manager_mod.TraceAgentLoopManager)
    m.trace = TraceSettings(TraceConfig("trace", budget=BudgetPlan(branch_factor=1, max_per_prompt=8)))
    m.predictor = build_predictor(PredictorSettings(), get_method("trace"), 0)
    m.flip_model, m.root_model = shared_layers(m.trace.config, 0)  # as __init__ sets them (raw here: None)
    m.rollout_config = OmegaConf.create({"n": 4})
    questions = ["2+3?", "1234*5678-91011?", "7?", "(12+34)*(56-7)?", "9-9?", "100/4?"]
    batch = tu.get_tensordict(
        {
            "uid": np.array([f"u{i}" for i in range(6)], dtype=object),
            "raw_prompt": np.array([[{"role": "user", "content": q}] for q in questions], dtype=object),
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", 2)
    counts = m.allocate(batch)
    assert batch["__rollout_n__"].tolist() == counts.tolist()
    assert expected_rows(counts, m.trace) == 6 * 4
    assert batch["__trace_value__"].shape == (6,)
    for chunk in batch.chunk(2):  # what each worker receives
        assert chunk["__rollout_n__"].shape == (3,)


def _store(trees):
    """TransferQueue rows as the worker writes them: one per leaf, nested response tensors."""
    store, keys, tags = {}, [], []
    for tree in trees:
        for i, leaf in enumerate(tree.leaves()):
            mask = [m for n in tree.path(leaf.node_id)[1:] for m in n.loss_mask]
            rm = torch.zeros(len(mask))
            rm[-1] = leaf.reward
            key = f"{tree.root_id}_{i}_0"
            store[key] = {
                "response_mask": torch.tensor(mask),
                "rm_scores": rm,
                "advantages": torch.full((len(mask),), 7.0),
                "extra_fields": json.loads(json.dumps({"trace": leaf_record(tree, leaf.node_id)})),
            }
            keys.append(key)
            tags.append({"status": "success"})
    pad = f"pad0_{0}_0"
    store[pad] = dict(store[keys[0]])  # verl's padding copies a real row, tree record included
    return store, keys + [pad], tags + [{"is_padding": True}]


def test_trainer_overwrites_tree_rows_and_updates_the_predictor(monkeypatch, trees):
    store, keys, tags = _store(trees)
    put = {}

    class FakeTQ:
        @staticmethod
        def kv_batch_get(keys, partition_id, select_fields):
            return tu.list_of_dict_to_tensordict([{f: store[k][f] for f in select_fields} for k in keys])

        @staticmethod
        def kv_batch_put(keys, partition_id, fields):
            put.update(keys=keys, fields=fields)
            return KVBatchMeta(partition_id=partition_id, keys=keys, tags=tags)

    monkeypatch.setattr(trainer_mod, "tq", FakeTQ)
    monkeypatch.setattr(trainer_mod.PPOTrainerSync.__mro__[1], "_compute_advantage", lambda self, b, m: b)
    monkeypatch.setattr(trainer_mod.PPOTrainerSync, "on_step_end", lambda self: None)
    t = object.__new__(trainer_mod.TraceTrainer)
    t.trace, t._step_trees, t.global_steps = TraceSettings(), [], 1
    t.predictor = build_predictor(PredictorSettings(), get_method("trace"), 0)
    t.layers = shared_layers(t.trace.config, 0)  # as __init__ sets them (raw here: None)
    metrics = {}
    monkeypatch.setenv("TRACE_SANDBOX", "weak")  # the weaker tool mode, chosen explicitly, shows in the metrics
    t._compute_advantage(KVBatchMeta(partition_id="train", keys=keys, tags=tags), metrics)
    assert metrics["trace/sandbox_weak"] == 1.0
    recs = [store[k]["extra_fields"]["trace"] for k in keys[:-1]]
    rewards = [float(store[k]["rm_scores"].sum()) for k in keys[:-1]]
    lengths = [len(store[k]["response_mask"]) for k in keys[:-1]]
    want, _ = token_advantages(recs, rewards, lengths, weighting=t.trace.config.weighting)
    got = list(put["fields"]["advantages"].unbind())
    assert len(got) == len(keys)
    for g, w in zip(got, want):
        assert np.allclose(g.numpy(), w, atol=1e-6)
    assert torch.equal(got[-1], store[keys[-1]]["advantages"])  # the padding row keeps verl's value
    assert torch.equal(put["fields"]["returns"].values(), put["fields"]["advantages"].values())
    assert metrics["trace/trees"] == len(trees) and metrics["trace/leaves_per_tree"] > 1
    prefixes = [(tr, tr.root_id) for tr in t._step_trees]
    before = t.predictor.predict(prefixes)
    t.on_step_end()
    assert not np.allclose(before, t.predictor.predict(prefixes)) and not t._step_trees
    assert t._pending_sync_metrics["trace/predictor_examples"] >= len(trees)


def test_flat_estimator_is_registered_and_matches_core_trace():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    import trace_rl.integrations.verl.plugin  # noqa: F401
    from trace_rl.integrations.verl.advantage import flat_trace_advantages

    rewards = torch.zeros(6, 4)
    rewards[[0, 2, 3], -1] = 1.0
    mask = torch.ones(6, 4)
    mask[1, 2:] = 0
    index = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    adv, ret = get_adv_estimator_fn("trace")(
        token_level_rewards=rewards, response_mask=mask, index=index, config=OmegaConf.create({})
    )
    want = flat_trace_advantages(rewards.sum(-1).numpy(), index)
    assert torch.allclose(adv, torch.as_tensor(want, dtype=torch.float32).unsqueeze(-1) * mask)
    assert torch.equal(adv, ret)


def test_verl_loads_the_plugin_from_its_entry_point(tmp_path):
    dist = tmp_path / "trace_rl_verl_plugin-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: trace-rl-verl-plugin\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[verl.plugins]\ntrace = trace_rl.integrations.verl.plugin\n")
    check = textwrap.dedent("""
        import json, sys, verl
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
        plugin = "trace_rl.integrations.verl.plugin" in sys.modules
        print(json.dumps(["trace" in TRAINER_REGISTRY, "trace" in ADV_ESTIMATOR_REGISTRY,
                          "trace_tool_agent" in _agent_loop_registry, plugin]))
    """)

    def start(policy):  # both at once: each is a cold `import verl`, several seconds on a CPU
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)]),
            "VERL_USE_EXTERNAL_PLUGINS": policy,
        }
        return subprocess.Popen(
            [sys.executable, "-c", check], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def result(proc):
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-2000:]
        return json.loads(out.strip().splitlines()[-1])

    on, off = start("trace"), start("none")
    assert result(on) == [True, True, True, True]
    assert result(off) == [False, False, False, False]  # the same check fails without the plugin


def launch_config():
    """verl 0.9.1's trainer config composed with examples/verl/run_trace_qwen3.sh's overrides (as main_ppo does)."""
    from hydra import compose, initialize_config_module

    import trace_rl.integrations.verl.plugin  # noqa: F401  (what the entry point loads)

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=launch_overrides())


def test_the_launch_script_passes_verls_own_validate_config():
    """What main_ppo runs before Ray starts: verl's validate_config on the composed launch config."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = launch_config()
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    # and it is verl's check that runs, not a formality: without a micro-batch size it refuses, as it did
    cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu = None
    with pytest.raises(ValueError, match="log_prob_micro_batch_size"):
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_the_launch_script_overrides_compose_against_verls_config():
    """Every override of examples/verl/run_trace_qwen3.sh names a key of verl 0.9.1's trainer config (or adds
    the trace_rl block), and what it names (trainer mode, manager class, agent loop) resolves."""
    from verl.utils.import_utils import load_class_from_fqn

    from trace_rl.integrations.verl.budgets import CONFIG_KEY, TraceSettings

    cfg = launch_config()
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1 import get_trainer_cls

    assert get_trainer_cls(cfg.trainer.v1.trainer_mode) is trainer_mod.TraceTrainer
    manager_fqn = cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    assert load_class_from_fqn(manager_fqn, "AgentLoopManager") is manager_mod.TraceAgentLoopManager
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop in _agent_loop_registry
    settings = TraceSettings.from_config(cfg[CONFIG_KEY])
    assert (cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n) % (1 + settings.branch_factor) == 0
    assert settings.config.budget.max_per_prompt >= cfg.actor_rollout_ref.rollout.n
    assert settings.config.weighting == "split" and settings.config.predictor.kind == "light"
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == "token-mean"


def test_manager_constructor_installs_the_tree_worker_and_refuses_unbatchable_budgets():
    cfg = OmegaConf.create({**CONFIG, "data": {**CONFIG["data"], "train_batch_size": 6}})
    cfg.actor_rollout_ref.model = {"path": "unused"}
    m = manager_mod.TraceAgentLoopManager(cfg, llm_client=None)  # no Ray call before create()'s worker start
    assert m.agent_loop_workers_class is worker_mod.TraceAgentLoopWorker
    assert m.predictor is trainer_mod.shared_predictor(TraceConfig(), 0)  # the object the trainer updates
    cfg.actor_rollout_ref.rollout.n = 3
    cfg.data.train_batch_size = 3
    with pytest.raises(ValueError, match="divide"):
        manager_mod.TraceAgentLoopManager(cfg, llm_client=None)


def test_the_example_tool_refuses_at_load_where_its_sandbox_cannot_run(monkeypatch):
    """verl loads function_tool_path with its own loader; a strict sandbox that cannot run stops the load in one
    line (never a tool whose every call fails while training goes on); weak mode, chosen by name, loads."""
    from verl.tools.function_tool import load_function_tools_from_path

    from trace_rl.envs import sandbox

    path = str(SRC.parent / "examples" / "verl" / "python_tool.py")
    monkeypatch.setattr(sandbox, "strict_unavailable", lambda: "bubblewrap (bwrap) is not installed")
    monkeypatch.setenv("TRACE_SANDBOX", "strict")
    with pytest.raises(sandbox.SandboxUnavailable, match="bwrap") as err:
        load_function_tools_from_path(path)
    assert "\n" not in str(err.value)
    monkeypatch.setenv("TRACE_SANDBOX", "sloppy")
    with pytest.raises(ValueError, match="sandbox must be one of"):
        load_function_tools_from_path(path)
    monkeypatch.setenv("TRACE_SANDBOX", "weak")
    monkeypatch.setattr(sandbox, "_warned_weak", False)
    with pytest.warns(RuntimeWarning, match="weak"):
        tools = load_function_tools_from_path(path)
    assert [t.name for t in tools] == ["python"]


def test_the_example_reward_loads_and_grades():
    """verl loads the reward file lazily (at the first finished rollout): its imports must be installed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("trace_reward", SRC.parent / "examples" / "verl" / "reward.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.compute_score("math", "so the answer is \\boxed{12}", "12") == 1.0
    assert mod.compute_score("math", "\\boxed{3}", "4") == 0.0
