"""One HTTP exchange with a bound on its total time and on the size of its reply (standard library only).

A socket timeout bounds each read, not the exchange: a server that sends one byte every few seconds never trips
it. Here a timer shuts the socket down when the exchange's deadline passes, whatever phase it is in (connecting,
sending, waiting for the status line, reading headers or body), so `exchange` returns or raises within about
`timeout` seconds. Name resolution (`getaddrinfo`) runs before the socket exists and is not cut by the timer;
callers that must bound it too wait on the exchange from another thread (the server backend's run watchdog does).

Every failure to get one complete reply is a `TransportError` whose message is one line saying what the server
did: refused or reset the connection, sent nothing complete within the deadline, sent a body shorter than its
Content-Length, or more than `max_bytes`.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.parse

MAX_REPLY_BYTES = 64 * 2**20  # a completion reply of a few thousand tokens is well under 1 MiB
CHUNK = 1 << 16


class TransportError(Exception):
    """No complete HTTP reply; the message is one line saying what the server did."""


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Cutter:
    """Shuts the connection's socket down at the deadline: a blocked read or write in the caller's thread returns."""

    def __init__(self, conn: http.client.HTTPConnection, timeout: float):
        self.conn, self.fired = conn, False
        self.timer = threading.Timer(timeout, self.cut)
        self.timer.daemon = True
        self.timer.start()

    def cut(self) -> None:
        self.fired = True
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass


def _read_body(resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    expected = resp.length  # Content-Length (None when chunked or absent); http.client counts it down as it reads
    chunks, size = [], 0
    while True:
        chunk = resp.read1(CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > max_bytes:
            raise TransportError(f"sent a reply larger than {max_bytes} bytes")
        chunks.append(chunk)
    if expected is not None and size < expected:
        raise TransportError(f"sent a body of {size} bytes, shorter than its Content-Length of {expected}")
    return b"".join(chunks)


def exchange(
    url: str,
    method: str = "GET",
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
    max_bytes: int = MAX_REPLY_BYTES,
) -> tuple[int, bytes]:
    """(status, body) of one request to `url`, within `timeout` seconds in all (see the module's docstring);
    `TransportError` (one line) when no complete reply came. Redirects are not followed (a 3xx is returned)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransportError(f"{url!r} is not an http(s) URL")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    start = time.monotonic()
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    cutter = _Cutter(conn, timeout)
    try:
        conn.connect()
        if cutter.fired:  # the timer fired while connecting, before the socket could be shut down
            raise TimeoutError
        conn.request(method, path, body=data, headers=headers or {})
        resp = conn.getresponse()
        body = _read_body(resp, max_bytes)
        if cutter.fired:  # http.client reads a shut-down socket as the end of the headers or body: not a reply
            raise TimeoutError
        return resp.status, body
    except (OSError, http.client.HTTPException) as err:
        if cutter.fired or isinstance(err, TimeoutError):
            waited = time.monotonic() - start
            raise TransportError(f"sent no complete reply within {waited:.3g} s (limit {timeout:.3g} s)") from None
        if isinstance(err, http.client.IncompleteRead):
            raise TransportError(f"closed the connection mid-body ({len(err.partial)} bytes read)") from None
        why = (err.strerror if isinstance(err, OSError) else None) or str(err) or "no detail"
        raise TransportError(one_line(f"{type(err).__name__}: {why}")) from None
    finally:
        cutter.timer.cancel()
        conn.close()
