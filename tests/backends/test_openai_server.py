"""OpenAIServerBackend against a stub /v1/completions server on 127.0.0.1 (port 0, bounded loop, shut down)."""

import asyncio
import socket

import pytest
from helpers_openai_server import EOS, Stub, make, sample

from trace_rl.backends.base import SamplingParams
from trace_rl.backends.openai_server import MalformedReply, ServerError, ServerUnsupported
from trace_rl.errors import UserError


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


PARAMS = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=6, stop=("END",))
PROMPTS = [[5, 6, 7, 8, 9], [5, 6, 7], [1, 2]]


@pytest.mark.parametrize("mode", ["ids", "strings", "text"])
def test_ids_and_logprobs_round_trip(stub, mode):
    stub.mode = mode
    be = make(stub.url, retokenize=mode == "text")
    be.probe()
    gens = be.generate(PROMPTS, PARAMS, seeds=[10, 11, 12])
    for p, s, g in zip(PROMPTS, [10, 11, 12], gens):
        ids, lps, reason = sample(p, s, 6)
        assert g.token_ids == ids and g.logprobs == pytest.approx(lps) and g.stop_reason == reason
    assert gens[2].token_ids[-1] == EOS  # in text mode the EOS comes back from the log-prob count
    assert [g.prefix_tokens_computed for g in gens] == [1, 3, 2]
    assert be.stats["retokenized"] == (3 if mode == "text" else 0)
    be.close()


def test_each_row_sends_its_own_seed_and_the_sampling_settings(stub):
    be = make(stub.url + "/v1/")
    be.generate(PROMPTS, PARAMS, seeds=[10, 11, 12])
    bodies = sorted((b for _, b in stub.bodies), key=lambda b: b["seed"])
    assert {path for path, _ in stub.bodies} == {"/v1/completions"}
    assert [(b["prompt"], b["seed"]) for b in bodies] == list(zip(PROMPTS, [10, 11, 12]))
    b = bodies[0]
    assert (b["model"], b["max_tokens"], b["temperature"], b["top_p"], b["logprobs"]) == ("stub-model", 6, 0.8, 0.95, 1)
    assert b["stop"] == ["END"] and b["return_tokens_as_token_ids"] and b["return_token_ids"]
    be.close()


def test_retries_5xx_with_exponential_backoff_then_succeeds(stub):
    delays = []
    be = make(stub.url, backoff=0.1, sleep=delays.append)
    stub.failures = [503, 502]
    g = be.generate([[5, 6]], PARAMS, seeds=[1])[0]
    assert g.token_ids == sample([5, 6], 1, 6)[0]
    assert stub.hits == 3 and delays == [0.1, 0.2] and be.stats["retries"] == 2
    be.close()


def test_persistent_5xx_gives_up_after_the_retries(stub):
    delays = []
    be = make(stub.url, max_retries=2, backoff=1.0, max_backoff=1.5, sleep=delays.append)
    stub.failures = [500] * 5
    with pytest.raises(
        ServerError,
        match=r"HTTP 500: stub says 500 second line \(gave up after 3 attempts in [\d.e-]+ s; the bound is 60 s\)",
    ):
        be.generate([[5, 6]], PARAMS, seeds=[1])
    assert stub.hits == 3 and delays == [1.0, 1.5]  # capped at max_backoff
    be.close()


def test_400_fails_at_once_with_one_line_naming_status_and_message(stub):
    delays = []
    be = make(stub.url, sleep=delays.append)
    stub.failures = [400]
    with pytest.raises(ServerError) as err:
        be.generate([[5, 6]], PARAMS, seeds=[1])
    msg = str(err.value)
    assert "HTTP 400" in msg and "stub says 400 second line" in msg and "\n" not in msg
    assert err.value.status == 400 and stub.hits == 1 and delays == []
    be.close()


def test_connection_refused_is_retried_then_a_clear_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    delays = []
    be = make(f"http://127.0.0.1:{port}", max_retries=3, backoff=0.01, sleep=delays.append)
    with pytest.raises(ConnectionError, match=rf"127.0.0.1:{port}/v1/completions.*gave up after 4 attempts"):
        be.generate([[5, 6]], PARAMS, seeds=[1])
    assert delays == [0.01, 0.02, 0.04]
    be.close()


