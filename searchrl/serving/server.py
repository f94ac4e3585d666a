"""A Search-R1-compatible retrieval server (stdlib only) batching concurrent requests into one search call.

  POST /retrieve {"queries": [str, ...], "topk": int, "return_scores": bool}
    -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}   (return_scores true)
    -> {"result": [[{"id", "contents"}, ...], ...]}                                  (return_scores false)
  GET /health -> {"status": "ok", "requests": int, "search_calls": int}

Bad requests get a 4xx with {"error": "..."} (an unknown path 404, another method 405 with Allow) and the
connection is closed after it; a failing search gets a 500; the server keeps serving.

Bounds (`Limits`, defaults in brackets), so that no client can hold the server's threads, memory or CPU:
  - a request carries at most `max_queries` [1024] queries of at most `max_query_chars` [4096] characters,
    topk at most `max_topk` [1000] and queries x topk at most `max_hits` [100,000] hits, else 4xx;
  - its body is at most `max_body_bytes` [8 MiB], else 413; its response at most `max_response_bytes`
    [64 MiB], else 413 (ask for fewer hits);
  - a request must arrive in full within `timeout_s` [30 s] of the server waiting for it (an idle keep-alive
    connection too), and its response must be sent within `timeout_s`: else the connection is closed;
  - at most `max_connections` [128] connections are served at once; more get 503 with Retry-After: 1;
  - after a refusal the server discards what the client still sends, for at most `linger_s` [2 s], so that
    closing does not reset the connection before the client has read the refusal;
  - the batcher searches about `max_batch` [256] queries at once, gathered for at most `max_wait_ms` [2 ms],
    and never more than `max_hits` hits (queries x the batch's largest topk): a request that would exceed
    them waits for the next batch.
"""
from __future__ import annotations

import dataclasses
import json
import queue
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence

from searchrl.retrieval.remote import DeadlineSocket
from searchrl.retrieval.types import Hit, Retriever

