"""The /retrieve server as Search-R1's, verl's and SkyRL's clients call it; what it promises against any client
(replies, queries and request time bounded, every malformed or over-limit request a 4xx naming the field, idle
or greedy connections unable to lock others out); the client is test_retrieval_client.py's.
Servers run on 127.0.0.1 (a second client address is 127.0.0.2, also loopback) with port 0; every loop is
bounded."""

import http.client
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("bm25s")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from trace_rl.envs.retrieval import BM25Retriever, Passage
from trace_rl.envs.retrieval_server import (
    ServerLimits,
    parse_request,
    serve,
)

PASSAGES = [Passage(str(i), f"River {i}", f"River {i} flows through town {i}.") for i in range(8)] + [
    Passage("8", "Jaws (film)", "Jaws is a 1975 thriller film directed by Steven Spielberg."),
    Passage("9", "Steven Spielberg", "Steven Spielberg was born in Cincinnati, Ohio."),
]
LIMITS = ServerLimits(
    max_topk=6,
    max_queries=4,
    max_query_chars=200,
    max_hits=12,
    max_body_bytes=2000,
    max_reply_bytes=1500,
    idle_timeout_s=0.3,
    body_timeout_s=1.0,
)


@pytest.fixture(scope="module")
def server():
    srv = serve(BM25Retriever(PASSAGES), "127.0.0.1", 0, limits=LIMITS)
    yield srv
    srv.shutdown()


def post(server, body: bytes, path: str = "/retrieve", method: str = "POST", headers=None) -> tuple[int, dict]:
    host, port = server.server_address
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def post_json(server, payload) -> dict:
    status, data = post(server, json.dumps(payload).encode())
    assert status == 200, data
    return data


# -- what any client gets: Search-R1, verl and SkyRL requests --------------------------------------------------


def test_search_r1_training_loop_requests(server):
    # search_r1/llm_agent/generation.py, _batch_search: {"queries", "topk", "return_scores": True}, reads
    # doc_item["document"]["contents"] and splits the title off its first line
    data = post_json(server, {"queries": ["Spielberg birthplace", "river town"], "topk": 3, "return_scores": True})
    first, second = data["result"]
    contents = first[0]["document"]["contents"]
    assert contents.split("\n")[0] == '"Steven Spielberg"' and isinstance(first[0]["score"], float)
    assert len(second) == 3 and all(h["document"]["title"].startswith("River") for h in second)
    # turns in which no rollout searched send an empty batch
    assert post_json(server, {"queries": [], "topk": 3, "return_scores": True}) == {"result": []}


def test_verl_search_tool_request(server):
    # verl/tools/utils/search_r1_like_utils.py, call_search_api: same payload, Accept header, full /retrieve URL
    status, data = post(
        server,
        json.dumps({"queries": ["Jaws director"], "topk": 2, "return_scores": True}).encode(),
        headers={"Accept": "application/json"},
    )
    assert status == 200 and data["result"][0][0]["document"]["contents"].startswith('"Jaws (film)"\n')


def test_skyrl_search_tool_request(server):
    # skyrl_gym/tools/search.py, call_search_api: singular "query"; answered as a batch of one
    data = post_json(server, {"query": "Spielberg", "topk": 3, "return_scores": True})
    assert len(data["result"]) == 1 and data["result"][0][0]["document"]["id"] in ("8", "9")


def test_topk_defaults_scores_and_queries_without_matching_words(server):
    for topk in (None, 0):
        assert len(post_json(server, {"queries": ["river"], "topk": topk})["result"][0]) == LIMITS.default_topk
    assert len(post_json(server, {"queries": ["river"]})["result"][0]) == LIMITS.default_topk
    assert len(post_json(server, {"queries": ["river"], "topk": 5})["result"][0]) == 5
    plain = post_json(server, {"queries": ["Cincinnati"], "topk": 1, "return_scores": False})["result"][0][0]
    assert set(plain) == {"id", "title", "text", "contents"} and plain["title"] == "Steven Spielberg"
    # no passage shares a word with these: BM25 returns nothing, as Search-R1's does
    assert post_json(server, {"queries": ["zebra quantum", "the of and", ""], "topk": 3})["result"] == [[], [], []]


