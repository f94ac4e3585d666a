"""A Retriever that calls a `/retrieve` server: searchrl's own (`searchrl.retrieval.serve`) or Search-R1's."""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

from searchrl.retrieval.corpus import split_contents
from searchrl.retrieval.types import Hit


class RetrievalError(RuntimeError):
    """A remote search that failed for good (a 4xx, a malformed response, or retries used up)."""


def parse_document(item: Any, where: str) -> Hit:
    """One result entry: {"document": doc, "score": s} or a bare doc; doc has "contents" (FlashRAG) or
    "title"/"text", and usually an "id"."""
    score = 0.0
    if isinstance(item, dict) and isinstance(item.get("document"), dict):
        score = item.get("score", 0.0)
        item = item["document"]
    if not isinstance(item, dict) or not isinstance(score, (int, float)):
        raise RetrievalError(f"{where}: expected a document object (and a numeric score), got {item!r:.200}")
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


def _error_message(error: urllib.error.HTTPError) -> str:
    """The server's {"error": ...} message, else its raw body."""
    text = error.read().decode(errors="replace")
    try:
        return str(json.loads(text)["error"])
    except (json.JSONDecodeError, KeyError, TypeError):
        return text[:500]


class RemoteRetriever:
    """Batched search over HTTP. Connection errors, timeouts and 5xx are retried `retries` times with
    exponential backoff; 4xx are not (the request itself is wrong). Batches over `batch_size` are split."""

    def __init__(self, url: str, timeout: float = 30.0, retries: int = 3, batch_size: int = 256,
                 backoff_s: float = 0.5):
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.timeout = timeout
        self.retries = retries
        self.batch_size = batch_size
        self.backoff_s = backoff_s

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        out: list[list[Hit]] = []
        for start in range(0, len(queries), self.batch_size):
            out.extend(self._post(list(queries[start:start + self.batch_size]), k))
        return out

    def _post(self, queries: list[str], k: int) -> list[list[Hit]]:
        payload = json.dumps({"queries": queries, "topk": k, "return_scores": True}).encode()
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=payload,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = json.loads(response.read())
            except urllib.error.HTTPError as e:
                if e.code < 500:
                    raise RetrievalError(f"{self.url}: HTTP {e.code}: {_error_message(e)}") from None
                last = e
            except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
                last = e
            except json.JSONDecodeError as e:
                raise RetrievalError(f"{self.url}: response is not JSON ({e})") from None
            else:
                return parse_response(body, len(queries))
        raise RetrievalError(f"{self.url}: failed after {self.retries + 1} attempts: {last}")
