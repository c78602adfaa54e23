"""The /retrieve server (FastAPI on uvicorn) and its client, speaking the protocol of Search-R1's retrieval server.

Request: POST /retrieve with {"queries": [str, ...], "topk": int, "return_scores": bool} (Search-R1's training
loop, verl's search tool) or {"query": str, ...} (SkyRL's search tool, answered as a batch of one). topk null or 0
means the server's default. Response: {"result": [hits per query]}, a hit being {"document": doc, "score": float}
with return_scores, else doc; doc is {"id", "title", "text", "contents"}, `contents` being '"Title"\\ntext' as
Search-R1 writes it. {"queries": []} answers {"result": []}.

Limits, all in ServerLimits, so that no client can make the server hold much memory, hold the search for long,
or lock other clients out:
- size: the body, the queries per request, each query's length, topk and queries x topk (the hits of one reply)
  are capped, and a reply over max_reply_bytes is refused rather than sent; every malformed or over-limit
  request gets a 4xx with {"error": "..."} naming the field.
- time: searches run in a worker thread under one lock (the retrievers are not known to be thread-safe), a few
  queries per hold of the lock, granted in arrival order, so a large batch interleaves with other clients'
  requests instead of holding the search for its whole length; a request not answered within max_request_s
  (waiting included) gets 503, which clients retry. Send many queries in one request rather than many requests.
- connections: a connection that sends no request head within idle_timeout_s is closed (uvicorn itself only
  times out connections idle after a response), a body that does not arrive within body_timeout_s gets 408.
  At max_connections a new connection closes the oldest idle one instead of being refused, so idle sockets
  cannot lock anyone out; one client address holds at most max_connections_per_client, beyond which it gets
  429 (on loopback every local process is one address, hence the generous default). Only when every
  connection is busy with a request does a new one get 503.
serve() binds loopback addresses only unless allow_remote is set, as the server has no authentication.

The client (RemoteRetriever) accepts the URL that Search-R1, verl and SkyRL configure
(http://host:port/retrieve) or a bare http://host:port; it follows redirects (307/308 keep the POST; FastAPI
answers /retrieve/ with one), retries connection errors, timeouts, 429 and 5xx with exponential backoff, then
raises one RetrieverError; any other 4xx raises RetrieverError at once, with the server's message.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint's annotations at runtime, and `Request`
# is imported inside _app so that the client needs no FastAPI.
import asyncio
import collections
import http.client
import ipaddress
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .retrieval import Passage, Retriever


@dataclass(frozen=True)
class ServerLimits:
    default_topk: int = 3
    max_topk: int = 100
    max_queries: int = 512
    max_query_chars: int = 2000  # one query; Search-R1's are a sentence
    max_hits: int = 5000  # queries x topk of one request
    max_body_bytes: int = 1 << 20
    max_reply_bytes: int = 16 << 20
    max_request_s: float = 30.0  # waiting for the search included
    search_chunk: int = 16  # queries searched per hold of the search lock
    idle_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_connections: int = 256
    max_connections_per_client: int = 128

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ServerLimits.{name} must be a positive number, got {value!r}")
        if self.default_topk > self.max_topk:
            raise ValueError(f"ServerLimits.default_topk ({self.default_topk}) exceeds max_topk ({self.max_topk})")
        if self.max_connections_per_client > self.max_connections:
            raise ValueError("ServerLimits.max_connections_per_client exceeds max_connections")


class RequestError(Exception):
    """A request the server refuses: HTTP status and a message that names the field."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_request(body: bytes, limits: ServerLimits) -> tuple[list[str], int, bool]:
    """Request body -> (queries, topk, return_scores), or RequestError(400, ...)."""
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise RequestError(400, f"the body is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise RequestError(400, f"the body must be a JSON object, got {type(data).__name__}")
    if "queries" in data and "query" in data:
        raise RequestError(400, "send 'queries' (a list of strings) or 'query' (a string), not both")
    if "query" in data:
        if not isinstance(data["query"], str):
            raise RequestError(400, f"'query' must be a string, got {type(data['query']).__name__}")
        queries = [data["query"]]
    elif "queries" in data:
        queries = data["queries"]
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise RequestError(400, "'queries' must be a list of strings")
    else:
        raise RequestError(400, "the body needs 'queries' (a list of strings) or 'query' (a string)")
    if len(queries) > limits.max_queries:
        raise RequestError(400, f"'queries' holds {len(queries)} queries; this server takes {limits.max_queries}")
    longest = max(map(len, queries), default=0)
    if longest > limits.max_query_chars:
        raise RequestError(400, f"a query holds {longest} characters; this server takes {limits.max_query_chars}")
    topk = data.get("topk")
    if topk is None or (type(topk) is int and topk == 0):  # Search-R1's server: `if not request.topk:` default
        topk = limits.default_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 0:
        raise RequestError(400, f"'topk' must be a non-negative integer or null, got {topk!r}")
    if topk > limits.max_topk:
        raise RequestError(400, f"'topk' is {topk}; this server returns at most {limits.max_topk}")
    if len(queries) * topk > limits.max_hits:
        raise RequestError(
            400,
            f"'queries' x 'topk' is {len(queries)} x {topk}; this server returns at most {limits.max_hits} hits "
            "per request: send fewer queries or a smaller topk",
        )
    scores = data.get("return_scores", False)
    if scores is None:
        scores = False
    if not isinstance(scores, bool):
        raise RequestError(400, f"'return_scores' must be true or false, got {scores!r}")
    return queries, topk, scores


def _doc(p: Passage) -> dict:
    return {"id": p.id, "title": p.title, "text": p.text, "contents": p.contents}


class _FifoLock:
    """A lock granted in arrival order. threading.Lock is not: the thread that releases it takes it straight back,
    so a many-chunk request would keep the search to itself; here it queues behind whoever waited meanwhile."""

    def __init__(self) -> None:
        self._cond, self._queue, self._held = threading.Condition(), collections.deque(), False

    def acquire(self, timeout: float) -> bool:
        me = object()
        with self._cond:
            self._queue.append(me)
            if self._cond.wait_for(lambda: not self._held and self._queue[0] is me, timeout):
                self._queue.popleft()
                self._held = True
                return True
            self._queue.remove(me)
            self._cond.notify_all()  # the next in line may be free to go now
            return False

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()


def _app(retriever: Retriever, limits: ServerLimits):
    from fastapi import FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    lock = _FifoLock()

    def search(queries: list[str], k: int, deadline: float) -> list:
        hits: list = []
        for i in range(0, len(queries), limits.search_chunk):  # the lock is free between chunks: others go in
            wait = deadline - time.monotonic()
            if wait <= 0 or not lock.acquire(timeout=wait):
                raise RequestError(503, f"busy: the search did not finish within {limits.max_request_s} s; retry")
            try:
                hits += retriever.search(queries[i : i + limits.search_chunk], k)
            finally:
                lock.release()
        return hits

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limits.max_body_bytes):
            raise RequestError(413, f"the body may hold at most {limits.max_body_bytes} bytes")
        chunks, size = [], 0

        async def read() -> None:
            nonlocal size
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:  # a chunked body declares no length
                    raise RequestError(413, f"the body may hold at most {limits.max_body_bytes} bytes")
                chunks.append(chunk)

        try:
            await asyncio.wait_for(read(), limits.body_timeout_s)
        except asyncio.TimeoutError:
            raise RequestError(408, f"the body did not arrive within {limits.body_timeout_s} s") from None
        return b"".join(chunks)

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        deadline = time.monotonic() + limits.max_request_s
        queries, k, with_scores = parse_request(await read_body(request), limits)
        hits = await run_in_threadpool(search, queries, k, deadline) if queries else []
        result = [[{"document": _doc(p), "score": s} if with_scores else _doc(p) for p, s in row] for row in hits]
        body = json.dumps({"result": result}, ensure_ascii=False).encode("utf-8")
        if len(body) > limits.max_reply_bytes:
            raise RequestError(
                400,
                f"the reply would hold {len(body)} bytes; this server sends at most {limits.max_reply_bytes}: "
                "send fewer queries or a smaller topk",
            )
        return Response(body, media_type="application/json")

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        return JSONResponse({"error": err.message}, status_code=err.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:  # unknown path, wrong method
        hint = "; POST /retrieve" if err.status_code in (404, 405) else ""
        return JSONResponse({"error": f"{err.detail}{hint}"}, status_code=err.status_code)

    @app.exception_handler(Exception)
    async def failed(request: Request, err: Exception) -> JSONResponse:  # the retriever failed: clients retry 5xx
        return JSONResponse({"error": f"retrieval failed: {type(err).__name__}: {err}"}, status_code=500)

    return app


_REFUSED = {429: "Too Many Requests", 503: "Service Unavailable"}


def _protocol(limits: ServerLimits):
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        """uvicorn's h11 protocol, closing a connection whose next request head does not come in time, and
        keeping the connection limits fair: idle connections make room for new ones, one address is capped."""

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self.opened = self.loop.time()
            self._deadline(None)
            open_ = [c for c in self.connections if not c.transport.is_closing()]  # evicted ones may linger
            mine = [c for c in open_ if c.client and self.client and c.client[0] == self.client[0]]
            if len(mine) > limits.max_connections_per_client and not self._evict(mine):
                self._refuse(429, f"this address holds {limits.max_connections_per_client} connections already")
            elif len(open_) > limits.max_connections and not self._evict(open_):
                self._refuse(503, "every connection is busy; retry")

        def on_response_complete(self) -> None:
            done = self.cycle
            super().on_response_complete()
            self._deadline(done)

        def idle(self) -> bool:  # no request in progress: between requests, or its head not yet complete
            return (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing()

        def _evict(self, among: list) -> bool:
            """Close the oldest idle connection among `among` (not this one); False when none is idle."""
            idle = [c for c in among if c is not self and c.idle()]
            if not idle:
                return False
            min(idle, key=lambda c: c.opened).transport.close()
            return True

        def _refuse(self, status: int, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            head = (
                f"HTTP/1.1 {status} {_REFUSED[status]}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
            self.transport.close()

        def _deadline(self, cycle: object) -> None:
            def expire() -> None:  # no new request cycle began since: the connection is idle
                if self.cycle is cycle and not self.transport.is_closing():
                    self.transport.close()

            self.loop.call_later(limits.idle_timeout_s, expire)

    return Protocol


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RetrieverServer:
    """A running server: `server_address` is (host, port), `url` its /retrieve URL; `shutdown()` stops it."""

    def __init__(self, server: Any, thread: threading.Thread, address: tuple[str, int]):
        self._server, self._thread, self.server_address = server, thread, address

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/retrieve"

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)


def serve(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: ServerLimits | None = None,
    allow_remote: bool = False,
) -> RetrieverServer:
    """Serve POST /retrieve in a background thread; port 0 picks a free port (see server_address)."""
    import uvicorn

    limits = limits or ServerLimits()
    if not allow_remote and not _is_loopback(host):
        raise ValueError(
            f"host {host!r} is not a loopback address; the server has no authentication, so serving "
            "beyond this machine needs allow_remote=True"
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in 0..65535, got {port!r}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    config = uvicorn.Config(
        _app(retriever, limits),
        http=_protocol(limits),
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=limits.keep_alive_s,
        limit_concurrency=None,  # the protocol keeps the connection limits (idle ones make room)
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="retriever-server")
    thread.start()
    for _ in range(1000):  # uvicorn starts in milliseconds; give up after about 10 s
        if server.started or not thread.is_alive():
            break
        time.sleep(0.01)
    if not server.started:
        server.should_exit = True
        sock.close()
        raise RuntimeError(f"the retriever server did not start on {host}:{port}")
    return RetrieverServer(server, thread, sock.getsockname()[:2])


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        return None  # the redirect reaches the caller as an HTTPError carrying its Location


class RetrieverError(RuntimeError):
    """The retriever could not answer: unreachable after the retries, or it refused the request."""


class RemoteRetriever:
    """Client for a /retrieve server (this package's, Search-R1's, or one of its derivatives)."""

    def __init__(self, url: str, timeout_s: float = 10.0, retries: int = 3, backoff_s: float = 0.5):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"retriever url must look like http://host:port/retrieve, got {url!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a non-negative integer, got {retries!r}")
        if timeout_s <= 0 or backoff_s < 0:
            raise ValueError(f"timeout_s must be positive and backoff_s non-negative, got {timeout_s}, {backoff_s}")
        path = parts.path if parts.path not in ("", "/") else "/retrieve"  # a bare host:port means the default path
        self.url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
        self.timeout_s, self.retries, self.backoff_s, self.passages = timeout_s, retries, backoff_s, []
        self._opener = urllib.request.build_opener(_NoRedirect)  # _open follows them, keeping the POST

    def _open(self, body: bytes, headers: dict):
        """POST to the URL, following up to 5 redirects; urllib follows none for a POST, though Search-R1's,
        verl's and SkyRL's clients (requests, aiohttp) follow 307/308 with the same POST."""
        url = self.url
        for _ in range(5):
            try:
                return self._opener.open(urllib.request.Request(url, body, headers), timeout=self.timeout_s)
            except urllib.error.HTTPError as err:
                location = err.headers.get("Location") if err.code in (307, 308) else None
                if not location:
                    raise
                err.close()
                url = urllib.parse.urljoin(url, location)
                if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                    raise RetrieverError(f"retriever at {self.url} redirected to {url}, not an http URL") from None
        raise RetrieverError(f"retriever at {self.url} redirected more than 5 times (last to {url})")

    def _post(self, payload: dict) -> dict:
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                with self._open(body, headers) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as err:
                detail = err.read()[:300].decode("utf-8", "replace")
                if err.code < 500 and err.code != 429:  # 429: too many connections from here for now
                    raise RetrieverError(
                        f"retriever at {self.url} refused the request ({err.code}): {detail}"
                    ) from None
                last = f"HTTP {err.code}: {detail}"
            except (urllib.error.URLError, http.client.HTTPException, OSError) as err:  # OSError: timeouts, resets
                last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
            except ValueError as err:  # a 200 whose body is not JSON: not worth retrying
                raise RetrieverError(f"retriever at {self.url} sent a response that is not JSON: {err}") from None
        raise RetrieverError(f"retriever at {self.url} unreachable after {self.retries + 1} attempts; last: {last}")

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[tuple[Passage, float]]]:
        queries = list(queries)
        if not queries:
            return []
        result = self._post({"queries": queries, "topk": k, "return_scores": True}).get("result")
        if not isinstance(result, list) or len(result) != len(queries):
            raise RetrieverError(f"retriever at {self.url} sent no result list of {len(queries)} entries")
        try:
            return [[_hit(h) for h in hits] for hits in result]
        except (AttributeError, TypeError, ValueError) as err:
            raise RetrieverError(f"retriever at {self.url} sent hits in an unknown layout: {err}") from None


def _hit(h: dict) -> tuple[Passage, float]:
    doc = h.get("document", h)
    contents = doc.get("contents")
    if contents is None:  # servers that send title and text only
        contents = f'"{doc.get("title", "")}"\n{doc.get("text", "")}'
    title, _, text = str(contents).partition("\n")
    return Passage(str(doc.get("id", "")), title.strip('"'), text), float(h.get("score", 0.0))
