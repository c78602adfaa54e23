"""A fake OpenAI-compatible /v1/completions server on 127.0.0.1 (port 0, bounded request loop, shut down by
`close`), for the server backend's tests: a deterministic 'model' (`sample`), modes that answer like other
servers (`mode`), a fixed reply (`reply`), error statuses (`failures`), and transport faults after some good
replies (`fault`, `fault_after`): a connection that never answers, one that sends a byte at a time, a body shorter
than its Content-Length, HTTP 500 or 404."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

from trace_rl.backends.openai_server import OpenAIServerBackend

EOS = 3


class CharTok:
    """Token t <-> chr(t + 50): invertible, so re-tokenising text gives the sampled ids back."""

    eos_token_id = EOS
    vocab_size = 200

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=[ord(c) - 50 for c in text])

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(t + 50) for t in ids if not (skip_special_tokens and t == EOS))


def sample(prompt, seed, n):
    """The stub's deterministic 'model': a row's tokens and log-probs from its prompt and seed."""
    if prompt[0] == 1:  # stops on EOS after one token
        return [12, EOS], [-0.25, -0.5], "stop"
    ids = [(seed + sum(prompt) + i) % 50 + 10 for i in range(n)]
    return ids, [-0.01 * (i + 1) - 0.001 * (seed % 7) for i in range(n)], "length"


class Stub:
    def __init__(self, mode="ids"):
        self.mode, self.bodies, self.failures, self.hits = mode, [], [], 0
        self.reply = None  # a fixed answer to every completion request (bytes: sent as they are)
        # hang | dribble | short | 500 | 404, from completion request fault_after + 1 on
        self.fault, self.fault_after = None, 0
        self.stall_s = 30.0  # how long 'hang' and 'dribble' last at most (until `close`)
        self.text_of = lambda ids: "".join(chr(t + 50) for t in ids if t != EOS)  # the text a reply gives for its ids
        self.stop = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # /v1/models, which the command line's config check reads
                self._send(200, {"object": "list", "data": [{"id": "random-tiny", "object": "model"}]})

            def do_POST(self):
                stub.hits += 1
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.bodies.append((self.path, body))
                if stub.fault and self.path == "/v1/completions" and stub.hits > stub.fault_after:
                    return self._fault(stub.fault)
                if stub.failures:
                    status = stub.failures.pop(0)
                    return self._send(
                        status, {"error": {"message": f"stub says {status}\nsecond line", "code": status}}
                    )
                if self.path == "/reset_prefix_cache":
                    return self._send(200, {})
                if stub.reply is not None:
                    return self._send(200, stub.reply)
                if stub.mode == "hf-serve":  # as `transformers serve` answered on this machine
                    extra = {"return_token_ids", "return_tokens_as_token_ids", "include_stop_str_in_output"} & set(body)
                    if extra:
                        return self._send(422, {"detail": f"Unexpected fields in the request: {sorted(extra)}"})
                    if not isinstance(body["prompt"], str):
                        return self._send(400, {"error": {"message": "prompt must be a string."}})
                ids, lps, reason = sample(body["prompt"], body["seed"], body["max_tokens"])
                text = stub.text_of(ids)
                tokens = [f"token_id:{t}" if stub.mode == "strings" else chr(t + 50) for t in ids]
                choice = {
                    "index": 0,
                    "text": text,
                    "finish_reason": reason,
                    "logprobs": {"tokens": tokens, "token_logprobs": lps, "top_logprobs": None},
                }
                if stub.mode == "no-logprobs":
                    choice["logprobs"] = None
                if stub.mode == "ids":
                    choice["token_ids"] = ids
                usage = {
                    "prompt_tokens": len(body["prompt"]),
                    "completion_tokens": len(ids),
                    "prompt_tokens_details": {"cached_tokens": 4 if len(body["prompt"]) > 4 else 0},
                }
                self._send(200, {"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": usage})

            def _fault(self, fault):
                if fault in ("500", "404"):
                    return self._send(int(fault), {"error": {"message": f"stub fault {fault}"}})
                if fault == "hang":  # reads the request, never answers (until the stub closes)
                    stub.stop.wait(stub.stall_s)
                    return
                if fault == "short":  # promises 1000 bytes, sends 10 and closes
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b'{"choices"')
                    self.close_connection = True
                    return
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")  # dribble: one header byte every 50 ms, never done
                for _ in range(int(stub.stall_s / 0.05)):  # bounded: stall_s, or until the client hangs up
                    if stub.stop.wait(0.05):
                        return
                    try:
                        self.wfile.write(b"X")
                        self.wfile.flush()
                    except OSError:
                        return

            def _send(self, status, obj):
                raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 0.05
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        for _ in range(4000):  # bounded: at most 200 s of 50 ms polls
            if self.stop.is_set():
                break
            self.server.handle_request()

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        self.server.server_close()


def make(url, **kw):
    kw.setdefault("sleep", lambda s: None)
    return OpenAIServerBackend(url, "stub-model", CharTok(), **kw)


def timed(fn):
    """(the exception `fn` raised, seconds it took)."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the caller checks the type
        return err, time.monotonic() - t0
    raise AssertionError("expected an exception")
