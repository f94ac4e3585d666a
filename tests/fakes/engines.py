"""A local stand-in for PubMed E-utilities and ClinicalTrials.gov API v2, for tests (stdlib only).

`FakeEngineServer(corpus)` serves, on 127.0.0.1 and a free port, in a background thread:

  GET /esearch.fcgi?db=pubmed&term=..&retstart=..&retmax=..&retmode=json   (E-utilities ESearch)
    -> {"header": {..}, "esearchresult": {"count": "N", "retmax": "..", "retstart": "..", "idlist": [..], ..}}
       an empty term -> {"esearchresult": {"ERROR": "Empty term and query_key - nothing todo"}}
  GET /studies?query.term=..&pageSize=..&pageToken=..                       (ClinicalTrials.gov API v2)
    -> {"studies": [{"protocolSection": {"identificationModule": {"nctId": ..}}}, ..], "nextPageToken": ".."}

so `server.url` is a base URL for both engines. A query matches the documents containing every one of its
words (lowercased; AND/OR/NOT are ignored), ranked by how often those words occur, ties in corpus order.
Scripted `Fault`s (a 429 with Retry-After, a 500, a malformed body, a slow answer) are served first, one per
request; every request is recorded.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import re
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping

ESEARCH_MAX_RETMAX = 10_000  # E-utilities: "up to a maximum of 10,000 records" per response
ESEARCH_MAX_RETSTART = 9_998  # PubMed ESearch refuses a larger retstart (only the first 9,999 records)
CTGOV_MAX_PAGE_SIZE = 1_000  # API v2: a larger pageSize is coerced down to 1,000
_OPERATORS = {"and", "or", "not"}


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scripted answer instead of the normal one. `body` None: the API's usual error body for `status`
    (or, with status 200, the normal answer, after `delay_s`). `trickle_s`: the body is sent a byte at a
    time, this long apart."""

    status: int = 500
    body: bytes | None = None
    retry_after: str | None = None
    delay_s: float = 0.0
    trickle_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Request:
    """One request as the server saw it."""

    path: str
    params: dict[str, str]
    headers: dict[str, str]
    time: float


def words(text: str) -> list[str]:
    """Lowercase alphanumeric words."""
    return re.findall(r"[a-z0-9]+", text.lower())


def rank(corpus: Mapping[str, str], query: str) -> list[str]:
    """Ids of the documents containing every query word, most occurrences first, ties in corpus order. (A
    date range, ESearch's mindate / maxdate, matches every document: the fake corpus has no dates.)"""
    terms = [w for w in words(query) if w not in _OPERATORS]
    if not terms:
        return []
    scored = []
    for position, (doc_id, text) in enumerate(corpus.items()):
        counts = collections.Counter(words(text))
        if all(counts[t] for t in terms):
            scored.append((-sum(counts[t] for t in terms), position, doc_id))
    return [doc_id for *_, doc_id in sorted(scored)]


def esearch_body(ids: list[str], term: str, retstart: int, retmax: int) -> dict[str, Any]:
    """E-utilities ESearch JSON for one page of a ranked id list."""
    page = ids[retstart:retstart + retmax]
    result: dict[str, Any] = {"count": str(len(ids)), "retmax": str(len(page)), "retstart": str(retstart),
                              "idlist": page, "translationset": [], "querytranslation": term}
    if not ids:
        result["warninglist"] = {"phrasesignored": [], "quotedphrasesnotfound": [],
                                 "outputmessages": ["No items found."]}
    return {"header": {"type": "esearch", "version": "0.3"}, "esearchresult": result}


def esearch_error_body(message: str) -> bytes:
    """How ESearch reports a refused query: HTTP 200 with an ERROR field."""
    return json.dumps({"header": {"type": "esearch", "version": "0.3"},
                       "esearchresult": {"ERROR": message}}).encode()


def studies_body(ids: list[str], next_token: str | None) -> dict[str, Any]:
    """ClinicalTrials.gov API v2 /studies JSON for one page (fields=NCTId)."""
    body: dict[str, Any] = {"studies": [{"protocolSection": {"identificationModule": {"nctId": i}}}
                                        for i in ids]}
    if next_token is not None:
        body["nextPageToken"] = next_token
    return body


def _int(params: Mapping[str, str], name: str, default: int) -> int:
    value = params.get(name, "")
    return int(value) if value.isdigit() else default


