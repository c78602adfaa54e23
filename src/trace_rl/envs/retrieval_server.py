"""The /retrieve server (FastAPI on uvicorn) and its client, speaking the protocol of Search-R1's retrieval server.

Request: POST /retrieve with {"queries": [str, ...], "topk": int, "return_scores": bool} (Search-R1's training
loop, verl's search tool) or {"query": str, ...} (SkyRL's search tool, answered as a batch of one). topk null or 0
means the server's default. Response: {"result": [hits per query]}, a hit being {"document": doc, "score": float}
with return_scores, else doc; doc is {"id", "title", "text", "contents"}, `contents` being '"Title"\\ntext' as
Search-R1 writes it. {"queries": []} answers {"result": []}.

Limits, all in ServerLimits (`envs.retrieval_request`, with the parsing of a request), so that no client can
make the server hold much memory, hold the search for long, or lock other clients out:
- size: the body, the queries per request, each query's length, topk and queries x topk (the hits of one reply)
  are capped, and a reply over max_reply_bytes is refused rather than sent; every malformed or over-limit
  request gets a 4xx with {"error": "..."} naming the field.
- time: searches run in a worker thread under one lock (the retrievers are not known to be thread-safe), a few
  queries per hold of the lock, granted in arrival order, so a large batch interleaves with other clients'
  requests instead of holding the search for its whole length; a request not answered within max_request_s
  (waiting included) gets 503, which clients retry. Send many queries in one request rather than many requests.
- connections: a connection that sends no request head within idle_timeout_s is closed (uvicorn itself only
  times out connections idle after a response), a body that does not arrive within body_timeout_s (10 s)
  gets 408. At max_connections, or at max_connections_per_client from one address (on loopback every local
  process is one address), a new connection takes the place of the oldest idle one, else of the oldest one
  still receiving its body (from the address holding most of those): so neither idle sockets nor clients
  that send their bodies a byte at a time can lock anyone out. Only when every connection holds a whole
  request in progress does a new one get 429 (its address's cap) or 503 (the total).
- output: a reply is written whole into the connection's buffer, so clients that never read would keep theirs
  (300 such clients of 5.9 MB replies took a server from 101 to 1,089 MiB, and closed connections stayed
  while their unread bytes did). Every connection counts against max_connections until it is gone, closing
  ones included; the bytes its clients have not read, in all, are held under max_buffered_bytes (a reply that
  would pass it gets 503, which clients retry); a reply not read within send_timeout_s is dropped with its
  connection (abort: the memory returns at once), and so is any connection this server closes that still
  holds unread bytes; at the connection cap an unread reply is evicted before a slow body. Each socket's
  kernel send buffer is socket_buffer_bytes (no autotuning to megabytes per connection).
  `RetrieverServer.stats()` gives the server's own count of connections and unread bytes.
- logs: uvicorn's and this module's records go through a bounded queue to a thread that writes stderr
  (`log_off_the_loop`), so a stderr nobody reads can never stall the server (records past the queue are
  dropped); a client that disconnects mid-body is one line, not a traceback.
serve() binds loopback addresses only unless allow_remote is set, as the server has no authentication.

The client, RemoteRetriever, lives in `envs.retrieval_client` (imported here too).
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint's annotations at runtime, and `Request`
# is imported inside _app so that the client needs no FastAPI.
import asyncio
import collections
import ipaddress
import json
import logging
import socket
import threading
import time
from typing import Any

from .retrieval import Passage, Retriever
from .retrieval_client import RemoteRetriever, RetrieverError
from .retrieval_log import log_off_the_loop
from .retrieval_request import RequestError, ServerLimits, parse_request

__all__ = ["RemoteRetriever", "RequestError", "RetrieverError", "RetrieverServer", "ServerLimits", "serve"]


log = logging.getLogger(__name__)


class _Output:
    """The server's own count of its connections and of the reply bytes they hold that clients have not read:
    the transports' write buffers plus replies made and not yet written (`reserve`). Updated on the event loop,
    read from any thread (`stats`)."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits, self.connections, self.reserved, self._lock = limits, set(), 0, threading.Lock()

    def add(self, conn: Any) -> None:
        with self._lock:
            self.connections.add(conn)

    def discard(self, conn: Any) -> None:
        with self._lock:
            self.connections.discard(conn)

    def buffered(self) -> int:
        with self._lock:
            conns, reserved = list(self.connections), self.reserved
        return reserved + sum(c.transport.get_write_buffer_size() for c in conns)

    def reserve(self, size: int) -> None:
        """Count a reply about to be written, or RequestError(503) when it would pass max_buffered_bytes."""
        held = self.buffered()
        if held + size > self.limits.max_buffered_bytes:
            raise RequestError(
                503,
                f"busy: clients have not read {held} bytes of replies (this server holds at most "
                f"{self.limits.max_buffered_bytes}); retry",
            )
        with self._lock:
            self.reserved += size

    def release(self, size: int) -> None:
        with self._lock:
            self.reserved -= size

    def stats(self) -> dict[str, int]:
        with self._lock:  # a dropped connection is gone within one turn of the event loop
            count = sum(not getattr(c, "dropped", False) for c in self.connections)
        return {"connections": count, "buffered_bytes": self.buffered()}


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


