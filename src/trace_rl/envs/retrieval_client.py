"""The client of a /retrieve server (this package's `envs.retrieval_server`, Search-R1's, or a derivative).

RemoteRetriever accepts the URL that Search-R1, verl and SkyRL configure (http://host:port/retrieve) or a bare
http://host:port; it follows redirects (307/308 keep the POST; FastAPI answers /retrieve/ with one), retries
connection errors, timeouts, 429 and 5xx with exponential backoff, then raises one RetrieverError; any other
4xx raises RetrieverError at once, with the server's message.
"""

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from .retrieval import Passage


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
