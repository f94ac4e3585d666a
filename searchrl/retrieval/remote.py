"""A Retriever that calls a `/retrieve` server over plain HTTP: searchrl's own (`searchrl.serving.serve`) or
Search-R1's.

What is retried (`retries` times, with exponential backoff, or the server's Retry-After when longer, up to
MAX_RETRY_AFTER_S): connection errors, timeouts, broken or cut-short responses, bodies that are not UTF-8
JSON, 408, 429 and 5xx. When the retries are used up the search raises `RetrievalUnavailable`. What is not
retried: any other 4xx (the request itself is wrong) and a JSON answer of the wrong shape or with a
non-finite score; they raise `RetrievalError`, or `QueryRefused` when the server's error names the query
whose text it refuses (searchrl's server's {"error", "query": index}). A 413 (the response would be too
large) is not the queries' doing: the request is split in halves until it passes, and one query still
refused raises `RetrievalError`. Each attempt must be over (connect, send, the whole response) within
`timeout` seconds, however slowly the server trickles bytes.

Replicas: `config.url` may list several servers of one index, joined by commas. A batch is cut into contiguous
shards, one per replica, searched concurrently (each in requests of at most `batch_size` queries and
`max_hits` queries x topk) and joined in input order. A circuit breaker remembers failures: a replica that
fails a request is set aside for `cooldown_s` (doubled at each failure in a row, at most MAX_COOLDOWN_S),
during which shards go to the others; after it, the replica's next request probes it, and a success puts
it back. A replica that another replica can stand in for gets one attempt, not `retries` + 1, so a hung
replica costs one `timeout` and then none until it is probed again; the last replica left to try gets
every retry, and set-aside replicas are still tried, last, before the search raises `RetrievalUnavailable`
(when every replica has failed it). With `config.index_fingerprint`, each replica's GET /health is checked
before its first search: a server naming another index fingerprint (or none) is refused with a
`RetrievalError`.
"""
from __future__ import annotations

import concurrent.futures
import http.client
import json
import math
import threading
import time
import urllib.parse
from typing import Any, Sequence

from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.corpus import split_contents
from searchrl.retrieval.deadline import Connection
from searchrl.retrieval.types import Hit, QueryRefused, RetrievalError, RetrievalUnavailable

MAX_RETRY_AFTER_S = 60.0  # the longest Retry-After honoured
MAX_COOLDOWN_S = 300.0  # the longest a failing replica is set aside
RETRIED_STATUSES = (408, 429)  # and every 5xx


class _TooLarge(RetrievalError):
    """A 413: the request's response would exceed what the server sends."""


class _Transient(Exception):
    """One attempt's failure that a retry may cure; `wait_s`: how long the server asked us to wait."""

    def __init__(self, message: str, wait_s: float = 0.0):
        super().__init__(message)
        self.wait_s = wait_s


def _finite(score: Any) -> bool:
    try:
        return isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score)
    except OverflowError:  # an int beyond float range
        return False


def parse_document(item: Any, where: str) -> Hit:
    """One result entry: {"document": doc, "score": s} or a bare doc; doc has "contents" (FlashRAG) or
    "title"/"text", and usually an "id"."""
    score = 0.0
    if isinstance(item, dict) and isinstance(item.get("document"), dict):
        score = item.get("score", 0.0)
        item = item["document"]
    if not isinstance(item, dict):
        raise RetrievalError(f"{where}: expected a document object, got {item!r:.200}")
    if not _finite(score):
        raise RetrievalError(f"{where}: the score must be a finite number, got {score!r:.50}")
    if isinstance(item.get("contents"), str):
        title, text = split_contents(item["contents"])
    elif isinstance(item.get("text"), str):
        title, text = str(item.get("title") or ""), item["text"]
    else:
        raise RetrievalError(f'{where}: document has no "contents" or "text": {item!r:.200}')
    doc_id = item.get("id", item.get("_id", ""))
    return Hit(id=str(doc_id), score=float(score), title=title, text=text)