ROUTES = {"/retrieve": "POST", "/health": "GET"}
_BUSY_BODY = b'{"error": "too many connections; retry later"}'
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how long and how many connections are served (module docstring)."""

    max_queries: int = 1024
    max_query_chars: int = 4096
    max_topk: int = 1000
    default_topk: int = 3  # Search-R1's server default, used when "topk" is absent or null
    max_hits: int = 100_000
    max_body_bytes: int = 8 << 20
    max_response_bytes: int = 64 << 20
    timeout_s: float = 30.0
    max_connections: int = 128
    linger_s: float = 2.0
    max_batch: int = 256  # queries gathered into one search call
    max_wait_ms: float = 2.0  # how long a batch waits for more requests


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
        if not _encodable(query):
            raise RequestError(f'"queries"[{i}] is not valid text (a \\u escape of a lone surrogate)')
    topk = body.get("topk")
    if topk is None:
        topk = limits.default_topk
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= limits.max_topk:
        raise RequestError(f'"topk" must be an integer in [1, {limits.max_topk}], got {topk!r}')
    if len(queries) * topk > limits.max_hits:
        raise RequestError(f'{len(queries)} queries x "topk" {topk} = {len(queries) * topk} hits, more than '
                           f'{limits.max_hits}', HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
    return_scores = body.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(f'"return_scores" must be a boolean, got {return_scores!r}')
    return queries, topk, return_scores


def _encodable(text: str) -> bool:
    """Whether `text` is UTF-8 encodable: JSON's \\u escapes can decode to lone surrogates, which
    tokenizers refuse."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    the largest k asked and gives each request its own top-k; when that search fails, each request is searched
    alone, so only a failing one gets the error. A request that would take the batch over `max_hits` hits
    (queries x largest k) is held back for the next batch. The three bounds are `limits`'."""

    def __init__(self, retriever: Retriever, limits: Limits):
        self.retriever = retriever
        self.max_batch = limits.max_batch
        self.max_wait_s = limits.max_wait_ms / 1000
        self.max_hits = limits.max_hits
        self.search_calls = 0
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._held: list[_Pending | None] = []  # taken from the queue, for the next batch (None: stop)
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
        while (first := self._held.pop() if self._held else self._queue.get()) is not None:
            self._run(self._gather(first))

    def _gather(self, first: _Pending) -> list[_Pending]:
        """`first` and what arrives within `max_wait_s` while the batch has room; holds back the item that
        does not fit (or the stop signal)."""
        batch, deadline = [first], time.monotonic() + self.max_wait_s
        while sum(len(p.queries) for p in batch) < self.max_batch:
            try:
                item = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                break
            if item is None or self._hits(batch + [item]) > self.max_hits:
                self._held.append(item)
                break
            batch.append(item)
        return batch

    @staticmethod
    def _hits(batch: list[_Pending]) -> int:
        return sum(len(p.queries) for p in batch) * max(p.k for p in batch)

    def _run(self, batch: list[_Pending]) -> None:
        queries = [q for p in batch for q in p.queries]
        try:
            results = self.retriever.search(queries, max(p.k for p in batch))
            self.search_calls += 1
            if len(results) != len(queries):
                raise RuntimeError(f"retriever returned {len(results)} result lists for "
                                   f"{len(queries)} queries")
        except Exception as e:  # the server stays up; one request's failure must not fail the others'
            if len(batch) > 1:
                for p in batch:
                    self._run([p])
                return
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
    server: RetrievalServer
    request: DeadlineSocket
    protocol_version = "HTTP/1.1"

    def handle_one_request(self) -> None:
        """One request, which must arrive in full within `timeout_s`."""
        self.request.deadline = time.monotonic() + self.server.limits.timeout_s
        super().handle_one_request()

    def __getattr__(self, name: str) -> Callable[[], None]:
        """`do_<METHOD>` for every method: routing answers 404 / 405."""
        if name.startswith("do_"):
            return self._route
        raise AttributeError(name)

    def _route(self) -> None:
        method = ROUTES.get(self.path)
        if method is None:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {self.command} {self.path}"}, close=True)
        elif method != self.command:
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{self.path} takes {method}, not "
                                                                f"{self.command}"}, close=True, Allow=method)
        elif method == "GET":
            self._send(HTTPStatus.OK, {"status": "ok", "requests": self.server.requests,
                                       "search_calls": self.server.batcher.search_calls})
        else:
            self._retrieve()

    def _retrieve(self) -> None:
        limits = self.server.limits
        try:
            queries, topk, return_scores = parse_request(self._read_json(), limits)
        except RequestError as e:
            return self._send(e.status, {"error": str(e)}, close=True)
        self.server.count_request()
        try:
            results = self.server.batcher.search(queries, topk)
            data = json.dumps(format_results(results, return_scores), allow_nan=False).encode()
        except Exception as e:
            return self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"search failed: {e}"})
        if len(data) > limits.max_response_bytes:
            return self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {
                "error": f"the response is {len(data)} bytes, more than {limits.max_response_bytes}: "
                         f'ask for fewer queries or a smaller "topk"'})
        self._send_bytes(HTTPStatus.OK, data)

    def _read_json(self) -> Any:
        length = self.headers.get("Content-Length")
        if length is None:
            raise RequestError("a Content-Length header is required", HTTPStatus.LENGTH_REQUIRED)
        if not (length.isascii() and length.isdigit()):
            raise RequestError(f"Content-Length must be decimal digits, got {length!r:.40}")
        if len(length) > 18 or int(length) > self.server.limits.max_body_bytes:  # int() refuses 4,300 digits
            raise RequestError(f"body of {length:.20} bytes exceeds {self.server.limits.max_body_bytes}",
                               HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        try:
            return json.loads(self.rfile.read(int(length)))
        except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, huge numbers, nested too deep
            raise RequestError(f"invalid JSON: {e}") from None

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, too many headers, ...) as JSON too."""
        self._send(code, {"error": message or HTTPStatus(code).phrase}, close=True)

    def _send(self, status: int, body: dict[str, Any], close: bool = False, **headers: str) -> None:
        self._send_bytes(status, json.dumps(body).encode(), close, **headers)

    def _send_bytes(self, status: int, data: bytes, close: bool = False, **headers: str) -> None:
        """Sends a JSON response within `timeout_s`; `close` closes the connection after it (lingering)."""
        self.request.deadline = time.monotonic() + self.server.limits.timeout_s
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                            **headers}.items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        if close:
            self._linger()

    def _linger(self) -> None:
        """Discards what the client still sends, until it closes or `linger_s` passes."""
        self.request.deadline = time.monotonic() + self.server.limits.linger_s
        try:
            self.request.shutdown(socket.SHUT_WR)
            while self.rfile.read1(1 << 16):
                pass
        except OSError:  # timed out, or the client reset the connection
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.verbose:
            super().log_message(format, *args)


class RetrievalServer(ThreadingHTTPServer):
    """`RetrievalServer(retriever, "127.0.0.1", 0).start()` serves in a background thread (0: any free port);
    `.url` is where."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, retriever: Retriever, host: str, port: int, limits: Limits = Limits(),
                 verbose: bool = False):
        super().__init__((host, port), _Handler)
        self.batcher = Batcher(retriever, limits)
        self.limits = limits
        self.verbose = verbose
        self.requests = 0
        self._requests_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._thread: threading.Thread | None = None

    def count_request(self) -> None:
        with self._requests_lock:
            self.requests += 1

    def get_request(self) -> tuple[DeadlineSocket, Any]:
        sock, address = super().get_request()
        return DeadlineSocket.adopt(sock), address

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serves the connection on a thread of its own if fewer than `max_connections` are; else a 503."""
        if not self._slots.acquire(blocking=False):
            return self._refuse(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, request: DeadlineSocket) -> None:
        """A 503 without blocking the accepting thread: what the client sent already is read and dropped so
        that closing does not reset the connection."""
        request.setblocking(False)
        try:
            request.send(BUSY)
            request.shutdown(socket.SHUT_WR)
            for _ in range(16):  # at most 1 MiB, without waiting
                if not request.recv(1 << 16):
                    break
        except OSError:  # nothing more to read now (or the client is gone)
            pass
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-response is logged in one line (verbose only), anything else in full."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            return super().handle_error(request, client_address)
        if self.verbose:
            print(f"{client_address}: {type(error).__name__}: {error}", file=sys.stderr)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RetrievalServer:
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

    def __enter__(self) -> RetrievalServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