def test_agenerate_inside_an_event_loop(stub):
    be = make(stub.url)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        gens = await be.agenerate(PROMPTS, PARAMS, seeds=[10, 11, 12])
        t.cancel()
        return gens, ticks

    gens, ticks = asyncio.run(main())
    assert [g.token_ids for g in gens] == [sample(p, s, 6)[0] for p, s in zip(PROMPTS, [10, 11, 12])]
    assert ticks > 0  # the loop kept running while the rows were out
    be.close()


def test_mismatched_retokenisation_and_missing_logprobs_are_errors():
    be = make("http://127.0.0.1:9", retokenize=True)
    reply = {
        "choices": [{"text": "AB", "finish_reason": "length", "logprobs": {"tokens": ["AB"], "token_logprobs": [-0.1]}}]
    }
    with pytest.raises(ServerError, match="1 log-probs for 2 tokens"):
        be.to_generation(reply, 3)
    reply["choices"][0]["logprobs"] = None
    with pytest.raises(ServerError, match="no log-probs"):
        be.to_generation(reply, 3)
    be.close()


def test_weights_cannot_be_pushed_but_a_version_bump_resets_the_server_cache(stub):
    be = make(stub.url, reset_path="/reset_prefix_cache")
    with pytest.raises(NotImplementedError, match="cannot push weights"):
        be.update_weights({"w": 0})
    assert be.weight_version == 0
    assert be.update_weights() == 1 and stub.bodies[-1][0] == "/reset_prefix_cache"
    be.close()


@pytest.mark.parametrize(
    "mode, kw, lacks",
    [
        ("hf-serve", {}, "rejects vLLM's token-id request fields"),
        ("hf-serve", {"vllm_extensions": False}, "does not accept a prompt of token ids"),
        ("no-logprobs", {}, "returns no log-probs"),
        ("text", {}, "returns no sampled token ids"),
    ],
)
def test_a_server_without_the_token_id_protocol_is_refused_at_start_up_in_one_line(stub, mode, kw, lacks):
    stub.mode = mode
    be = make(stub.url, **kw)
    with pytest.raises(ServerUnsupported, match=lacks) as err:
        be.probe()
    assert "\n" not in str(err.value) and stub.url in str(err.value)
    assert stub.hits == 1  # probed once, no retry on a 4xx
    be.close()


def test_a_text_only_server_is_refused_at_run_time_too_unless_retokenising_was_chosen(stub):
    stub.mode = "text"
    be = make(stub.url)
    with pytest.raises(ServerError, match="no sampled token ids"):
        be.generate(PROMPTS[:1], PARAMS, seeds=[10])
    be.close()


def test_an_unreachable_server_is_refused_in_one_line():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    be = make(f"http://127.0.0.1:{port}", max_retries=1)
    with pytest.raises(ServerUnsupported, match="cannot be reached") as err:
        be.probe()
    assert "\n" not in str(err.value)
    be.close()