class _Handler(BaseHTTPRequestHandler):
    server: "FakeEngineServer"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        url = urllib.parse.urlsplit(self.path)
        params = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        fault = self.server.record(Request(url.path, params, dict(self.headers.items()), time.monotonic()))
        if fault is not None and fault.delay_s and self.server.closing.wait(fault.delay_s):
            return
        if fault is not None and (fault.status != HTTPStatus.OK or fault.body is not None):
            return self._send(fault.status, fault.body or self._fault_body(fault.status),
                              fault.retry_after, trickle_s=fault.trickle_s)
        if url.path.endswith("/esearch.fcgi"):
            return self._esearch(params)
        if url.path.endswith("/studies"):
            return self._studies(params)
        self._send(HTTPStatus.NOT_FOUND, f"no route GET {url.path}".encode(), content_type="text/plain")

    def _esearch(self, params: dict[str, str]) -> None:
        term = params.get("term", "")
        if not term.strip():
            return self._send(HTTPStatus.OK, esearch_error_body("Empty term and query_key - nothing todo"))
        retstart = _int(params, "retstart", 0)
        if retstart > ESEARCH_MAX_RETSTART:
            return self._send(HTTPStatus.OK, esearch_error_body(
                "Search Backend failed: Exception:\n'retstart' cannot be larger than 9998. For PubMed, "
                "ESearch can only retrieve the first 9,999 records matching the query."))
        retmax = min(_int(params, "retmax", 20), ESEARCH_MAX_RETMAX)
        body = esearch_body(rank(self.server.corpus, term), term, retstart, retmax)
        self._send(HTTPStatus.OK, json.dumps(body).encode())

    def _studies(self, params: dict[str, str]) -> None:
        query, offset = params.get("query.term", ""), 0
        if "pageToken" in params:
            token = self.server.tokens.get(params["pageToken"])
            if token is None or token[0] != query:
                return self._send(HTTPStatus.BAD_REQUEST, b"invalid pageToken", content_type="text/plain")
            offset = token[1]
        size = min(_int(params, "pageSize", 10) or 10, CTGOV_MAX_PAGE_SIZE)
        ids = rank(self.server.trials, query) if query.strip() else list(self.server.trials)
        end = offset + size
        token = self.server.new_token(query, end) if end < len(ids) else None
        self._send(HTTPStatus.OK, json.dumps(studies_body(ids[offset:end], token)).encode())

    def _fault_body(self, status: int) -> bytes:
        if status == HTTPStatus.TOO_MANY_REQUESTS:
            return json.dumps({"error": "API rate limit exceeded", "count": "11"}).encode()
        return f"<html><body><h1>{status} {HTTPStatus(status).phrase}</h1></body></html>".encode()

    def _send(self, status: int, data: bytes, retry_after: str | None = None,
              content_type: str = "application/json", trickle_s: float = 0.0) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            self.end_headers()
            if not trickle_s:
                return self.wfile.write(data)
            for i in range(len(data)):
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                if self.server.closing.wait(trickle_s):
                    break
        except OSError:  # the client gave up (a timeout test)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class FakeEngineServer(ThreadingHTTPServer):
    """`with FakeEngineServer({"1": "aspirin trial", ...}) as fake:` serves at `fake.url` until the block
    ends; ESearch searches `corpus`, /studies `trials` (default: the same). `fake.inject(Fault(429,
    retry_after="1"), Fault(500))` scripts the next answers; `fake.requests` lists what was asked."""

    daemon_threads = True

    def __init__(self, corpus: Mapping[str, str] | None = None, trials: Mapping[str, str] | None = None,
                 host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), _Handler)
        self.corpus = dict(corpus or {})
        self.trials = self.corpus if trials is None else dict(trials)
        self.requests: list[Request] = []
        self.tokens: dict[str, tuple[str, int]] = {}
        self.closing = threading.Event()
        self._faults: collections.deque[Fault] = collections.deque()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-engine-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def inject(self, *faults: Fault) -> None:
        """Queues faults; each of the next requests gets one, in order, instead of its normal answer."""
        with self._lock:
            self._faults.extend(faults)

    def record(self, request: Request) -> Fault | None:
        """Logs a request; the fault it gets, if any is queued."""
        with self._lock:
            self.requests.append(request)
            return self._faults.popleft() if self._faults else None

    def new_token(self, query: str, offset: int) -> str:
        """An opaque page token for the rest of a query's results."""
        with self._lock:
            token = f"tok{len(self.tokens)}"
            self.tokens[token] = (query, offset)
            return token

    def close(self) -> None:
        """Stops serving, wakes delayed answers and closes the socket."""
        self.closing.set()
        self.shutdown()
        self._thread.join()
        self.server_close()

    def __enter__(self) -> "FakeEngineServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