def _app(retriever: Retriever, limits: ServerLimits, output: _Output):
    from fastapi import FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    lock = _FifoLock()

    class Reply(Response):
        """A reply counted in `output` from the moment it is made until it is in its connection's buffer."""

        async def __call__(self, scope, receive, send) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                output.release(len(self.body))

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
        except ClientDisconnect:  # gone (or shed for a new client) mid-body: one line, not a traceback
            who = request.client.host if request.client else "a client"
            log.warning("%s disconnected after %d of its request body's bytes", who, size)
            raise RequestError(400, "the client disconnected before its body arrived") from None
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
        output.reserve(len(body))
        return Reply(body, media_type="application/json")

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


def _drop(transport: asyncio.Transport) -> None:
    """Close, or abort where bytes are still unread: a closed transport keeps its buffer until the client reads
    it, which a client that never reads never does; abort frees it at once."""
    if transport.get_write_buffer_size():
        transport.abort()
    else:
        transport.close()


def _victim(others: list) -> Any:
    """The connection to make room with: the oldest idle one, else the oldest holding an unread reply, else the
    oldest still receiving its body from the address that has most of those; None when none of these exists."""
    victims = [c for c in others if c.idle()] or [c for c in others if c.unread()]
    if not victims:
        slow = [c for c in others if c.receiving()]
        counts = collections.Counter(c.client[0] if c.client else None for c in slow)
        top = max(counts, key=counts.__getitem__, default=None)
        victims = [c for c in slow if (c.client[0] if c.client else None) == top]
    return min(victims, key=lambda c: c.opened) if victims else None


def _protocol(limits: ServerLimits, output: _Output):
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        """uvicorn's h11 protocol, closing a connection whose next request head does not come in time or whose
        reply is not read in time, and keeping the connection limits passable for a new client: at a limit, a
        new connection takes the place of the oldest idle one, else of the oldest one holding an unread reply,
        else of the oldest one still receiving its request body (a slow client, from the address holding most
        such connections), and is refused only when every connection has a whole request in progress. Every
        connection counts until it is gone (closing ones too), bar those this server already dropped."""

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self.opened, self.dropped = self.loop.time(), False
            output.add(self)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limits.socket_buffer_bytes)
            self._deadline(None)
            open_ = [c for c in self.connections if not getattr(c, "dropped", False)]
            mine = [c for c in open_ if c.client and self.client and c.client[0] == self.client[0]]
            if len(mine) > limits.max_connections_per_client and not self._evict(mine):
                self._refuse(429, f"this address holds {limits.max_connections_per_client} busy connections; retry")
            elif len(open_) > limits.max_connections and not self._evict(open_):
                self._refuse(503, "every connection is busy; retry")

        def connection_lost(self, exc: Exception | None) -> None:
            output.discard(self)
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            done = self.cycle
            super().on_response_complete()
            self._deadline(done)
            if self.transport.get_write_buffer_size():  # the client has not read it all yet

                def unread() -> None:
                    if self.transport.get_write_buffer_size():
                        self.dropped = True
                        self.transport.abort()

                self.loop.call_later(limits.send_timeout_s, unread)

        def idle(self) -> bool:  # no request in progress and nothing unread: between requests, or mid-head
            return (
                (self.cycle is None or self.cycle.response_complete)
                and not self.transport.is_closing()
                and not self.transport.get_write_buffer_size()
            )

        def unread(self) -> bool:  # its reply is written and not yet read, whether or not the request closed it
            return (self.cycle is None or self.cycle.response_complete) and self.transport.get_write_buffer_size() > 0

        def receiving(self) -> bool:  # its request's head came, its body is still coming
            return (
                self.cycle is not None
                and not self.cycle.response_complete
                and self.conn.their_state is h11.SEND_BODY
                and not self.transport.is_closing()
            )

        def _evict(self, among: list) -> bool:
            """Drop the connection `_victim` picks among `among` (not this one); False when there is none."""
            victim = _victim([c for c in among if c is not self])
            if victim is None:
                return False
            victim.dropped = True
            _drop(victim.transport)
            return True

        def _refuse(self, status: int, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            head = (
                f"HTTP/1.1 {status} {_REFUSED[status]}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
            self.dropped = True
            _drop(self.transport)

        def _deadline(self, cycle: object) -> None:
            def expire() -> None:  # no new request cycle began since: the connection is idle
                if self.cycle is cycle and not self.transport.is_closing():
                    self.dropped = True
                    _drop(self.transport)

            self.loop.call_later(limits.idle_timeout_s, expire)

    return Protocol


def is_loopback(host: str) -> bool:
    """localhost or a loopback IP: where `serve` listens unless allow_remote (also checked by the command's
    config, before any work)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RetrieverServer:
    """A running server: `server_address` is (host, port), `url` its /retrieve URL; `shutdown()` stops it."""

    def __init__(self, server: Any, thread: threading.Thread, address: tuple[str, int], output: _Output):
        self._server, self._thread, self.server_address, self._output = server, thread, address, output

    def stats(self) -> dict[str, int]:
        """The server's own count: `connections` (open or closing, until gone, bar those it dropped) and
        `buffered_bytes` (reply bytes written or about to be, that clients have not read)."""
        return self._output.stats()

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
    if not allow_remote and not is_loopback(host):
        raise ValueError(
            f"host {host!r} is not a loopback address; the server has no authentication, so serving "
            "beyond this machine needs allow_remote=True"
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in 0..65535, got {port!r}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    log_off_the_loop()
    output = _Output(limits)
    config = uvicorn.Config(
        _app(retriever, limits, output),
        http=_protocol(limits, output),
        lifespan="off",
        log_config=None,  # log_off_the_loop's handlers stay: uvicorn's own would write to stderr from the loop
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
    return RetrieverServer(server, thread, sock.getsockname()[:2], output)