# -- bounded replies and queries: every malformed or over-limit request is a 4xx naming the field ---------------

MALFORMED = [
    (b"{", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b"[]", 400, "JSON object"),
    (b'{"queries": 3}', 400, "'queries'"),
    (b'{"queries": ["a", 1]}', 400, "'queries'"),
    (b'{"query": ["a"]}', 400, "'query'"),
    (b'{"query": "a", "queries": ["a"]}', 400, "not both"),
    (b'{"topk": 3}', 400, "needs 'queries'"),
    (b'{"queries": ["a"], "topk": Infinity}', 400, "Infinity"),
    (b'{"queries": ["a"], "topk": NaN}', 400, "NaN"),
    (b'{"queries": ["a"], "topk": -1}', 400, "'topk'"),
    (b'{"queries": ["a"], "topk": 2.5}', 400, "'topk'"),
    (b'{"queries": ["a"], "topk": "3"}', 400, "'topk'"),
    (b'{"queries": ["a"], "topk": true}', 400, "'topk'"),
    (b'{"queries": ["a"], "topk": 1000000000000}', 400, "at most 6"),
    (b'{"queries": ["a"], "return_scores": "yes"}', 400, "'return_scores'"),
    (json.dumps({"queries": ["a"] * 5}).encode(), 400, "takes 4"),
    (json.dumps({"queries": ["a" * 201]}).encode(), 400, "holds 201 characters; this server takes 200"),
    (json.dumps({"queries": ["a"] * 3, "topk": 5}).encode(), 400, "3 x 5; this server returns at most 12 hits"),
    (json.dumps({"queries": ["a" * 3000]}).encode(), 413, "at most 2000 bytes"),
    (b"[" * 1000 + b"]" * 1000, 400, "not valid JSON"),
]


@pytest.mark.parametrize(("body", "status", "message"), MALFORMED)
def test_every_malformed_request_gets_a_4xx_with_a_json_error(server, body, status, message):
    got, data = post(server, body)
    assert (got, set(data)) == (status, {"error"}) and message in data["error"]


def test_a_reply_over_max_reply_bytes_is_refused_not_sent(server):
    # 4 queries x topk 3 is within max_hits, but 12 passages (with contents) exceed 1500 bytes
    status, data = post(server, json.dumps({"queries": ["river town"] * 4, "topk": 3}).encode())
    assert status == 400 and "this server sends at most 1500" in data["error"]
    assert len(post_json(server, {"queries": ["river town"], "topk": 2})["result"][0]) == 2