def parse_response(body: Any, n_queries: int) -> list[list[Hit]]:
    """A /retrieve response ({"result": [...]} or the bare list some Search-R1 forks return) -> hits."""
    result = body.get("result") if isinstance(body, dict) else body
    if not isinstance(result, list) or len(result) != n_queries:
        raise RetrievalError(f"expected a result list for each of {n_queries} queries, got {body!r:.200}")
    out = []
    for i, hits in enumerate(result):
        if not isinstance(hits, list):
            raise RetrievalError(f"result[{i}] must be a list, got {hits!r:.200}")
        out.append([parse_document(item, f"result[{i}][{j}]") for j, item in enumerate(hits)])
    return out


def _error(data: bytes) -> tuple[str, bool]:
    """(the server's {"error": ...} message, else its raw body; whether the error names a query)."""
    text = data.decode(errors="replace")
    try:
        body = json.loads(text)
        return str(body["error"]), isinstance(body.get("query"), int)
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return text[:500], False


def _retry_after(response: http.client.HTTPResponse) -> float:
    """The response's Retry-After in seconds (its delay-seconds form; 0 when absent or a date)."""
    value = (response.getheader("Retry-After") or "").strip()
    return min(float(value), MAX_RETRY_AFTER_S) if value.isascii() and value.isdigit() else 0.0


def split_urls(url: str) -> list[str]:
    """`config.retrieval.url` -> each replica's /retrieve url (comma-separated; "/retrieve" added where
    absent)."""
    urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
    return [u if u.endswith("/retrieve") else u + "/retrieve" for u in urls]


