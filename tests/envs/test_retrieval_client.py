"""The retriever client, RemoteRetriever, as the QA environment calls a /retrieve server: the URLs Search-R1's,
verl's and SkyRL's configs hold, the server's redirect, retries on 5xx and 429 (not on other 4xx), a redirect loop,
and one clear error when nothing listens. Servers run on 127.0.0.1 with port 0 (the project's own server, and a
scripted one for the failures); every loop is bounded."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("bm25s")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from trace_rl.envs.retrieval import BM25Retriever, Passage
from trace_rl.envs.retrieval_client import RemoteRetriever, RetrieverError
from trace_rl.envs.retrieval_server import serve

PASSAGES = [
    Passage("8", "Jaws (film)", "Jaws is a 1975 thriller film directed by Steven Spielberg."),
    Passage("9", "Steven Spielberg", "Steven Spielberg was born in Cincinnati, Ohio."),
]


@pytest.fixture(scope="module")
def server():
    srv = serve(BM25Retriever(PASSAGES), "127.0.0.1", 0)
    yield srv
    srv.shutdown()


def test_client_accepts_the_urls_peers_configure(server):
    host, port = server.server_address
    for url in (f"http://{host}:{port}/retrieve", f"http://{host}:{port}", f"http://{host}:{port}/"):
        client = RemoteRetriever(url)
        assert client.url == f"http://{host}:{port}/retrieve"
        (hits,) = client.search(["Spielberg birthplace"], 1)
        assert hits[0][0].title == "Steven Spielberg" and hits[0][1] > 0
    assert RemoteRetriever(server.url).search([], 3) == []
    with pytest.raises(ValueError, match="retriever url"):
        RemoteRetriever("localhost:8000")


def test_client_follows_the_servers_redirect(server):
    # FastAPI answers POST /retrieve/ with 307 to /retrieve; Search-R1's, verl's and SkyRL's clients follow it
    host, port = server.server_address
    (hits,) = RemoteRetriever(f"http://{host}:{port}/retrieve/").search(["Spielberg birthplace"], 1)
    assert hits[0][0].title == "Steven Spielberg"


class Flaky(BaseHTTPRequestHandler):
    """Answers 503 (429 on /busy) to the first `failures` requests, then one hit; 400 on /bad; /loop redirects to
    itself."""

    failures, seen = 0, []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        Flaky.seen.append(self.path)
        if self.path == "/loop":
            self.send_response(307)
            self.send_header("Location", "/loop")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/bad":
            code, body = 400, {"error": "'topk' is bad"}
        elif len(Flaky.seen) <= Flaky.failures:
            code, body = 429 if self.path == "/busy" else 503, {"error": "busy"}
        else:
            code, body = 200, {"result": [[{"document": {"id": "1", "contents": '"T"\nx'}, "score": 1.5}]]}
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    Flaky.seen = []
    yield srv
    srv.shutdown()
    srv.server_close()


def test_client_retries_5xx_then_succeeds_and_stops_at_4xx(flaky):
    url = f"http://127.0.0.1:{flaky.server_address[1]}"
    Flaky.failures = 2
    (hits,) = RemoteRetriever(url + "/retrieve", retries=2, backoff_s=0).search(["q"], 1)
    assert hits == [(Passage("1", "T", "x"), 1.5)] and len(Flaky.seen) == 3
    Flaky.seen, Flaky.failures = [], 5
    with pytest.raises(RetrieverError, match="unreachable after 3 attempts; last: HTTP 503"):
        RemoteRetriever(url, retries=2, backoff_s=0).search(["q"], 1)
    Flaky.seen = []
    with pytest.raises(RetrieverError, match="refused the request \\(400\\).*'topk' is bad"):
        RemoteRetriever(url + "/bad", retries=2, backoff_s=0).search(["q"], 1)
    assert len(Flaky.seen) == 1  # a 4xx is not retried
    Flaky.seen, Flaky.failures = [], 1
    assert RemoteRetriever(url + "/busy", retries=1, backoff_s=0).search(["q"], 1) == [hits]  # 429 is retried
    Flaky.seen = []
    with pytest.raises(RetrieverError, match="redirected more than 5 times"):
        RemoteRetriever(url + "/loop", retries=0).search(["q"], 1)
    assert len(Flaky.seen) == 5


def test_client_raises_one_clear_error_when_nothing_listens():
    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RetrieverError, match=f"127.0.0.1:{port}/retrieve unreachable after 2 attempts"):
        RemoteRetriever(f"http://127.0.0.1:{port}/retrieve", retries=1, backoff_s=0, timeout_s=2).search(["q"])
