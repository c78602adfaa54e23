"""OpenAI-compatible server backend: a vLLM server's `/v1/completions`, token ids in and out.

Each row is one POST with `prompt` as a list of token ids and the row's own `seed` (a batched prompt list
would share one seed), sent from a thread pool so rows run concurrently and the server batches them. The
sampled ids come back from `choices[0].token_ids` (vLLM's `return_token_ids`) or from `logprobs.tokens`
written as "token_id:123" (vLLM's `return_tokens_as_token_ids`). Log-probs are `logprobs.token_logprobs`
(`logprobs: 1`); a server that returns none is an error, since the trainer's importance ratio needs them.
Start vLLM with `--logprobs-mode processed_logprobs` so they include temperature (see vllm.py).

Servers without that protocol are refused at start-up: `probe()` sends one token-id request and raises
`ServerUnsupported` with one line naming what the server lacks (found on this machine: `transformers serve`
answers HTTP 422 to vLLM's extra fields and, without them, HTTP 400 "prompt must be a string" to a token-id
prompt, and ignores `logprobs`). A server that takes token-id prompts and returns log-probs but not the
sampled ids (SGLang and others) is refused too, unless a Python caller passes `retokenize=True` (no command-line
setting does: it is lossy): the ids are then re-tokenised from the returned text, which does not always give
back the sampled ids; a count that disagrees with the log-probs is an error, except a row that stopped on EOS
(its token is added back), and the per-token pairing of ids and log-probs is unverifiable
(`stats["retokenized"]` counts rows). A reply that is not a completion (a wrong type, a missing key) is refused
in one line naming the server and the field (`MalformedReply`, a `UserError`: the command line shows it as
that line).

One bound on time, `timeout` (`policy.server_timeout`, 60 s by default): a request, its retries and their backoff
included, ends within it whatever the server does (http_client.py cuts a stalled or dribbling exchange), and a batch
with no row finished for `watchdog_s(timeout)` ends too. Connection errors, stalls, cut-short bodies, 429 and 5xx
are retried with exponential backoff inside that bound (at most `max_retries` times); any other status fails at
once. Every failure is one line naming the URL and what the server sent (`ServerError` and its subclasses, all
`UserError`s). Replies are validated before use (`to_generation`: finite log-probs <= 0 up to LOGPROB_TOLERANCE,
counts that agree, ids inside the vocabulary that decode to the text). Standard library only, so nothing is added
to the install.

Weights live in the server: `update_weights(state_dict)` cannot load them from here and says so;
`update_weights()` / `invalidate()` bump the version after the server's weights were changed by other means,
and POST to `reset_path` when given (vLLM's `/reset_prefix_cache` in dev mode, SGLang's `/flush_cache`).
Request and response fields as read in vLLM's vllm/entrypoints/openai/completion/protocol.py
(`CompletionRequest`, `CompletionResponseChoice`, `CompletionLogProbs`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait

from ..errors import UserError
from .base import Generation, SamplingParams, VersionedBackend, row_seeds
from .http_client import MAX_REPLY_BYTES, TransportError, exchange, one_line

RETRY_STATUS = frozenset({429}) | frozenset(range(500, 600))
TIMEOUT_S = 60.0  # the default bound on one request, its retries included (policy.server_timeout)
# a log-prob above 0 is a probability above 1; float32 rounding of a log-softmax near 0 gives about 1e-7, and an
# engine that samples in bfloat16 a little more, so up to this much above 0 is accepted (as sent) and more refused
LOGPROB_TOLERANCE = 1e-3


def watchdog_s(timeout: float) -> float:
    """How long a batch waits with no row finished before it gives up: the per-request bound plus a margin for
    what the request's own timer cannot cut (name resolution)."""
    return timeout + max(1.0, 0.1 * timeout)


class ServerError(UserError, RuntimeError):
    """The server answered with an error status (4xx at once, 5xx after the retries), or, as a subclass, sent no
    usable reply. A `UserError`: the command line shows it as one line (exit code 2)."""

    def __init__(self, message: str, status: int | None):
        super().__init__(message)
        self.status = status


class ServerUnreachable(ServerError, ConnectionError):
    """No complete reply within the time bound, after the retries it allowed (refused, reset, stalled, cut short)."""

    def __init__(self, message: str):
        super().__init__(message, None)


class MalformedReply(ServerError, UserError):
    """The server answered, but not with a completion reply: `what` names the field and what was wrong."""

    def __init__(self, url: str, what: str):
        super().__init__(f"server {url}: malformed completion reply: {what}", 200)
        self.what = what


