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

Connection errors, timeouts, 429 and 5xx are retried with exponential backoff (bounded: `max_retries`);
any other 4xx fails at once with one line naming the status and the server's message. Standard library only
(urllib), so nothing is added to the install.

Weights live in the server: `update_weights(state_dict)` cannot load them from here and says so;
`update_weights()` / `invalidate()` bump the version after the server's weights were changed by other means,
and POST to `reset_path` when given (vLLM's `/reset_prefix_cache` in dev mode, SGLang's `/flush_cache`).
Request and response fields as read in vLLM's vllm/entrypoints/openai/completion/protocol.py
(`CompletionRequest`, `CompletionResponseChoice`, `CompletionLogProbs`).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..errors import UserError
from .base import Generation, SamplingParams, VersionedBackend, row_seeds

RETRY_STATUS = frozenset({429}) | frozenset(range(500, 600))


class ServerError(RuntimeError):
    """The server answered with an error status (4xx at once, 5xx after the retries)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


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


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _server_message(raw: bytes) -> str:
    """The message in an error body: OpenAI/vLLM {"error": {"message"}}, {"message"}, FastAPI {"detail"}."""
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return _one_line(text) or "(empty body)"
    if isinstance(body, dict):
        err = body.get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        msg = msg or body.get("message") or body.get("detail")
        if msg:
            return _one_line(msg if isinstance(msg, str) else json.dumps(msg))
    return _one_line(text)


class ServerUnsupported(ValueError):
    """The server lacks part of the token-id protocol (found by `probe()` before any work starts)."""


class OpenAIServerBackend(VersionedBackend):
    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer,
        api_key: str | None = None,
        timeout: float = 300.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        workers: int = 64,
        reset_path: str | None = None,
        vllm_extensions: bool = True,
        retokenize: bool = False,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if max_retries < 0 or workers < 1:
            raise ValueError(f"max_retries must be >= 0 and workers >= 1, got {max_retries} and {workers}")
        self.base_url, self.model, self.tokenizer = base_url.rstrip("/"), model, tokenizer
        self.base_url = self.base_url.removesuffix("/v1")  # accept the OpenAI-client style base URL too
        self.api_key, self.timeout = api_key, timeout
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
        self.reset_path, self.vllm_extensions, self.sleep = reset_path, vllm_extensions, sleep
        self.retokenize = retokenize
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="trace-openai")
        self.stats = {"requests": 0, "retries": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "retokenized": 0}

    # -- HTTP ---------------------------------------------------------------------------------------
    def post(self, path: str, body: dict) -> dict:
        """POST JSON, retrying connection errors, timeouts, 429 and 5xx with exponential backoff."""
        url = self.base_url + path
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
                self.sleep(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))
            req = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as err:
                msg = f"POST {url} -> HTTP {err.code}: {_server_message(err.read())}"
                if err.code not in RETRY_STATUS:
                    raise ServerError(msg, err.code) from None
                last, status = msg, err.code
                continue
            except (TimeoutError, urllib.error.URLError, http.client.HTTPException, ConnectionError) as err:
                last, status = f"POST {url}: {_one_line(str(getattr(err, 'reason', err)))}", None
                continue
            try:
                return json.loads(raw)
            except ValueError:
                text = _one_line(raw.decode("utf-8", "replace"), 120) or "(empty body)"
                raise MalformedReply(url, f"not JSON: {text}") from None
        tries = f"{self.max_retries + 1} attempt{'s' * bool(self.max_retries)}"
        if status is None:
            raise ConnectionError(f"{last} (gave up after {tries})")
        raise ServerError(f"{last} (gave up after {tries})", status)

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
            "ids": ids,
            "cached": cached or 0,
        }

    def to_generation(self, reply: dict, prompt_len: int) -> Generation:
        c = self._parse(reply)
        url = self.base_url + "/v1/completions"
        text, reason, lps, ids = c["text"], c["reason"], c["logprobs"], c["ids"]
        if reason not in ("stop", "length"):
            raise MalformedReply(url, f"the completion ended with finish_reason={reason!r}, not 'stop' or 'length'")
        if not lps or any(x is None for x in lps):
            raise MalformedReply(url, "the server returned no log-probs for the sampled tokens (send `logprobs: 1`)")
        if ids is None and not self.retokenize:
            raise MalformedReply(url, f"the server {NO_IDS}")
        if ids is None:
            ids = list(self.tokenizer(text, add_special_tokens=False).input_ids)
            self.stats["retokenized"] += 1
            eos = getattr(self.tokenizer, "eos_token_id", None)
            if reason == "stop" and eos is not None and len(lps) == len(ids) + 1:
                ids.append(eos)  # stopped on EOS: the token the text leaves out
        if len(ids) != len(lps):
            raise MalformedReply(
                url,
                f"{len(lps)} log-probs for {len(ids)} tokens; have the server return token ids "
                "(vLLM: return_token_ids / return_tokens_as_token_ids)",
            )
        self.stats["prompt_tokens"] += prompt_len
        self.stats["cached_prompt_tokens"] += c["cached"]
        # without cached_tokens (vLLM: --enable-prompt-tokens-details) this is an upper bound: the whole prompt
        return Generation(ids, [float(x) for x in lps], reason, text, prefix_tokens_computed=prompt_len - c["cached"])

    def _row(self, prompt: list[int], params: SamplingParams, seed: int) -> Generation:
        reply = self.post("/v1/completions", self.request_body(prompt, params, seed))
        self.stats["requests"] += 1
        return self.to_generation(reply, len(prompt))

    def probe(self) -> None:
        """One token-id request (2 tokens): raise `ServerUnsupported`, one line, if the server cannot serve the
        protocol (unreachable, no token-id prompts, no log-probs, no sampled ids). Call before any work."""
        prompt = list(self.tokenizer("Hello", add_special_tokens=False).input_ids)[:4] or [0]
        where = f"server {self.base_url} (model {self.model!r})"
        try:
            reply = self.post("/v1/completions", self.request_body(prompt, SamplingParams(max_new_tokens=2), 0))
        except ConnectionError as err:
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
        return [f.result() for f in self._futures(prompts, params, seed, seeds)]

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        """Rows run in the backend's thread pool; the event loop only awaits them."""
        return list(
            await asyncio.gather(*(asyncio.wrap_future(f) for f in self._futures(prompts, params, None, seeds)))
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
