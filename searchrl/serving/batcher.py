"""The retrieval server's search thread: one `Retriever.search` call at a time, shared fairly between the
requests waiting for it.

A request of any size is cut into slices of bounded work (queries, query characters, hits), and each search
call takes the next slice of every waiting request in turn, so a small request waits for the call under way
and at most one slice of each other waiting request, never for the whole of a large one. Batching many small
requests into one call keeps the retriever's vectorised search busy; slicing keeps one client's large request
from stalling the others' (round robin over requests is what a fair-queueing scheduler does over flows).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Callable, Protocol, Sequence

from searchrl.retrieval.types import Hit, Retriever

Collect = Callable[[list[list[Hit]]], list[Any]]  # a slice's hits -> what the request keeps of each query


@dataclasses.dataclass(eq=False)
class _Request:
    """A submitted request: its slices not yet searched, what `collect` kept of each query, its future."""

    queries: list[str]
    k: int
    collect: Collect
    slices: collections.deque[range]
    kept: list[Any]
    left: int  # slices not yet collected
    future: concurrent.futures.Future[list[Any]] = dataclasses.field(
        default_factory=concurrent.futures.Future)


class BatchLimits(Protocol):
    """The bounds of one search call (`searchrl.serving.server.Limits` has them)."""

    max_batch: int  # queries
    max_batch_chars: int  # query characters
    max_hits: int  # queries x the call's largest k
    max_wait_ms: float  # how long a call waits for more requests while it has room


class Batcher:
    """One background thread searching every waiting request, shared fairly (module docstring): requests are
    cut into slices (`slices`), and each `retriever.search` call takes the next slice of each waiting request
    in turn, round robin, while the call stays within `max_batch` queries, `max_batch_chars` characters and
    `max_hits` hits (queries x the call's largest k). It waits up to `max_wait_ms` for more requests while
    there is room. When a call fails, each slice is searched alone, so only a failing request gets the
    error (and its other slices are dropped). Each slice's hits go through its request's `collect` at once,
    which may refuse the request (an exception) before the rest of it is searched."""

    def __init__(self, retriever: Retriever, limits: BatchLimits):
        self.retriever = retriever
        self.max_batch = limits.max_batch
        self.max_chars = limits.max_batch_chars
        self.max_wait_s = limits.max_wait_ms / 1000
        self.max_hits = limits.max_hits
        self.search_calls = 0
        self._waiting: collections.deque[_Request] = collections.deque()  # round-robin order
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="retrieval-batcher", daemon=True)
        self._thread.start()

    def submit(self, queries: list[str], k: int, collect: Collect | None = None
               ) -> concurrent.futures.Future[list[Any]]:
        """What `collect` (default: keep the hits) kept of each query's top-k hits, once all are searched."""
        slices = collections.deque(self.slices(queries, k))
        request = _Request(queries, k, collect or (lambda hits: hits), slices, [None] * len(queries),
                           len(slices))
        with self._changed:
            self._waiting.append(request)
            self._changed.notify()
        return request.future

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Blocks until every slice of these queries has been searched."""
        return self.submit(queries, k).result()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join()

    def slices(self, queries: Sequence[str], k: int) -> list[range]:
        """`queries` cut into contiguous slices within the bounds of one search call (a query longer than
        `max_batch_chars` is a slice alone)."""
        most = max(1, min(self.max_batch, self.max_hits // max(k, 1)))
        out, start, chars = [], 0, 0
        for i, query in enumerate(queries):
            if i > start and (i - start >= most or chars + len(query) > self.max_chars):
                out.append(range(start, i))
                start, chars = i, 0
            chars += len(query)
        return out + [range(start, len(queries))] if queries else out

    def _loop(self) -> None:
        while (batch := self._gather()) is not None:
            if batch:  # empty when every waiting request had failed or been cancelled
                self._run(batch)

    def _gather(self) -> list[tuple[_Request, range]] | None:
        """The next search call's slices (None once closed): waits for a request, then up to `max_wait_s`
        for more while the waiting slices would not fill a call."""
        with self._changed:
            while not self._waiting:
                if self._closed:
                    return None
                self._changed.wait()
            deadline = time.monotonic() + self.max_wait_s
            while (not self._closed and self._waiting_queries() < self.max_batch
                   and (left := deadline - time.monotonic()) > 0):
                self._changed.wait(left)
            return self._take()

    def _waiting_queries(self) -> int:
        return sum(len(span) for request in self._waiting for span in request.slices)

    def _take(self) -> list[tuple[_Request, range]]:
        """Slices in round-robin order, one per request per round, while they fit one call; the request after
        the last one served leads the next call. Requests cancelled or failed are dropped."""
        batch: list[tuple[_Request, range]] = []
        queries = chars = k = 0
        while self._waiting:
            request = self._waiting[0]
            if request.future.done() or not request.slices:
                self._waiting.popleft()
                continue
            span = request.slices[0]
            size, length = len(span), sum(len(request.queries[i]) for i in span)
            if batch and (queries + size > self.max_batch or chars + length > self.max_chars
                          or (queries + size) * max(k, request.k) > self.max_hits):
                break
            if not request.future.running() and not request.future.set_running_or_notify_cancel():
                self._waiting.popleft()  # cancelled before its first slice
                continue
            batch.append((request, request.slices.popleft()))
            queries, chars, k = queries + size, chars + length, max(k, request.k)
            self._waiting.rotate(-1)
        return batch

    def _run(self, batch: list[tuple[_Request, range]]) -> None:
        queries = [request.queries[i] for request, span in batch for i in span]
        try:
            results = self.retriever.search(queries, max(request.k for request, _ in batch))
            self.search_calls += 1
            if len(results) != len(queries):
                raise RuntimeError(f"retriever returned {len(results)} result lists for "
                                   f"{len(queries)} queries")
        except Exception as e:  # the server stays up; one request's failure must not fail the others'
            if len(batch) > 1:
                for item in batch:
                    self._run([item])
                return
            return self._fail(batch[0][0], e)
        start = 0
        for request, span in batch:
            hits = [row[:request.k] for row in results[start:start + len(span)]]
            start += len(span)
            if request.future.done():
                continue
            try:
                request.kept[span.start:span.stop] = request.collect(hits)
            except Exception as e:
                self._fail(request, e)
                continue
            request.left -= 1
            if not request.left:
                request.future.set_result(request.kept)

    def _fail(self, request: _Request, error: Exception) -> None:
        """Fails `request`; its slices not yet searched are dropped by `_take`."""
        request.slices.clear()
        request.future.set_exception(error)