# what a server that returns text alone can do (the probe's and a row's refusal say it)
NO_IDS = (
    "returns no sampled token ids (vLLM returns them, asked with return_token_ids); use such a server (from Python, "
    "OpenAIServerBackend(retokenize=True) re-tokenises the text instead, which is lossy)"
)


def _show(value) -> str:
    """A value as the error names it: its JSON, cut short, and its type."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return f"{_one_line(text, 60)} ({type(value).__name__})"


_one_line = one_line


def _server_message(raw: bytes) -> str:
    """The message in an error body: OpenAI/vLLM {"error": {"message"}}, {"message"}, FastAPI {"detail"}."""
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than the parser's recursion limit
        return _one_line(text) or "(empty body)"
    if isinstance(body, dict):
        err = body.get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        msg = msg or body.get("message") or body.get("detail")
        if msg:
            return _one_line(msg if isinstance(msg, str) else json.dumps(msg))
    return _one_line(text)


def _bare(text: str) -> str:
    """Text as `_check_text` compares it: no whitespace, no U+FFFD (an incomplete UTF-8 character)."""
    return "".join(text.split()).replace("\ufffd", "")


def _vocab_size(tokenizer) -> int | None:
    """The ids a reply may hold: the tokenizer's length (added tokens included) or its `vocab_size`; None (no
    bound) for a tokenizer with neither. A model whose embedding is padded past its tokenizer can sample an id
    past this: pass the model's `vocab_size` to the backend then."""
    sizes = [getattr(tokenizer, "vocab_size", None)]
    try:
        sizes.append(len(tokenizer))
    except TypeError:
        pass
    sizes = [n for n in sizes if isinstance(n, int) and n > 0]
    return max(sizes) if sizes else None


class ServerUnsupported(ValueError):
    """The server lacks part of the token-id protocol (found by `probe()` before any work starts)."""


