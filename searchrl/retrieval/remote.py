"""A Retriever that calls a `/retrieve` server over plain HTTP: searchrl's own (`searchrl.serving.serve`) or
Search-R1's.

What is retried (`retries` times, with exponential backoff, or the server's Retry-After when longer, up to
MAX_RETRY_AFTER_S): connection errors, timeouts, broken or cut-short responses, bodies that are not UTF-8
JSON, 408, 429 and 5xx. When the retries are used up the search raises `RetrievalUnavailable`. What is not
retried: any other 4xx (the request itself is wrong) and a JSON answer of the wrong shape or with a
non-finite score; they raise `RetrievalError`. Each attempt must be over (connect, send, the whole response)
within `timeout` seconds, however slowly the server trickles bytes.
"""
from __future__ import annotations

import http.client
import json
import math
import time
import urllib.parse
from typing import Any, Sequence

from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.corpus import split_contents
from searchrl.retrieval.deadline import Connection
from searchrl.retrieval.types import Hit, RetrievalError, RetrievalUnavailable

MAX_RETRY_AFTER_S = 60.0  # the longest Retry-After honoured
RETRIED_STATUSES = (408, 429)  # and every 5xx


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


def _error_message(data: bytes) -> str:
    """The server's {"error": ...} message, else its raw body."""
    text = data.decode(errors="replace")
    try:
        return str(json.loads(text)["error"])
    except (ValueError, RecursionError, KeyError, TypeError):
        return text[:500]


def _retry_after(response: http.client.HTTPResponse) -> float:
    """The response's Retry-After in seconds (its delay-seconds form; 0 when absent or a date)."""
    value = (response.getheader("Retry-After") or "").strip()
    return min(float(value), MAX_RETRY_AFTER_S) if value.isascii() and value.isdigit() else 0.0


class RemoteRetriever:
    """Batched search over HTTP at `config.url` (see the module docstring for retries and errors). Batches
    over `config.batch_size` are split; `config.timeout_s` bounds each attempt as a whole."""

    def __init__(self, config: RetrievalConfig, backoff_s: float = 0.5):
        url = config.url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"RemoteRetriever needs an http://HOST[:PORT] url, got {url!r}")
        self._host, self._port, self._path = parts.hostname, parts.port, parts.path
        self.timeout = config.timeout_s
        self.retries = config.retries
        self.batch_size = config.batch_size
        self.backoff_s = backoff_s

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        out: list[list[Hit]] = []
        for start in range(0, len(queries), self.batch_size):
            out.extend(self._post(list(queries[start:start + self.batch_size]), k))
        return out

    def _post(self, queries: list[str], k: int) -> list[list[Hit]]:
        payload = json.dumps({"queries": queries, "topk": k, "return_scores": True}).encode()
        for attempt in range(self.retries + 1):
            try:
                return parse_response(self._attempt(payload), len(queries))
            except _Transient as e:
                last = e
            if attempt < self.retries:
                time.sleep(max(self.backoff_s * 2 ** attempt, last.wait_s))
        raise RetrievalUnavailable(f"{self.url}: failed after {self.retries + 1} attempts: {last}")

    def _attempt(self, payload: bytes) -> Any:
        """One POST, over within `timeout`: the decoded JSON of a 200."""
        connection = Connection(self._host, self._port, time.monotonic() + self.timeout)
        try:
            connection.request("POST", self._path, payload,
                               {"Content-Type": "application/json", "Connection": "close"})
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out, cut short, garbled
            raise _Transient(f"{type(e).__name__}: {e}") from None
        finally:
            connection.close()
        if response.status in RETRIED_STATUSES or response.status >= 500:
            raise _Transient(f"HTTP {response.status}: {_error_message(data)}", _retry_after(response))
        if response.status != 200:
            raise RetrievalError(f"{self.url}: HTTP {response.status}: {_error_message(data)}")
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep
            raise _Transient(f"response is not JSON ({e}): {data[:100]!r}") from None
