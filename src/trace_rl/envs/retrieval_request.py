"""What a /retrieve request may be (`envs.retrieval_server`): the server's limits (`ServerLimits`: sizes, times,
connections, buffered output; the server's docstring says what each bounds and why) and the parsing of a request
body within them (`parse_request`), whose refusals are a `RequestError` (an HTTP status and a message naming the
field).
"""

from __future__ import annotations

import json
from dataclasses import dataclass


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
    body_timeout_s: float = 10.0  # a client sends its body at once; a slow one holds a connection meanwhile
    keep_alive_s: float = 5.0
    max_connections: int = 256
    max_connections_per_client: int = 128
    max_buffered_bytes: int = 256 << 20  # replies written and not yet read by their clients, all connections
    send_timeout_s: float = 30.0  # a reply not read within this is dropped with its connection
    socket_buffer_bytes: int = 256 << 10  # each connection's kernel send buffer

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ServerLimits.{name} must be a positive number, got {value!r}")
        if self.default_topk > self.max_topk:
            raise ValueError(f"ServerLimits.default_topk ({self.default_topk}) exceeds max_topk ({self.max_topk})")
        if self.max_connections_per_client > self.max_connections:
            raise ValueError("ServerLimits.max_connections_per_client exceeds max_connections")
        if self.max_reply_bytes > self.max_buffered_bytes:
            raise ValueError("ServerLimits.max_reply_bytes exceeds max_buffered_bytes: no reply could be sent")


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
