"""Recorded retrieval: every search of a run or an evaluation written to a JSONL record, and replayed from it.

Search engines drift (PubMed and ClinicalTrials.gov add, retract and re-rank records), so a run cannot be
re-evaluated on the results it trained on unless they were kept. `config.retrieval.record=PATH` appends one
line per searched query to PATH:

    {"engine": kind, "params": {...}, "query": q, "k": k, "hits": [{"id", "score", "title", "text"}, ...],
     "time": unix seconds, "source": url or index dir}

(or "error" in place of "hits" for a query the engine refused for its text, alone: `QueryRefused`). "params" are the call's own parameters
(a publication-date window), never credentials. `config.retrieval.replay=PATH` answers every search from such
a record and opens no index and no connection: the same (engine, params, query, k) gets the recorded hits in
the recorded order (a key recorded n times gives its n answers in turn, then the last again), a refusal is
refused again, and a search the record lacks is `MissingRecord`, naming the query. Any retriever kind
(local indexes, the remote `/retrieve` client, the search engines) is recorded and replayed the same way.
A search engine's cache (`config.retrieval.options.cache_path`) only saves requests; a record is what a run
saw, in order.
"""
from __future__ import annotations

import collections
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from searchrl.retrieval.types import Hit, QueryRefused, Retriever, RetrievalUnavailable

Key = tuple[str, str, str, int]  # engine, params as JSON, query, k


class MissingRecord(RetrievalUnavailable):
    """A replayed search that the record does not hold (not a refusal: nothing may stand in for it)."""


def _key(engine: str, params: dict[str, Any], query: str, k: int) -> Key:
    return engine, json.dumps(params, sort_keys=True), query, k


def _hit_json(hit: Hit) -> dict[str, Any]:
    return {"id": hit.id, "score": hit.score, "title": hit.title, "text": hit.text}


class RecordingRetriever:
    """Searches with `inner` and appends each query's outcome to the record at `path` (flushed per call,
    so a run that is killed keeps what it saw)."""

    def __init__(self, inner: Retriever, path: str | os.PathLike, engine: str, source: str = "",
                 params: dict[str, Any] | None = None, _file: Any = None,
                 _lock: threading.Lock | None = None):
        self.inner, self.engine, self.source, self.params = inner, engine, source, dict(params or {})
        if _file is None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = _file or open(path, "a", encoding="utf-8")
        self._lock = _lock or threading.Lock()

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        try:
            results = self.inner.search(queries, k)
        except QueryRefused as e:
            if len(queries) == 1:  # a refusal of this query alone: replayed as one
                self._write([{**self._line(queries[0], k), "error": str(e)}])
            raise
        self._write([{**self._line(q, k), "hits": [_hit_json(h) for h in hits]}
                     for q, hits in zip(queries, results)])
        return results

    def published_between(self, mindate: str, maxdate: str) -> RecordingRetriever:
        """The inner engine's date-restricted search, recorded with the window as its params."""
        window = {**self.params, "mindate": mindate, "maxdate": maxdate}
        return RecordingRetriever(self.inner.published_between(mindate, maxdate), "", self.engine, self.source,
                                  window, self._file, self._lock)

    def close(self) -> None:
        self._file.close()
        getattr(self.inner, "close", lambda: None)()

    def _line(self, query: str, k: int) -> dict[str, Any]:
        return {"engine": self.engine, "params": self.params, "query": query, "k": k, "time": time.time(),
                "source": self.source}

    def _write(self, lines: list[dict[str, Any]]) -> None:
        with self._lock:
            self._file.write("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
            self._file.flush()


def read_record(path: str | os.PathLike) -> dict[Key, list[dict[str, Any]]]:
    """Every recorded outcome by (engine, params, query, k), in the order recorded; errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"retrieval record not found: {path} (config.retrieval.replay); make one "
                                "with config.retrieval.record")
    outcomes: dict[Key, list[dict[str, Any]]] = collections.defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            try:
                line = json.loads(text)
                key = _key(line["engine"], line["params"], line["query"], int(line["k"]))
                outcome = ({"error": str(line["error"])} if "error" in line else
                           {"hits": [Hit(str(h["id"]), float(h["score"]), h["title"], h["text"])
                                     for h in line["hits"]]})
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{number}: not a retrieval record line ({type(e).__name__}: {e})"
                                 ) from None
            outcomes[key].append(outcome)
    return dict(outcomes)


class ReplayRetriever:
    """Answers every search from a record (see the module docstring); never opens a connection."""

    def __init__(self, path: str | os.PathLike, engine: str, params: dict[str, Any] | None = None,
                 _shared: tuple[dict, collections.Counter, threading.Lock] | None = None):
        self.path, self.engine, self.params = str(path), engine, dict(params or {})
        self._outcomes, self._served, self._lock = _shared or (read_record(path), collections.Counter(),
                                                               threading.Lock())

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The recorded hits of each query; a batch holding a recorded refusal is refused whole and uses up
        no answer (as recorded: the batch failed, then each query was searched alone)."""
        keys = [_key(self.engine, self.params, q, k) for q in queries]
        with self._lock:
            outcomes = [self._peek(key) for key in keys]
            refused = next((o["error"] for o in outcomes if "error" in o), None)
            if refused is None:
                self._served.update(keys)
        if refused is not None:
            raise QueryRefused(refused)
        return [list(o["hits"]) for o in outcomes]

    def published_between(self, mindate: str, maxdate: str) -> ReplayRetriever:
        window = {**self.params, "mindate": mindate, "maxdate": maxdate}
        return ReplayRetriever(self.path, self.engine, window, (self._outcomes, self._served, self._lock))

    def _peek(self, key: Key) -> dict[str, Any]:
        """The answer `key` gets next (its n-th recorded outcome on its n-th search, then the last)."""
        recorded = self._outcomes.get(key)
        if not recorded:
            engine, params, query, k = key
            window = f" with {params}" if params != "{}" else ""
            raise MissingRecord(f"{self.path} holds no {engine} search for query {query!r} (k={k}{window}); "
                                "record it with config.retrieval.record")
        return recorded[min(self._served[key], len(recorded) - 1)]