class OpenAIServerBackend(VersionedBackend):
    concurrent_calls = True  # calls may overlap: each row is its own request, the server batches them

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer,
        api_key: str | None = None,
        timeout: float = TIMEOUT_S,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        workers: int = 64,
        reset_path: str | None = None,
        vllm_extensions: bool = True,
        retokenize: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        vocab_size: int | None = None,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if max_retries < 0 or workers < 1:
            raise ValueError(f"max_retries must be >= 0 and workers >= 1, got {max_retries} and {workers}")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.base_url, self.model, self.tokenizer = base_url.rstrip("/"), model, tokenizer
        self.base_url = self.base_url.removesuffix("/v1")  # accept the OpenAI-client style base URL too
        self.api_key, self.timeout, self.max_reply_bytes = api_key, float(timeout), max_reply_bytes
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
        self.reset_path, self.vllm_extensions, self.sleep = reset_path, vllm_extensions, sleep
        self.retokenize = retokenize
        self.vocab_size = vocab_size or _vocab_size(tokenizer)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="trace-openai")
        self.stats = {"requests": 0, "retries": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "retokenized": 0}

    # -- HTTP ---------------------------------------------------------------------------------------
    def post(self, path: str, body: dict) -> dict:
        """POST JSON; connection errors, stalls, cut-short bodies, 429 and 5xx are retried with exponential backoff,
        all within one deadline of `timeout` seconds from the first try. Every failure raises a `ServerError` (a
        `UserError`, one line naming the URL and what the server sent): `ServerUnreachable` when no complete reply
        came, `MalformedReply` when the reply is not JSON."""
        url = self.base_url + path
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        start = time.monotonic()
        deadline, last, status, attempts = start + self.timeout, "", None, 0
        while attempts <= self.max_retries:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if attempts:
                self.stats["retries"] += 1
            attempts += 1
            try:
                status, raw = exchange(url, "POST", data, headers, remaining, self.max_reply_bytes)
            except TransportError as err:
                last, status = f"POST {url}: the server {err}", None
            else:
                if 200 <= status < 300:
                    return self._json(url, raw)
                last = f"POST {url} -> HTTP {status}: {_server_message(raw)}"
                if status not in RETRY_STATUS:
                    raise ServerError(last, status) from None
            pause = min(self.backoff * 2 ** (attempts - 1), self.max_backoff, deadline - time.monotonic())
            if attempts <= self.max_retries and pause > 0:
                self.sleep(pause)
        tries = f"{attempts} attempt{'s' * (attempts != 1)}"
        why = f"gave up after {tries} in {time.monotonic() - start:.3g} s; the bound is {self.timeout:g} s"
        if status is None:
            raise ServerUnreachable(f"{last or 'POST ' + url + ': no time left'} ({why})")
        raise ServerError(f"{last} ({why})", status)

    def _json(self, url: str, raw: bytes):
        try:
            return json.loads(raw)
        except RecursionError:  # nesting deeper than the parser's recursion limit (not a ValueError)
            raise MalformedReply(url, f"JSON nested too deeply to parse ({len(raw)} bytes)") from None
        except ValueError:
            text = _one_line(raw.decode("utf-8", "replace"), 120) or "(empty body)"
            raise MalformedReply(url, f"not JSON: {text}") from None

    # -- one row ------------------------------------------------------------------------------------
    def request_body(self, prompt: list[int], params: SamplingParams, seed: int) -> dict:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": seed,
            "logprobs": 1,  # the sampled token's log-prob (plus the top-1)
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if self.vllm_extensions:  # vLLM request fields; ignored by servers that do not know them
            body.update(return_token_ids=True, return_tokens_as_token_ids=True, include_stop_str_in_output=True)
        return body

    def _parse(self, reply) -> dict:
        """The one choice of a completion reply, every field this backend reads type-checked: text, finish_reason,
        token_logprobs (None where absent), tokens, token_ids (None where absent), cached prompt tokens. Raises
        `MalformedReply` naming the first field that is wrong."""
        url = self.base_url + "/v1/completions"

        def bad(what: str):
            raise MalformedReply(url, what)

        def is_int(x) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        def is_number(x) -> bool:
            return is_int(x) or isinstance(x, float)

        if not isinstance(reply, dict):
            bad(f"the reply is {_show(reply)}, not a JSON object")
        choices = reply.get("choices")
        if not isinstance(choices, list) or not choices:
            bad(f"`choices` is {_show(choices)}, not a non-empty list")
        choice = choices[0]
        if not isinstance(choice, dict):
            bad(f"`choices[0]` is {_show(choice)}, not an object")
        text = choice.get("text")
        if text is not None and not isinstance(text, str):
            bad(f"`choices[0].text` is {_show(text)}, not a string")
        lp = choice.get("logprobs")
        if lp is not None and not isinstance(lp, dict):
            bad(f"`choices[0].logprobs` is {_show(lp)}, not an object")
        lps = (lp or {}).get("token_logprobs")
        if lps is not None and not (isinstance(lps, list) and all(x is None or is_number(x) for x in lps)):
            bad(f"`choices[0].logprobs.token_logprobs` is {_show(lps)}, not a list of numbers")
        tokens = (lp or {}).get("tokens")
        if tokens is not None and not isinstance(tokens, list):
            bad(f"`choices[0].logprobs.tokens` is {_show(tokens)}, not a list")
        ids = choice.get("token_ids")
        if ids is not None and not (isinstance(ids, list) and all(is_int(t) and t >= 0 for t in ids)):
            bad(f"`choices[0].token_ids` is {_show(ids)}, not a list of token ids")
        usage = reply.get("usage")
        if usage is not None and not isinstance(usage, dict):
            bad(f"`usage` is {_show(usage)}, not an object")
        details = (usage or {}).get("prompt_tokens_details")
        if details is not None and not isinstance(details, dict):
            bad(f"`usage.prompt_tokens_details` is {_show(details)}, not an object")
        cached = (details or {}).get("cached_tokens")
        if cached is not None and not (is_int(cached) and cached >= 0):
            bad(f"`usage.prompt_tokens_details.cached_tokens` is {_show(cached)}, not a count")
        if ids is None and tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            try:  # vLLM's return_tokens_as_token_ids
                ids = [int(t.split(":", 1)[1]) for t in tokens]
            except ValueError:
                bad(f"`choices[0].logprobs.tokens` has a malformed 'token_id:N' entry: {_show(tokens)}")
        return {
            "text": text or "",
            "reason": choice.get("finish_reason"),
            "logprobs": lps,
            "tokens": tokens,
            "ids": ids,
            "cached": cached or 0,
        }

    def to_generation(self, reply: dict, prompt_len: int, max_tokens: int | None = None) -> Generation:
        """The reply as a Generation, validated (`_generation`)."""
        return self._generation(reply, prompt_len, max_tokens)[0]

    def _generation(self, reply: dict, prompt_len: int, max_tokens: int | None) -> tuple[Generation, bool]:
        """The reply as a Generation, validated before use (`MalformedReply`, one line, otherwise): it finished
        ('stop' or 'length'), has a finite log-prob <= LOGPROB_TOLERANCE for every token, as many log-probs as
        tokens (and as `logprobs.tokens` entries), at most `max_tokens` tokens, ids inside the vocabulary, and ids
        that decode to the returned text (`_check_text`). Also says whether the ids were re-tokenised."""
        c = self._parse(reply)
        url = self.base_url + "/v1/completions"
        text, reason, lps, ids = c["text"], c["reason"], c["logprobs"], c["ids"]
        if reason not in ("stop", "length"):
            raise MalformedReply(url, f"the completion ended with finish_reason={reason!r}, not 'stop' or 'length'")
        if not lps or any(x is None for x in lps):
            raise MalformedReply(url, "the server returned no log-probs for the sampled tokens (send `logprobs: 1`)")
        bad = next((x for x in lps if not (math.isfinite(x) and x <= LOGPROB_TOLERANCE)), None)
        if bad is not None:
            raise MalformedReply(
                url, f"a log-prob of {bad!r}; log-probs are finite and <= 0 (up to {LOGPROB_TOLERANCE:g} of rounding)"
            )
        if c["tokens"] is not None and len(c["tokens"]) != len(lps):
            raise MalformedReply(url, f"{len(lps)} log-probs for {len(c['tokens'])} entries of `logprobs.tokens`")
        if ids is None and not self.retokenize:
            raise MalformedReply(url, f"the server {NO_IDS}")
        checked = ids is not None
        if ids is None:
            ids = list(self.tokenizer(text, add_special_tokens=False).input_ids)
            eos = getattr(self.tokenizer, "eos_token_id", None)
            if reason == "stop" and eos is not None and len(lps) == len(ids) + 1:
                ids.append(eos)  # stopped on EOS: the token the text leaves out
        if len(ids) != len(lps):
            raise MalformedReply(
                url,
                f"{len(lps)} log-probs for {len(ids)} tokens; have the server return token ids "
                "(vLLM: return_token_ids / return_tokens_as_token_ids)",
            )
        if max_tokens is not None and len(ids) > max_tokens:
            raise MalformedReply(url, f"{len(ids)} tokens for a request of at most {max_tokens} (max_tokens)")
        if self.vocab_size and any(t >= self.vocab_size for t in ids):
            outside = next(t for t in ids if t >= self.vocab_size)
            raise MalformedReply(url, f"token id {outside} is outside the vocabulary of {self.vocab_size} tokens")
        if checked:
            self._check_text(url, ids, text, reason)
        # without cached_tokens (vLLM: --enable-prompt-tokens-details) this is an upper bound: the whole prompt
        gen = Generation(ids, [float(x) for x in lps], reason, text, prefix_tokens_computed=prompt_len - c["cached"])
        return gen, not checked

    def _check_text(self, url: str, ids: list[int], text: str, reason: str) -> None:
        """The sampled ids decode to the returned text. Compared without whitespace and U+FFFD, since a server
        decodes the completion after the prompt's last tokens (a leading space the ids alone lose) and holds back
        or replaces an incomplete UTF-8 character; after a 'stop' the text may end inside the last token (a stop
        string that ends mid-token), so it need only begin the decoded ids. Skipped for a tokenizer without
        `decode`. Special tokens are skipped, as vLLM's detokeniser does by default."""
        decode = getattr(self.tokenizer, "decode", None)
        if decode is None:
            return
        have, want = _bare(decode(ids, skip_special_tokens=True)), _bare(text)
        if have == want or (reason == "stop" and have.startswith(want)):
            return
        raise MalformedReply(
            url, f"the token ids decode to {_show(have[:40])}, not to the returned text {_show(want[:40])}"
        )

    def _row(self, prompt: list[int], params: SamplingParams, seed: int) -> Generation:
        reply = self.post("/v1/completions", self.request_body(prompt, params, seed))
        self.stats["requests"] += 1
        gen, retokenized = self._generation(reply, len(prompt), params.max_new_tokens)
        self.stats["prompt_tokens"] += len(prompt)
        self.stats["cached_prompt_tokens"] += len(prompt) - gen.prefix_tokens_computed
        self.stats["retokenized"] += retokenized
        return gen

    def probe(self) -> None:
        """One token-id request (2 tokens): raise `ServerUnsupported`, one line, if the server cannot serve the
        protocol (unreachable, no token-id prompts, no log-probs, no sampled ids) or its reply fails validation
        (`to_generation`). Call before any work."""
        prompt = list(self.tokenizer("Hello", add_special_tokens=False).input_ids)[:4] or [0]
        where = f"server {self.base_url} (model {self.model!r})"
        try:
            reply = self.post("/v1/completions", self.request_body(prompt, SamplingParams(max_new_tokens=2), 0))
        except ServerUnreachable as err:
            raise ServerUnsupported(f"{where} cannot be reached: {err}") from None
        except MalformedReply as err:  # a 200 whose body is not JSON
            raise ServerUnsupported(f"{where} answers with a malformed completion reply: {err.what}") from None
        except ServerError as err:
            lacks = {
                422: "rejects vLLM's token-id request fields (return_token_ids, return_tokens_as_token_ids)",
                400: "does not accept a prompt of token ids",
                404: "has no /v1/completions for this model",
            }.get(err.status, "failed a token-id completion request")
            raise ServerUnsupported(f"{where} {lacks}; trace-rl needs token ids in and out ({err})") from None
        try:
            c = self._parse(reply)
        except MalformedReply as err:
            raise ServerUnsupported(f"{where} answers with a malformed completion reply: {err.what}") from None
        if not c["logprobs"]:
            raise ServerUnsupported(f"{where} returns no log-probs for sampled tokens (asked with logprobs: 1)")
        if c["ids"] is None and not self.retokenize:
            raise ServerUnsupported(f"{where} {NO_IDS}")
        try:
            self.to_generation(reply, len(prompt), 2)
        except MalformedReply as err:
            raise ServerUnsupported(f"{where} fails validation: {err.what}") from None

    # -- protocol -----------------------------------------------------------------------------------
    def _futures(self, prompts, params, seed, seeds):
        prompts = [[int(t) for t in p] for p in prompts]
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        return [
            self._pool.submit(self._row, p, params, s) for p, s in zip(prompts, row_seeds(len(prompts), seed, seeds))
        ]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """The rows' generations; the first failure cancels the rows not yet sent and is raised. A batch in which
        no row finishes for `watchdog_s(timeout)` seconds raises `ServerUnreachable` (each request bounds itself
        by `timeout`; this covers what its timer cannot cut)."""
        futures = self._futures(prompts, params, seed, seeds)
        pending: set[Future] = set(futures)
        while pending:
            done, pending = wait(pending, timeout=watchdog_s(self.timeout), return_when=FIRST_EXCEPTION)
            self._settle(done, pending)
        return [f.result() for f in futures]

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        """Rows run in the backend's thread pool; the event loop only awaits them (with `generate`'s bounds). Calls
        may overlap (continuous batching): rows still queued behind other calls' rows in the pool have sent nothing,
        so a wait in which none of this call's rows has started is not a stall."""
        raw = self._futures(prompts, params, None, seeds)
        futures = [asyncio.wrap_future(f) for f in raw]
        pending = set(futures)
        while pending:
            done, pending = await asyncio.wait(
                pending, timeout=watchdog_s(self.timeout), return_when=asyncio.FIRST_EXCEPTION
            )
            if not done and not any(f.running() for f in raw):
                continue  # queued, not sent: the rows ahead of them are bounded by their own calls
            self._settle(done, pending)
        return [f.result() for f in futures]

    def _settle(self, done, pending) -> None:
        """Raise the first failure among `done` (or the stall when nothing is done), cancelling `pending` (the
        rows not sent yet; a cancelled asyncio wrapper also drops the late failures of rows in flight). Every
        failure in `done` is retrieved, so none is reported as never retrieved."""
        failures = [f.exception() for f in done if not f.cancelled()]
        failed = next((e for e in failures if e is not None), None)
        if failed is None and done:
            return
        for f in pending:
            f.cancel()
        if failed is not None:
            raise failed
        raise ServerUnreachable(
            f"POST {self.base_url}/v1/completions: no request finished within {watchdog_s(self.timeout):.3g} s "
            f"(the bound per request is {self.timeout:g} s)"
        )

    def clear_cache(self) -> None:
        if self.reset_path:
            self.post(self.reset_path, {})

    def _load_state_dict(self, state_dict: dict) -> None:
        raise NotImplementedError(
            "OpenAIServerBackend cannot push weights into a server; update the server's weights by its own "
            "means (e.g. vLLM's RL weight-update endpoints), then call update_weights() with no state dict"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
