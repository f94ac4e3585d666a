"""A Search-R1-compatible retrieval server (stdlib only) batching concurrent requests into one search call.

  POST /retrieve {"queries": [str, ...], "topk": int, "return_scores": bool}
    -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}   (return_scores true)
    -> {"result": [[{"id", "contents"}, ...], ...]}                                  (return_scores false)
  GET /health -> {"status": "ok", "requests": int, "search_calls": int}

Bad requests get a 4xx with {"error": "..."}; a failing search gets a 500; the server keeps serving.
"""
from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

from searchrl.retrieval.types import Hit, Retriever


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask for."""

    max_queries: int = 1024
    max_query_chars: int = 4096
    max_topk: int = 1000
    default_topk: int = 3  # Search-R1's server default, used when "topk" is absent or null
    max_body_bytes: int = 8 << 20


class RequestError(ValueError):
    """A request the server refuses, with its HTTP status."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


def parse_request(body: Any, limits: Limits) -> tuple[list[str], int, bool]:
    """A decoded /retrieve body -> (queries, topk, return_scores); RequestError names the offending field."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    queries = body.get("queries")
    if not isinstance(queries, list):
        raise RequestError('"queries" must be a list of strings')
    if not queries:
        raise RequestError('"queries" is empty')
    if len(queries) > limits.max_queries:
        raise RequestError(f'"queries" has {len(queries)} entries, more than {limits.max_queries}',
                           HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise RequestError(f'"queries"[{i}] must be a string, got {type(query).__name__}')
        if not query.strip():
            raise RequestError(f'"queries"[{i}] is empty')
        if len(query) > limits.max_query_chars:
            raise RequestError(f'"queries"[{i}] has {len(query)} characters, '
                               f'more than {limits.max_query_chars}')
    topk = body.get("topk")
    if topk is None:
        topk = limits.default_topk
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= limits.max_topk:
        raise RequestError(f'"topk" must be an integer in [1, {limits.max_topk}], got {topk!r}')
    return_scores = body.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(f'"return_scores" must be a boolean, got {return_scores!r}')
    return queries, topk, return_scores


def format_results(results: Sequence[Sequence[Hit]], return_scores: bool) -> dict[str, Any]:
    """Search-R1's response body: documents are {"id", "contents"} (FlashRAG rows)."""
    def doc(hit: Hit) -> dict[str, str]:
        return {"id": hit.id, "contents": hit.contents}
    if return_scores:
        return {"result": [[{"document": doc(h), "score": h.score} for h in hits] for hits in results]}
    return {"result": [[doc(h) for h in hits] for hits in results]}


@dataclasses.dataclass
class _Pending:
    queries: list[str]
    k: int
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: list[list[Hit]] | None = None
    error: BaseException | None = None


class Batcher:
    """One background thread serving all pending requests with one `retriever.search` call: it takes what is
    queued, waits up to `max_wait_s` for more while the batch is under `max_batch` queries, then searches with
    the largest k asked and gives each request its own top-k."""

    def __init__(self, retriever: Retriever, max_batch: int = 256, max_wait_s: float = 0.002):
        self.retriever = retriever
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.search_calls = 0
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="retrieval-batcher", daemon=True)
        self._thread.start()

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Blocks until the batch holding these queries has been searched."""
        pending = _Pending(queries, k)
        self._queue.put(pending)
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while (first := self._queue.get()) is not None:
            batch, size = [first], len(first.queries)
            deadline = time.monotonic() + self.max_wait_s
            stop = False
            while size < self.max_batch:
                try:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
                size += len(item.queries)
            self._run(batch)
            if stop:
                return

    def _run(self, batch: list[_Pending]) -> None:
        queries = [q for p in batch for q in p.queries]
        try:
            results = self.retriever.search(queries, max(p.k for p in batch))
            self.search_calls += 1
            if len(results) != len(queries):
                raise RuntimeError(f"retriever returned {len(results)} result lists for "
                                   f"{len(queries)} queries")
        except Exception as e:  # every request of the batch gets the error; the server stays up
            for p in batch:
                p.error = e
                p.done.set()
            return
        start = 0
        for p in batch:
            p.result = [hits[:p.k] for hits in results[start:start + len(p.queries)]]
            start += len(p.queries)
            p.done.set()


class _Handler(BaseHTTPRequestHandler):
    server: "RetrievalServer"
    protocol_version = "HTTP/1.1"

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path != "/health":
            return self._send(HTTPStatus.NOT_FOUND, {"error": f"no route GET {self.path}"})
        self._send(HTTPStatus.OK, {"status": "ok", "requests": self.server.requests,
                                   "search_calls": self.server.batcher.search_calls})

    def do_POST(self) -> None:  # noqa: N802
        try:
            if self.path != "/retrieve":
                raise RequestError(f"no route POST {self.path}", HTTPStatus.NOT_FOUND)
            queries, topk, return_scores = parse_request(self._read_json(), self.server.limits)
        except RequestError as e:
            return self._send(e.status, {"error": str(e)})
        self.server.count_request()
        try:
            results = self.server.batcher.search(queries, topk)
        except Exception as e:
            return self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"search failed: {e}"})
        self._send(HTTPStatus.OK, format_results(results, return_scores))

    def _read_json(self) -> Any:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise RequestError("a Content-Length header is required", HTTPStatus.LENGTH_REQUIRED)
        if int(length) > self.server.limits.max_body_bytes:
            self.close_connection = True  # the body is left unread
            raise RequestError(f"body of {length} bytes exceeds {self.server.limits.max_body_bytes}",
                               HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        try:
            return json.loads(self.rfile.read(int(length)))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"invalid JSON: {e}") from None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.verbose:
            super().log_message(format, *args)


class RetrievalServer(ThreadingHTTPServer):
    """`RetrievalServer(retriever, port=0).start()` serves in a background thread; `.url` is where."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 256,
                 max_wait_ms: float = 2.0, limits: Limits = Limits(), verbose: bool = False):
        super().__init__((host, port), _Handler)
        self.batcher = Batcher(retriever, max_batch=max_batch, max_wait_s=max_wait_ms / 1000)
        self.limits = limits
        self.verbose = verbose
        self.requests = 0
        self._requests_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def count_request(self) -> None:
        with self._requests_lock:
            self.requests += 1

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "RetrievalServer":
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="retrieval-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stops serving (if started in the background), closes the socket and the batcher."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
        self.server_close()
        self.batcher.close()

    def __enter__(self) -> "RetrievalServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