def contiguous_shards(n: int, parts: int) -> list[range]:
    """`range(n)` cut into at most `parts` contiguous ranges whose sizes differ by at most one (non-empty ones
    when n > 0)."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


class _Replica:
    """One server: where its /retrieve and /health are, whether its /health has been checked, and its
    circuit breaker (failures in a row; set aside until `retry_at`, a `time.monotonic()` instant)."""

    def __init__(self, url: str):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"RemoteRetriever needs an http://HOST[:PORT] url, got {url!r}")
        self.url, self.host, self.port, self.path = url, parts.hostname, parts.port, parts.path
        self.origin = f"http://{parts.netloc}"
        self.health_path = parts.path.removesuffix("/retrieve") + "/health"
        self.checked = False
        self.lock = threading.Lock()
        self.failures = 0
        self.retry_at = 0.0

    def failed(self, cooldown_s: float) -> None:
        """Sets the replica aside: `cooldown_s` doubled per failure in a row, at most MAX_COOLDOWN_S."""
        self.failures += 1
        self.retry_at = time.monotonic() + min(cooldown_s * 2 ** (self.failures - 1), MAX_COOLDOWN_S)

    def succeeded(self) -> None:
        self.failures, self.retry_at = 0, 0.0


class RemoteRetriever:
    """Batched search over HTTP at `config.url`, one server or replicas (see the module docstring for
    replicas, retries and errors). Requests carry at most `config.batch_size` queries and `config.max_hits`
    hits; `config.timeout_s` bounds each attempt as a whole; a failing replica is set aside for `cooldown_s`
    and more (module docstring)."""

    def __init__(self, config: RetrievalConfig, backoff_s: float = 0.5, cooldown_s: float = 5.0):
        urls = split_urls(config.url)
        if not urls:
            raise ValueError(f"RemoteRetriever needs an http://HOST[:PORT] url, got {config.url!r}")
        self.replicas = [_Replica(url) for url in urls]
        self.url = ",".join(urls)
        self.timeout = config.timeout_s
        self.retries = config.retries
        self.batch_size = config.batch_size
        self.max_hits = config.max_hits
        self.fingerprint = config.index_fingerprint
        self.backoff_s = backoff_s
        self.cooldown_s = cooldown_s

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        queries = list(queries)
        if not queries:
            return []
        shards = contiguous_shards(len(queries), len(self.replicas))
        if len(shards) == 1:
            return self._search_shard(queries, k, 0)
        with concurrent.futures.ThreadPoolExecutor(len(shards), "retrieval-client") as pool:
            futures = [pool.submit(self._search_shard, queries[shard.start:shard.stop], k, i)
                       for i, shard in enumerate(shards)]
            return [hits for future in futures for hits in future.result()]

    def _search_shard(self, queries: list[str], k: int, first: int) -> list[list[Hit]]:
        """`queries` on replica `first`, or on the next ones in turn while each is unavailable: those not set
        aside first, then those set aside, soonest due first (see the module docstring)."""
        order = self.replicas[first:] + self.replicas[:first]
        now = time.monotonic()
        order = ([r for r in order if r.retry_at <= now]
                 + sorted((r for r in order if r.retry_at > now), key=lambda r: r.retry_at))
        errors = []
        for i, replica in enumerate(order):
            try:
                hits = self._search_on(replica, queries, k, self.retries if i == len(order) - 1 else 0)
            except RetrievalUnavailable as e:
                replica.failed(self.cooldown_s)
                errors.append(str(e))
                continue
            replica.succeeded()
            return hits
        raise RetrievalUnavailable("; ".join(errors))

    def _search_on(self, replica: _Replica, queries: list[str], k: int, retries: int) -> list[list[Hit]]:
        self._check(replica, retries)
        size = max(1, min(self.batch_size, self.max_hits // max(k, 1)))
        out: list[list[Hit]] = []
        for start in range(0, len(queries), size):
            out.extend(self._post(replica, queries[start:start + size], k, retries))
        return out

    def _post(self, replica: _Replica, queries: list[str], k: int, retries: int) -> list[list[Hit]]:
        """One request's hits; refused as too large (413), it is split in halves (one query: raises)."""
        payload = json.dumps({"queries": queries, "topk": k, "return_scores": True}).encode()
        try:
            return parse_response(self._retrying(replica, "POST", replica.path, payload, retries),
                                  len(queries))
        except _TooLarge:
            if len(queries) == 1:
                raise
        half = len(queries) // 2
        return (self._post(replica, queries[:half], k, retries)
                + self._post(replica, queries[half:], k, retries))

    def _check(self, replica: _Replica, retries: int) -> None:
        """Refuses a replica whose /health names another index than `config.index_fingerprint` (once each)."""
        if not self.fingerprint or replica.checked:
            return
        with replica.lock:
            if replica.checked:
                return
            health = self._retrying(replica, "GET", replica.health_path, None, retries)
            served = health.get("fingerprint") if isinstance(health, dict) else None
            if served != self.fingerprint:
                index = f"index {health.get('index')} ({health.get('kind')}) of fingerprint {served}" \
                    if served else "an index without a fingerprint (not a searchrl server?)"
                raise RetrievalError(f"{replica.url}: the server serves {index}, not the index of "
                                     f"fingerprint {self.fingerprint} that config.retrieval.index_fingerprint"
                                     f" names: start a server on that index or point config.retrieval.url at"
                                     f" one")
            replica.checked = True

    def _retrying(self, replica: _Replica, method: str, path: str, payload: bytes | None, retries: int
                  ) -> Any:
        """`_attempt`, retried `retries` times on transient failures; `RetrievalUnavailable` once the retries
        are used up."""
        for attempt in range(retries + 1):
            try:
                return self._attempt(replica, method, path, payload)
            except _Transient as e:
                last = e
            if attempt < retries:
                time.sleep(max(self.backoff_s * 2 ** attempt, last.wait_s))
        raise RetrievalUnavailable(f"{replica.url}: failed after {retries + 1} attempts: {last}")

    def _attempt(self, replica: _Replica, method: str, path: str, payload: bytes | None) -> Any:
        """One request, over within `timeout`: the decoded JSON of a 200."""
        connection = Connection(replica.host, replica.port, time.monotonic() + self.timeout)
        try:
            connection.request(method, path, payload,
                               {"Content-Type": "application/json", "Connection": "close"})
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out, cut short, garbled
            raise _Transient(f"{type(e).__name__}: {e}") from None
        finally:
            connection.close()
        message, names_query = _error(data) if response.status != 200 else ("", False)
        if response.status in RETRIED_STATUSES or response.status >= 500:
            raise _Transient(f"HTTP {response.status}: {message}", _retry_after(response))
        if response.status != 200:
            error = _TooLarge if response.status == 413 else QueryRefused if names_query else RetrievalError
            raise error(f"{replica.origin}{path}: HTTP {response.status}: {message}")
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep
            raise _Transient(f"response is not JSON ({e}): {data[:100]!r}") from None
