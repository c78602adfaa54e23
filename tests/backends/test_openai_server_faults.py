"""The server backend against a fake server that misbehaves (helpers_openai_server.Stub on 127.0.0.1), one test per
class of fault: every failure, at the first request or after good replies, is one line naming the server and what
it sent (a `UserError`: `trace-rl` exits 2); a stalled or dribbling server ends within the time bound; a reply
that fails validation is refused. Timeouts are set small here through the setting (`timeout=`)."""

import pytest
from helpers_openai_server import Stub, make, sample, timed

from trace_rl.backends.base import SamplingParams
from trace_rl.backends.openai_server import (
    LOGPROB_TOLERANCE,
    MalformedReply,
    ServerError,
    ServerUnreachable,
    ServerUnsupported,
    watchdog_s,
)
from trace_rl.errors import UserError

PARAMS = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=6)
BOUND_S = 0.6  # the per-request bound these tests set
# generous: a hang is what fails (the bound was 300 s a try, 5 tries, and a dribbling server never ended)
ENDED_WITHIN_S = 20.0


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


def one_line_from(err: BaseException, url: str) -> str:
    msg = str(err)
    assert isinstance(err, UserError) and "\n" not in msg and url in msg, msg
    return msg


def test_good_replies_then_a_persistent_500_is_one_line_within_the_bound(stub):
    be = make(stub.url, timeout=BOUND_S)
    assert be.generate([[5, 6]], PARAMS, seeds=[1])[0].token_ids == sample([5, 6], 1, 6)[0]
    stub.fault, stub.fault_after = "500", stub.hits
    err, took = timed(lambda: be.generate([[5, 6]], PARAMS, seeds=[1]))
    msg = one_line_from(err, stub.url)
    assert isinstance(err, ServerError) and err.status == 500 and "HTTP 500" in msg and "gave up after" in msg
    assert took < ENDED_WITHIN_S
    be.close()


def test_a_404_after_good_replies_is_one_line_at_once(stub):
    be = make(stub.url, timeout=BOUND_S)
    be.generate([[5, 6]], PARAMS, seeds=[1])
    stub.fault, stub.fault_after = "404", stub.hits
    hits = stub.hits
    err, _ = timed(lambda: be.generate([[5, 6]], PARAMS, seeds=[1]))
    assert isinstance(err, ServerError) and err.status == 404 and "HTTP 404" in one_line_from(err, stub.url)
    assert stub.hits == hits + 1  # a 404 is not retried
    be.close()


def test_a_body_shorter_than_its_content_length_is_one_line(stub):
    be = make(stub.url, timeout=BOUND_S, max_retries=1)
    be.generate([[5, 6]], PARAMS, seeds=[1])
    stub.fault, stub.fault_after = "short", stub.hits
    err, _ = timed(lambda: be.generate([[5, 6]], PARAMS, seeds=[1]))
    msg = one_line_from(err, stub.url)
    assert isinstance(err, ServerUnreachable) and "shorter than its Content-Length of 1000" in msg
    assert "gave up after 2 attempts" in msg
    be.close()


@pytest.mark.parametrize("fault", ["hang", "dribble"])
def test_a_server_that_stalls_or_dribbles_ends_within_the_bound(stub, fault):
    """'dribble' sends a byte every 50 ms: a socket timeout alone (per read) would never fire."""
    be = make(stub.url, timeout=BOUND_S)
    be.generate([[5, 6]], PARAMS, seeds=[1])
    stub.fault, stub.fault_after = fault, stub.hits
    err, took = timed(lambda: be.generate([[5, 6], [5, 7]], PARAMS, seeds=[1, 2]))
    msg = one_line_from(err, stub.url)
    assert isinstance(err, ServerUnreachable) and "no complete reply within" in msg, msg
    assert f"the bound is {BOUND_S:g} s" in msg and took < ENDED_WITHIN_S
    be.close()


def test_a_stalled_server_at_start_up_is_refused_in_one_line(stub):
    stub.fault = "hang"
    be = make(stub.url, timeout=BOUND_S)
    err, took = timed(be.probe)
    assert isinstance(err, ServerUnsupported) and "cannot be reached" in str(err) and "\n" not in str(err)
    assert took < ENDED_WITHIN_S
    be.close()


def test_deeply_nested_json_is_one_line_not_a_recursion_error(stub):
    stub.reply = b"[" * 200_000 + b"]" * 200_000
    be = make(stub.url, timeout=BOUND_S)
    err, _ = timed(lambda: be.generate([[5, 6]], PARAMS, seeds=[1]))
    assert isinstance(err, MalformedReply) and "nested too deeply" in one_line_from(err, stub.url)
    err, _ = timed(be.probe)
    assert isinstance(err, ServerUnsupported) and "nested too deeply" in str(err)
    be.close()


def test_a_reply_larger_than_the_cap_is_one_line(stub):
    stub.reply = b" " * 5000 + b"{}"
    be = make(stub.url, timeout=BOUND_S, max_reply_bytes=4096, max_retries=0)
    err, _ = timed(lambda: be.generate([[5, 6]], PARAMS, seeds=[1]))
    assert isinstance(err, ServerUnreachable) and "larger than 4096 bytes" in one_line_from(err, stub.url)
    be.close()