def test_wrong_path_and_method_and_chunked_oversize_body_get_json_errors(server):
    assert post(server, b"{}", path="/search")[0] == 404
    status, data = post(server, b"", method="GET")
    assert status == 405 and "POST /retrieve" in data["error"]
    host, port = server.server_address
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:  # no Content-Length: the cap applies while reading
        conn.request("POST", "/retrieve", iter([b'{"queries": ["', b"a" * 3000, b'"]}']), encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413 and "error" in json.loads(resp.read())
    finally:
        conn.close()
    assert post_json(server, {"queries": ["river"], "topk": 1})["result"][0]  # and it still serves


# -- connections and time: no client can hold the search or lock others out ----------------------------------


def test_idle_and_stalled_connections_are_closed(server):
    with socket.create_connection(server.server_address, timeout=5) as idle:
        assert idle.recv(1) == b""  # closed by the server after idle_timeout_s, well before the 5 s timeout
    with socket.create_connection(server.server_address, timeout=5) as stalled:
        stalled.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        reply = b""
        for _ in range(10):  # headers and body may come in separate packets; the server then closes
            chunk = stalled.recv(4096)
            reply += chunk
            if not chunk:
                break
        assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive" in reply


def test_serve_binds_loopback_only_and_shuts_down():
    with pytest.raises(ValueError, match="not a loopback address"):
        serve(BM25Retriever(PASSAGES), "0.0.0.0", 0)
    with pytest.raises(ValueError, match="max_topk"):
        ServerLimits(max_topk=0)
    srv = serve(BM25Retriever(PASSAGES), "127.0.0.1", 0)
    address = srv.server_address
    assert address[0] == "127.0.0.1" and srv.url == f"http://127.0.0.1:{address[1]}/retrieve"
    srv.shutdown()
    with pytest.raises(OSError):
        socket.create_connection(address, timeout=2).close()


def test_parse_request_names_the_field():
    assert parse_request(b'{"query": "q", "topk": null, "return_scores": null}', LIMITS) == (["q"], 3, False)
    with pytest.raises(Exception, match="'return_scores'"):
        parse_request(b'{"queries": [], "return_scores": 1}', LIMITS)


class Gate:
    """A retriever that blocks on the query "hold" until released (up to 5 s), and logs the queries it searched."""

    def __init__(self):
        self.inner, self.release, self.searched = BM25Retriever(PASSAGES), threading.Event(), []
        self.passages = self.inner.passages

    def search(self, queries, k=3):
        self.searched += list(queries)
        if "hold" in queries:
            self.release.wait(5)
        return self.inner.search(queries, k)


def test_a_search_that_holds_the_lock_costs_others_a_503_after_max_request_s_not_a_hang():
    gate = Gate()
    srv = serve(gate, "127.0.0.1", 0, limits=ServerLimits(max_request_s=0.5, search_chunk=1))
    try:
        held = threading.Thread(target=post, args=(srv, json.dumps({"queries": ["hold", "river"]}).encode()))
        held.start()
        for _ in range(500):  # until the held search has begun (bounded: 5 s)
            if gate.searched:
                break
            time.sleep(0.01)
        status, data = post(srv, json.dumps({"queries": ["Spielberg"]}).encode())
        assert status == 503 and "did not finish within 0.5 s" in data["error"]
        gate.release.set()
        held.join(10)
        # the waiting request never ran its search; the held one did not finish its second chunk in time either
        assert gate.searched == ["hold"]
        assert post_json(srv, {"queries": ["Spielberg"], "topk": 1})["result"][0]  # and the server still serves
    finally:
        gate.release.set()
        srv.shutdown()


def test_the_search_lock_goes_to_whoever_waited_not_back_to_the_batch_that_released_it():
    from trace_rl.envs.retrieval_server import _FifoLock

    lock, order = _FifoLock(), []
    assert lock.acquire(timeout=1)  # a large batch between two of its chunks

    def other():
        if lock.acquire(timeout=5):
            order.append("other client")
            lock.release()

    waiter = threading.Thread(target=other)
    waiter.start()
    for _ in range(500):  # until the other request is in line (bounded: 5 s)
        if lock._queue:
            break
        time.sleep(0.01)
    lock.release()
    assert lock.acquire(timeout=5)  # the batch's next chunk: queued behind the other client
    order.append("next chunk")
    lock.release()
    waiter.join(5)
    assert order == ["other client", "next chunk"]
    assert lock.acquire(timeout=1) and not _acquired_in_thread(lock)  # a held lock times out for others


def _acquired_in_thread(lock) -> bool:
    got = []
    t = threading.Thread(target=lambda: got.append(lock.acquire(timeout=0.1)))
    t.start()
    t.join(5)
    return got == [True]


def connect(srv, source: str) -> socket.socket:
    return socket.create_connection(srv.server_address, timeout=5, source_address=(source, 0))


def get_reply(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length bytes of body), or what came before the server closed. It
    must not wait for the close: after a reply the server keeps the connection for keep_alive_s (5 s), the
    socket's own timeout, and the old test that waited for it failed whenever the timeout came first."""
    reply = b""
    for _ in range(50):  # bounded
        head, sep, body = reply.partition(b"\r\n\r\n")
        if sep:
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            if len(body) >= length:
                return reply
        chunk = sock.recv(4096)
        if not chunk:
            break
        reply += chunk
    return reply


REQUEST = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 21\r\n\r\n"


def test_idle_sockets_make_room_for_new_clients_instead_of_locking_them_out():
    limits = ServerLimits(max_connections=8, max_connections_per_client=8, idle_timeout_s=30.0)
    srv = serve(BM25Retriever(PASSAGES), "127.0.0.1", 0, limits=limits)
    idle = [connect(srv, "127.0.0.2") for _ in range(12)]  # more idle sockets than the server takes
    try:
        for _ in range(3):  # every new client is served, each time at the cost of the oldest idle socket
            host, port = srv.server_address
            conn = http.client.HTTPConnection(host, port, timeout=5, source_address=("127.0.0.1", 0))
            conn.request("POST", "/retrieve", json.dumps({"queries": ["Spielberg"]}), {"Content-Type": "a/json"})
            assert conn.getresponse().status == 200
            conn.close()
        assert idle[0].recv(1) == b""  # the oldest idle socket was closed
    finally:
        for sock in idle:
            sock.close()
        srv.shutdown()


def protocols(srv) -> list:
    """The server's open connections (its protocol objects), read from the test's thread."""
    return [c for c in list(srv._server.server_state.connections) if not c.transport.is_closing()]


def wait_for(predicate, what: str) -> None:
    """Wait until the server's state satisfies `predicate` (bounded: 10 s). Waiting on the state itself, not on a
    sleep: a fixed sleep let a loaded machine start the next step before the server had read the heads."""
    for _ in range(1000):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"the server never got to: {what}")


