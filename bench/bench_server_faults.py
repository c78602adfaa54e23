"""How many classes of server fault end in one line: the server backend against the tests' fake server
(tests/helpers_openai_server.py, on 127.0.0.1), one case per class, each after one good reply unless it is the
first request's. A case counts when the call ends within LIMIT_S with a `UserError` (what `trace-rl` prints as one
line, exit code 2) whose message is one line naming the server. Every backend gets `timeout=5` (the old backend
read it as the socket timeout of each read; this one as the bound on a request, its retries included).

    PYTHONPATH=src .venv/bin/python bench/bench_server_faults.py
    # the code before: git archive COMMIT src | tar -x -C /tmp/old && PYTHONPATH=/tmp/old/src python bench/...
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers_openai_server import Stub, make  # noqa: E402

from trace_rl.backends.base import SamplingParams  # noqa: E402
from trace_rl.errors import UserError  # noqa: E402

LIMIT_S = 40.0
PARAMS = SamplingParams(max_new_tokens=6)


def good(**choice):
    base = {"text": "AB", "finish_reason": "length", "token_ids": [15, 16]}
    base["logprobs"] = {"tokens": ["A", "B"], "token_logprobs": [-0.1, -0.2]}
    return {"choices": [{**base, **choice}]}


def lps(*values):
    return {"tokens": ["A", "B"], "token_logprobs": list(values)}


# (name, first request?, stub attributes)
CASES = [
    ("HTTP 500, first request", True, {"fault": "500"}),
    ("HTTP 500 after good replies", False, {"fault": "500"}),
    ("HTTP 404 after good replies", False, {"fault": "404"}),
    ("body shorter than Content-Length", False, {"fault": "short"}),
    ("never answers", False, {"fault": "hang"}),
    ("a byte every 50 ms", False, {"fault": "dribble"}),
    ("deeply nested JSON", False, {"reply": b"[" * 200_000 + b"]" * 200_000}),
    ("not JSON", False, {"reply": b"<html>gateway</html>"}),
    ("NaN log-prob", False, {"reply": good(logprobs=lps(-0.1, float("nan")))}),
    ("positive log-prob", False, {"reply": good(logprobs=lps(-0.1, 0.5))}),
    ("token id 1e9", False, {"reply": good(token_ids=[15, 10**9])}),
    ("ids that do not decode to the text", False, {"reply": good(token_ids=[16, 15])}),
    ("log-probs and tokens disagree", False, {"reply": good(logprobs={"tokens": ["A"], "token_logprobs": [-1, -1]})}),
    ("more tokens than max_tokens", False, {"reply": good(token_ids=[15] * 7, text="A" * 7, logprobs=lps(*[-1] * 7))}),
]


def run_case(first: bool, attrs: dict) -> str:
    stub = Stub()
    stub.stall_s = LIMIT_S + 20  # a stalled server outlasts the wait
    be = make(stub.url, timeout=5, sleep=time.sleep)
    result: list = []

    def call():
        try:
            be.generate([[5, 6]], PARAMS, seeds=[1])
            result.append("accepted")
        except BaseException as err:  # noqa: BLE001 - classified below
            msg = str(err)
            one = isinstance(err, UserError) and "\n" not in msg and stub.url in msg
            result.append("one line" if one else f"traceback ({type(err).__name__})")

    try:
        if not first:
            be.generate([[5, 6]], PARAMS, seeds=[1])
        for key, value in attrs.items():
            setattr(stub, key, value)
        stub.fault_after = stub.hits
        t = threading.Thread(target=call, daemon=True)
        t0 = time.monotonic()
        t.start()
        t.join(LIMIT_S)
        took = time.monotonic() - t0
        return f"{result[0] if result else f'still running after {LIMIT_S:g} s'} ({took:.1f} s)"
    finally:
        stub.close()


def main() -> None:
    ok = 0
    for name, first, attrs in CASES:
        outcome = run_case(first, attrs)
        ok += outcome.startswith("one line")
        print(f"{name:40s} {outcome}", flush=True)
    print(f"{ok} of {len(CASES)} classes end in one line within {LIMIT_S:g} s")


if __name__ == "__main__":
    main()