def test_the_command_line_refuses_a_server_without_token_ids_before_any_work(stub, tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from trace_rl.cli import main

    stub.mode = "hf-serve"
    out = tmp_path / "run"
    args = ["policy.backend=server", f"policy.server_url={stub.url}", "policy.model=random-tiny", f"out={out}"]
    assert main(["rollout", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rejects vLLM's token-id request fields" in err[0], err
    assert stub.hits == 1 and not list(out.glob("**/*.jsonl"))  # probed once; nothing was rolled out


def good_reply(**choice):
    base = {"text": "AB", "finish_reason": "length", "token_ids": [15, 16]}
    base["logprobs"] = {"tokens": ["A", "B"], "token_logprobs": [-0.1, -0.2]}
    return {"choices": [{**base, **choice}]}


MALFORMED = [
    (b"<html>gateway</html>", "not JSON: <html>gateway</html>"),
    ([1, 2], "the reply is [1, 2] (list), not a JSON object"),
    ({"choices": 42}, "`choices` is 42 (int), not a non-empty list"),
    ({"id": "cmpl-1"}, "`choices` is null (NoneType), not a non-empty list"),
    ({"choices": []}, "`choices` is [] (list), not a non-empty list"),
    ({"choices": ["AB"]}, '`choices[0]` is "AB" (str), not an object'),
    (good_reply(text=7), "`choices[0].text` is 7 (int), not a string"),
    (good_reply(logprobs=[-0.1, -0.2]), "`choices[0].logprobs` is [-0.1, -0.2] (list), not an object"),
    (good_reply(logprobs={"token_logprobs": "-0.1"}), '`choices[0].logprobs.token_logprobs` is "-0.1" (str)'),
    (good_reply(logprobs={"token_logprobs": [-0.1, "x"]}), 'token_logprobs` is [-0.1, "x"] (list), not a list of'),
    (good_reply(logprobs={"token_logprobs": [-0.1], "tokens": "A"}), '`choices[0].logprobs.tokens` is "A" (str)'),
    (good_reply(token_ids="15 16"), '`choices[0].token_ids` is "15 16" (str), not a list of token ids'),
    (good_reply(token_ids=[15, -1]), "`choices[0].token_ids` is [15, -1] (list), not a list of token ids"),
    (good_reply(token_ids=[15, 1.5]), "`choices[0].token_ids` is [15, 1.5] (list)"),
    ({**good_reply(), "usage": 3}, "`usage` is 3 (int), not an object"),
    ({**good_reply(), "usage": {"prompt_tokens_details": {"cached_tokens": "4"}}}, 'cached_tokens` is "4" (str)'),
]


@pytest.mark.parametrize("reply, what", MALFORMED)
def test_a_malformed_reply_is_one_line_naming_the_server_and_the_field(stub, reply, what):
    stub.reply = reply
    be = make(stub.url)
    with pytest.raises(ServerUnsupported) as probed:  # at start-up
        be.probe()
    with pytest.raises(MalformedReply) as err:  # and in a run, should the server change its answers
        be.generate(PROMPTS[:1], PARAMS, seeds=[10])
    for msg in (str(probed.value), str(err.value)):
        assert "\n" not in msg and stub.url in msg and what in msg, msg
    assert isinstance(err.value, UserError) and isinstance(err.value, ServerError)  # the CLI shows one line
    be.close()


@pytest.mark.parametrize(
    "choice, what",
    [
        ({"finish_reason": "abort"}, "finish_reason='abort'"),
        ({"logprobs": None}, "no log-probs"),
        ({"token_ids": None, "logprobs": {"tokens": ["A", "B"], "token_logprobs": [-0.1, -0.2]}}, "no sampled token"),
        ({"token_ids": [15]}, "2 log-probs for 1 tokens"),
    ],
)
def test_a_completion_the_backend_cannot_use_names_the_server_at_run_time(stub, choice, what):
    stub.reply = good_reply(**choice)
    be = make(stub.url)
    with pytest.raises(MalformedReply, match=what) as err:
        be.generate(PROMPTS[:1], PARAMS, seeds=[10])
    assert str(err.value).startswith(f"server {stub.url}/v1/completions: ") and "\n" not in str(err.value)
    be.close()


def test_the_text_only_refusal_names_no_setting_a_command_cannot_take(stub):
    stub.mode = "text"
    be = make(stub.url)
    with pytest.raises(ServerUnsupported) as err:
        be.probe()
    assert "retokenize=True to" not in str(err.value)  # was "pass retokenize=True": no command accepts it
    assert "use such a server" in str(err.value) and "OpenAIServerBackend(retokenize=True)" in str(err.value)
    be.close()


def test_the_command_line_refuses_a_malformed_reply_in_one_line(stub, tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from trace_rl.cli import main

    stub.reply = {"choices": 42}
    args = ["policy.backend=server", f"policy.server_url={stub.url}", "policy.model=random-tiny", f"out={tmp_path}"]
    assert main(["rollout", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "malformed completion reply: `choices` is 42 (int)" in err[0] and stub.url in err[0], err