def test_the_run_watchdog_ends_a_batch_no_request_timer_can_cut(stub, monkeypatch):
    """Name resolution runs before a request's timer exists: a batch with no row finished ends anyway."""
    import threading

    from trace_rl.backends import openai_server

    release = threading.Event()
    monkeypatch.setattr(openai_server, "exchange", lambda *a, **k: release.wait(30) and (200, b"{}"))
    be = make(stub.url, timeout=0.3)
    try:
        err, took = timed(lambda: be.generate([[5, 6]], PARAMS, seeds=[1]))
        msg = one_line_from(err, stub.url)
        assert isinstance(err, ServerUnreachable) and f"no request finished within {watchdog_s(0.3):.3g} s" in msg
        assert took < ENDED_WITHIN_S
    finally:
        release.set()
        be.close()


def good(**choice):
    base = {"text": chr(15 + 50) + chr(16 + 50), "finish_reason": "length", "token_ids": [15, 16]}
    base["logprobs"] = {"tokens": ["A", "B"], "token_logprobs": [-0.1, -0.2]}
    return {"choices": [{**base, **choice}]}


def lps(*values):
    return {"tokens": ["A", "B"], "token_logprobs": list(values)}


INVALID = [
    (good(logprobs=lps(-0.1, float("nan"))), "a log-prob of nan"),
    (good(logprobs=lps(-0.1, float("inf"))), "a log-prob of inf"),
    (good(logprobs=lps(-0.1, 0.5)), "a log-prob of 0.5; log-probs are finite and <= 0"),
    (good(token_ids=[15, 10**9]), "token id 1000000000 is outside the vocabulary of 200 tokens"),
    (good(token_ids=[16, 15]), "the token ids decode to"),
    (good(logprobs={"tokens": ["A"], "token_logprobs": [-0.1, -0.2]}), "2 log-probs for 1 entries"),
    (good(token_ids=[15] * 7, text=chr(65) * 7, logprobs=lps(*[-0.1] * 7) | {"tokens": None}), "7 tokens for a"),
]


@pytest.mark.parametrize("reply, what", INVALID)
def test_a_reply_that_fails_validation_is_refused_in_one_line(stub, reply, what):
    stub.reply = reply
    be = make(stub.url, timeout=BOUND_S)
    err, _ = timed(lambda: be.generate([[5, 6]], PARAMS, seeds=[1]))
    assert isinstance(err, MalformedReply) and what in one_line_from(err, stub.url)
    err, _ = timed(be.probe)  # at start-up too
    assert isinstance(err, ServerUnsupported) and "fails validation" in str(err) and what in str(err)
    be.close()


def test_a_rounding_sized_positive_log_prob_is_accepted_as_sent(stub):
    stub.reply = good(logprobs=lps(-0.1, LOGPROB_TOLERANCE / 2))
    be = make(stub.url, timeout=BOUND_S)
    be.probe()
    assert be.generate([[5, 6]], PARAMS, seeds=[1])[0].logprobs == [-0.1, LOGPROB_TOLERANCE / 2]
    be.close()


def test_a_stop_string_ending_inside_the_last_token_still_matches(stub):
    """After a 'stop' the text may end inside the last token; whitespace (a leading space the ids alone lose) and
    U+FFFD are not compared."""
    stub.reply = good(finish_reason="stop", text=" " + chr(65))  # ids decode to chr(65) + chr(66)
    be = make(stub.url, timeout=BOUND_S)
    assert be.generate([[5, 6]], PARAMS, seeds=[1])[0].token_ids == [15, 16]
    stub.reply = good(finish_reason="length", text=" " + chr(65))  # without a stop, a shorter text is a mismatch
    err, _ = timed(lambda: be.generate([[5, 6]], PARAMS, seeds=[1]))
    assert isinstance(err, MalformedReply) and "decode to" in str(err)
    be.close()


def test_the_command_line_shows_a_later_server_failure_as_one_line(stub, tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from trace_rl.cli import main
    from trace_rl.lm.tokenizer import word_tokenizer

    stub.text_of = word_tokenizer().decode  # the stub's text as the real tokenizer decodes its ids
    stub.fault, stub.fault_after = "500", 1  # the start-up probe gets a good reply, every later request a 500
    out = tmp_path / "run"
    args = ["policy.backend=server", f"policy.server_url={stub.url}", "policy.model=random-tiny", f"out={out}"]
    assert main(["rollout", *args, "policy.server_timeout=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "HTTP 500" in err[0] and stub.url in err[0] and "gave up after" in err[0], err


def test_the_time_bound_is_a_checked_setting(tmp_path, capsys):
    from trace_rl.cli import main

    assert main(["rollout", "policy.backend=server", "policy.server_url=http://127.0.0.1:9", "policy.server_timeout=0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "server_timeout must be a number of seconds in (0, 3600], got 0" in err[0], err