def slow_client(srv, source: str) -> socket.socket:
    """A connection that sent a request head and the first bytes of its body, then nothing (a slow client)."""
    sock = connect(srv, source)
    sock.sendall(REQUEST + b'{"queries"')
    return sock


def test_slow_bodies_from_one_address_make_room_for_its_next_client_and_others():
    limits = ServerLimits(max_connections=8, max_connections_per_client=3, body_timeout_s=30.0)
    srv = serve(BM25Retriever(PASSAGES), "127.0.0.1", 0, limits=limits)
    slow = [slow_client(srv, "127.0.0.2") for _ in range(3)]
    try:
        wait_for(lambda: sum(c.receiving() for c in protocols(srv)) == 3, "three bodies arriving")
        with connect(srv, "127.0.0.2") as fresh:  # same address, at its cap: the oldest slow one makes room
            fresh.sendall(REQUEST + b'{"queries": ["jaws"]}')
            assert get_reply(fresh).startswith(b"HTTP/1.1 200")
        assert get_reply(slow[0]) == b""  # shed: closed without a reply
        with connect(srv, "127.0.0.1") as other:
            other.sendall(REQUEST + b'{"queries": ["jaws"]}')
            assert get_reply(other).startswith(b"HTTP/1.1 200")
    finally:
        for sock in slow:
            sock.close()
        srv.shutdown()


def test_slow_bodies_from_many_addresses_do_not_fill_the_server_for_a_new_client():
    limits = ServerLimits(max_connections=6, max_connections_per_client=3, body_timeout_s=30.0)
    srv = serve(BM25Retriever(PASSAGES), "127.0.0.1", 0, limits=limits)
    slow = [slow_client(srv, f"127.0.0.{n}") for n in (2, 2, 2, 3, 3, 4)]  # the server is full of them
    try:
        wait_for(lambda: sum(c.receiving() for c in protocols(srv)) == 6, "six bodies arriving")
        for _ in range(3):  # every new client gets through (after the first, at the cost of the last one's
            with connect(srv, "127.0.0.5") as fresh:  # connection, idle once answered, if not yet closed)
                fresh.sendall(REQUEST + b'{"queries": ["jaws"]}')
                assert get_reply(fresh).startswith(b"HTTP/1.1 200")
        assert get_reply(slow[0]) == b""  # the first made room: 127.0.0.2, which held the most, lost its oldest
    finally:
        for sock in slow:
            sock.close()
        srv.shutdown()


def test_an_address_whose_connections_all_hold_whole_requests_gets_429_and_others_are_served():
    gate = Gate()
    limits = ServerLimits(max_connections=8, max_connections_per_client=2, max_request_s=10.0)
    srv = serve(gate, "127.0.0.1", 0, limits=limits)
    held = [connect(srv, "127.0.0.2") for _ in range(2)]
    try:
        for sock in held:  # whole requests, held by the search: busy, neither idle nor slow
            sock.sendall(REQUEST + b'{"queries": ["hold"]}')
        body_read = lambda c: c.cycle is not None and not c.idle() and not c.receiving()  # noqa: E731
        wait_for(lambda: sum(map(body_read, protocols(srv))) == 2, "two whole requests in progress")
        with connect(srv, "127.0.0.2") as extra:  # refused as it connects: nothing sent that the close would reset
            reply = get_reply(extra)
        assert reply.startswith(b"HTTP/1.1 429") and b"holds 2 busy connections" in reply
        gate.release.set()
        with connect(srv, "127.0.0.1") as other:
            other.sendall(REQUEST + b'{"queries": ["jaws"]}')
            assert get_reply(other).startswith(b"HTTP/1.1 200")
    finally:
        gate.release.set()
        for sock in held:
            sock.close()
        srv.shutdown()


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_client_gone_mid_body_is_one_log_line_not_a_traceback():
    srv = serve(BM25Retriever(PASSAGES), "127.0.0.1", 0, limits=LIMITS)
    mine, uvicorn_errors = Records(), Records()
    logging.getLogger("trace_rl.envs.retrieval_server").addHandler(mine)
    logging.getLogger("uvicorn.error").addHandler(uvicorn_errors)
    try:
        for _ in range(3):
            sock = slow_client(srv, "127.0.0.2")
            wait_for(lambda: any(c.receiving() for c in protocols(srv)), "a body arriving")
            sock.close()
        wait_for(lambda: len(mine.records) == 3, "three disconnects logged")
        assert all(r.exc_info is None and "disconnected after 10" in r.getMessage() for r in mine.records)
        assert uvicorn_errors.records == []  # before: "Exception in ASGI application" and 2.2 KB of traceback
    finally:
        logging.getLogger("trace_rl.envs.retrieval_server").removeHandler(mine)
        logging.getLogger("uvicorn.error").removeHandler(uvicorn_errors)
        srv.shutdown()


def test_the_log_queue_drops_records_rather_than_wait():
    from trace_rl.envs.retrieval_log import DropWhenFull

    handler = DropWhenFull(queue.Queue(3))  # nobody takes records off it
    logger = logging.getLogger("trace_rl.test_drop")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(10):
            logger.warning("record %d", i)
    finally:
        logger.removeHandler(handler)
    assert handler.queue.qsize() == 3 and handler.dropped == 7


_UNREAD_STDERR = """
import fcntl, os, sys, time
from trace_rl.envs.retrieval import BM25Retriever, Passage
from trace_rl.envs.retrieval_server import serve
srv = serve(BM25Retriever([Passage("0", "Jaws", "Jaws is a film.")]), "127.0.0.1", 0)
os.set_blocking(2, False)  # fill the pipe that nobody reads, so that any further write to stderr would block
try:
    while True:
        os.write(2, b"x" * 4096)
except BlockingIOError:
    pass
os.set_blocking(2, True)
print(srv.server_address[1], flush=True)
time.sleep(60)
"""


def test_a_stderr_nobody_reads_never_stalls_the_server():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _UNREAD_STDERR], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        port = int(proc.stdout.readline())
        for _ in range(30):  # each one logs; before, the first log write blocked the event loop for good
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(REQUEST + b'{"queries"')
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/retrieve", json.dumps({"queries": ["jaws"]}), {"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# -- output: clients that never read their replies -----------------------------------------------------------
BIG = [Passage(str(i), f"Delta {i}", f"Delta {i} " + "silt " * 4000) for i in range(12)]  # 20 KB each
BIG_REQUEST = json.dumps({"queries": ["delta silt"], "topk": 10}).encode()  # a reply of about 400 KB


def unread_client(srv) -> socket.socket:
    """A connection that sends a request for a large reply and never reads it (a tiny receive buffer, so the
    reply stays on the server's side)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(srv.server_address)
    head = f"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(BIG_REQUEST)}"
    sock.sendall(head.encode() + b"\r\n\r\n" + BIG_REQUEST)
    return sock


def flood_of_unread_replies(srv, limits: ServerLimits, clients: int) -> tuple[list[socket.socket], dict]:
    """`clients` unread clients, one every few milliseconds, with the server's own count sampled throughout; the
    sockets and the largest counts seen."""
    socks, most = [], {"connections": 0, "buffered_bytes": 0}
    stop = time.monotonic() + 30
    for _ in range(clients):
        socks.append(unread_client(srv))
        for _ in range(5):
            stats = srv.stats()
            most = {k: max(most[k], stats[k]) for k in most}
            time.sleep(0.002)
        assert time.monotonic() < stop
    return socks, most


def test_clients_that_never_read_stay_within_the_connection_cap_and_the_output_bound():
    limits = ServerLimits(
        max_connections=16,
        max_connections_per_client=16,
        max_reply_bytes=1 << 20,
        max_buffered_bytes=2 << 20,
        socket_buffer_bytes=64 << 10,
        idle_timeout_s=30.0,
    )
    srv = serve(BM25Retriever(BIG), "127.0.0.1", 0, limits=limits)
    socks: list[socket.socket] = []
    try:
        socks, most = flood_of_unread_replies(srv, limits, 60)
        assert most["connections"] <= limits.max_connections, most
        assert most["buffered_bytes"] <= limits.max_buffered_bytes, most
        assert most["buffered_bytes"] > 300_000, most  # replies did pile up: the bound was what held them
        wait_for(lambda: srv.stats()["connections"] == limits.max_connections, "the cap, full of unread replies")
        for sock in socks:  # the clients go without reading: what they held goes with them
            sock.close()
        wait_for(lambda: srv.stats() == {"connections": 0, "buffered_bytes": 0}, "no connection and nothing held")
    finally:
        for sock in socks:
            sock.close()
        srv.shutdown()


def test_a_reply_left_unread_past_send_timeout_s_is_dropped_and_others_are_served():
    limits = ServerLimits(
        max_connections=16,
        max_connections_per_client=16,
        max_reply_bytes=1 << 20,
        max_buffered_bytes=2 << 20,
        socket_buffer_bytes=64 << 10,
        send_timeout_s=1.0,
        idle_timeout_s=30.0,
    )
    srv = serve(BM25Retriever(BIG), "127.0.0.1", 0, limits=limits)
    socks: list[socket.socket] = []
    try:
        socks, _ = flood_of_unread_replies(srv, limits, 8)
        assert srv.stats()["buffered_bytes"] > 300_000
        wait_for(lambda: srv.stats()["buffered_bytes"] == 0, "unread replies dropped after send_timeout_s")
        assert srv.stats()["connections"] <= len(socks) - 4  # those that held a reply are gone, not closing
        status, data = post(srv, BIG_REQUEST)
        assert status == 200 and len(data["result"][0]) == 10
    finally:
        for sock in socks:
            sock.close()
        srv.shutdown()
