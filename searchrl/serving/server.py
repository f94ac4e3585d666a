"""A Search-R1-compatible retrieval server (an ASGI app on uvicorn's h11 protocol) batching concurrent
requests into one search call.

  POST /retrieve {"queries": [str, ...], "topk": int, "return_scores": bool}
    -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}   (return_scores true)
    -> {"result": [[{"id", "contents"}, ...], ...]}                                  (return_scores false)
  GET /health -> {"status": "ok", "requests": int, "search_calls": int, **about}
     (`about`: what identifies the server; `serve` gives the index's "index" path, "kind", "fingerprint" and
     the server's "pid", which clients and the launcher check)

Bad requests get a 4xx with {"error": "..."} (an unknown path 404, another method 405 with Allow; what h11
refuses, such as conflicting Content-Length headers, a 400) and the connection is closed after it; a failing
search gets a 500; the server keeps serving.

Bounds (`Limits`, defaults in brackets), so that no client can hold the server's connections, memory or CPU:
  - a request carries at most `max_queries` [1024] queries of at most `max_query_chars` [4096] characters,
    topk at most `max_topk` [3000, DeepRetrieval's depth] and queries x topk at most `max_hits` [100,000]
    hits, else 4xx; an error about one query's text names it ({"error", "query": index});
  - its body is at most `max_body_bytes` [8 MiB], else 413; it must carry Content-Length (411) and not also
    Transfer-Encoding (400); its response at most `max_response_bytes` [64 MiB], else 413 (ask for fewer
    hits). The bound is on what is actually returned: each searched slice of a request is encoded at once
    and counted, so a refused response holds at most `max_response_bytes` plus one slice in memory, and a
    deep search over a corpus with a few long documents is refused only when its hits are that large;
  - an idle connection (no request under way) is closed after `idle_timeout_s` [5 s]; a request must arrive
    in full within `timeout_s` [30 s] of the server waiting for it; a client that stops reading its response
    for `timeout_s` is cut off;
  - at most `max_connections` [4096] connections are held at once, and `max_client_connections` [64] from one
    client address. At a cap, a new connection takes the place of the oldest one holding no request under
    way (idle, or still sending its request), which is closed; only when every connection at that cap is
    being served does the new one get 503 with Retry-After: 1. On 127.0.0.1 every local process is one
    address: a neighbour's idle or slow connections then cannot keep a client with a request out, while a
    connection that has sent its request is never dropped (a web server's keep-alive eviction: a connection
    that delivered nothing costs its client at most a reconnect). Idle connections cost a few KiB each;
  - after a refusal the server discards what the client still sends, for at most `linger_s` [2 s], so that
    closing does not reset the connection before the client has read the refusal;
  - one thread searches, and shares its time fairly between requests: each request is cut into slices of at
    most `max_batch` [256] queries, `max_batch_chars` [65,536] query characters (the work of a search) and
    `max_hits` hits, and a search call takes the next slice of each waiting request in turn (gathered for
    at most `max_wait_ms` [2 ms]) while it stays within those bounds. A one-query request thus waits for the
    call under way and at most one slice of each other waiting request, however large they are.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import socket
import sys
import threading
from http import HTTPStatus
from typing import Any, Awaitable, Callable, Mapping, Sequence

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from searchrl.retrieval.types import Hit, Retriever
from searchrl.serving.batcher import Batcher

ROUTES = {"/retrieve": "POST", "/health": "GET"}
_BUSY_BODY = b'{"error": "too many connections; retry later"}'
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))
MAX_HEADERS = 100  # header lines one request may carry (431 beyond)
MAX_HEADER_BYTES = 64 << 10  # request line and headers together (h11's limit; 431 beyond)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how long and how many connections are served (module docstring)."""

    max_queries: int = 1024
    max_query_chars: int = 4096
    max_topk: int = 3000
    default_topk: int = 3  # Search-R1's server default, used when "topk" is absent or null
    max_hits: int = 100_000
    max_body_bytes: int = 8 << 20
    max_response_bytes: int = 64 << 20
    timeout_s: float = 30.0
    idle_timeout_s: float = 5.0
    max_connections: int = 4096
    max_client_connections: int = 64
    linger_s: float = 2.0
    max_batch: int = 256  # queries gathered into one search call
    max_batch_chars: int = 65_536  # query characters gathered into one search call (its work)
    max_wait_ms: float = 2.0  # how long a batch waits for more requests


class RequestError(ValueError):
    """A request the server refuses, with its HTTP status."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST,
                 headers: dict[str, str] | None = None, query: int | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}
        self.query = query  # the index of the query whose text is refused, if one is

    def body(self) -> bytes:
        """{"error": message} and, when the refusal is about one query's text, "query": its index."""
        return json.dumps({"error": str(self)} | ({} if self.query is None else {"query": self.query})
                          ).encode()


class ResponseTooLarge(RequestError):
    """A response over `max_response_bytes`, found while encoding it."""

    def __init__(self, message: str):
        super().__init__(message, HTTPStatus.REQUEST_ENTITY_TOO_LARGE)


def parse_request(body: Any, limits: Limits) -> tuple[list[str], int, bool]:
    """A decoded /retrieve body -> (queries, topk, return_scores); RequestError names the offending field
    (and the query, when one query's text is refused)."""
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
            raise RequestError(f'"queries"[{i}] must be a string, got {type(query).__name__}', query=i)
        if not query.strip():
            raise RequestError(f'"queries"[{i}] is empty', query=i)
        if len(query) > limits.max_query_chars:
            raise RequestError(f'"queries"[{i}] has {len(query)} characters, '
                               f'more than {limits.max_query_chars}', query=i)
        if not _encodable(query):
            raise RequestError(f'"queries"[{i}] is not valid text (a \\u escape of a lone surrogate)',
                               query=i)
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


class _Gate:
    """Open connections, in admission order, against `limits`' caps: at a cap, the oldest connection holding
    no request under way gives its place to the new one (module docstring)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.open: dict[_Protocol, str] = {}  # connection -> client address, oldest first
        self.per_client: collections.Counter[str] = collections.Counter()

    def admit(self, connection: _Protocol, client: str) -> bool:
        """Whether `connection` is held: at once under the caps, else in the place of an evicted one."""
        limits = self.limits
        for within, cap in ((None, limits.max_connections), (client, limits.max_client_connections)):
            if (len(self.open) if within is None else self.per_client[client]) >= cap:
                victim = next((c for c, address in self.open.items()
                               if within in (None, address) and not c.serving()), None)
                if victim is None:
                    return False
                victim.evict()
        self.open[connection] = client
        self.per_client[client] += 1
        return True

    def release(self, connection: _Protocol) -> None:
        client = self.open.pop(connection)
        self.per_client[client] -= 1
        if not self.per_client[client]:
            del self.per_client[client]


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with the server's connection bounds (module docstring): connection caps,
    idle and request deadlines, a deadline on a stalled reader, JSON refusals, lingering after a 503."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        app: _App = self.config.app
        self.limits, self.gate = app.limits, app.gate
        self._admitted = False
        self._started = False  # a byte of the awaited request has arrived
        self._timers: list[asyncio.TimerHandle] = []
        self._stalled: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._admitted = self.gate.admit(self, self._address())
        if self._admitted:
            self._await_request()
        else:
            self._refuse()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in [*self._timers, self._stalled]:
            if timer is not None:
                timer.cancel()
        if self._admitted:
            self.gate.release(self)
            self._admitted = False
        super().connection_lost(exc)

    def serving(self) -> bool:
        """Whether a request has arrived in full and its response is not yet sent."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and not cycle.more_body

    def evict(self) -> None:
        """Closes this connection (holding no request under way) to make room for a new one."""
        self.gate.release(self)
        self._admitted = False
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._admitted:  # else refused: what it sends is discarded while lingering
            self._started = True
            super().data_received(data)

    def on_response_complete(self) -> None:
        self._await_request()
        super().on_response_complete()

    def pause_writing(self) -> None:
        """The client stopped reading: it is cut off unless it reads again within `timeout_s`."""
        super().pause_writing()
        self._stalled = self.loop.call_later(self.limits.timeout_s, self.transport.abort)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def send_400_response(self, msg: str) -> None:
        """What h11 refuses (called while handling its RemoteProtocolError) as a JSON error, with h11's
        status (431 for headers over MAX_HEADER_BYTES, 501 for an unknown Transfer-Encoding)."""
        error = sys.exc_info()[1]
        status = getattr(error, "error_status_hint", HTTPStatus.BAD_REQUEST)
        data = json.dumps({"error": f"invalid HTTP request: {error or msg}"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data)),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase),
                      h11.Data(data=data), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _address(self) -> str:
        return self.client[0] if self.client else ""

    def _await_request(self) -> None:
        """Arms the next request's deadlines: no byte of it within `idle_timeout_s`, or not all of it
        within `timeout_s`, and the connection is closed."""
        for timer in self._timers:
            timer.cancel()
        self._started = False
        self._timers = [self.loop.call_later(self.limits.idle_timeout_s, self._expire, True),
                        self.loop.call_later(self.limits.timeout_s, self._expire, False)]

    def _expire(self, idle: bool) -> None:
        if not self.serving() and not (idle and self._started):
            self.transport.close()

    def _refuse(self) -> None:
        """A 503; then what the client sends is discarded until it closes or `linger_s` passes."""
        self.transport.write(BUSY)
        self.transport.write_eof()
        self._timers = [self.loop.call_later(self.limits.linger_s, self.transport.close)]


Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class _Body:
    """A request's body, read once: in full (`read`) or discarded (`discard`)."""

    def __init__(self, receive: Receive):
        self.receive = receive
        self.done = False

    async def read(self) -> bytes:
        chunks = []
        while not self.done:
            chunks.append(await self._next())
        return b"".join(chunks)

    async def discard(self, seconds: float) -> None:
        """Drops the rest of the body, for at most `seconds`, so that closing after a refusal does not reset
        the connection before the client has read it."""
        async def drain() -> None:
            while not self.done:
                await self._next()
        try:
            await asyncio.wait_for(drain(), seconds)
        except TimeoutError:
            pass

    async def _next(self) -> bytes:
        message = await self.receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        self.done = not message.get("more_body", False)
        return message.get("body", b"")


class _ClientGone(Exception):
    """The client closed the connection before its request arrived in full."""


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    values = [value for key, value in scope["headers"] if key == name]
    return values[0].decode("latin-1") if values else None


class _Encoder:
    """A `Batcher` collector encoding each searched slice's result lists at once, refusing the response
    (ResponseTooLarge) as soon as what it has encoded exceeds `max_bytes`."""

    def __init__(self, return_scores: bool, max_bytes: int, n_queries: int):
        self.return_scores, self.max_bytes, self.n_queries = return_scores, max_bytes, n_queries
        self.size, self.done = len(b'{"result": []}'), 0

    def __call__(self, results: list[list[Hit]]) -> list[bytes]:
        """Each query's result list as JSON, one query at a time; non-finite scores raise ValueError (they
        are not JSON)."""
        parts = []
        for hits in results:
            parts.append(json.dumps(format_results([hits], self.return_scores)["result"][0],
                                    allow_nan=False).encode())
            self.size += len(parts[-1]) + 2
            self.done += 1
            if self.size > self.max_bytes:
                raise ResponseTooLarge(f"the response exceeds {self.max_bytes} bytes ({self.size} after "
                                       f"{self.done} of {self.n_queries} queries): ask for fewer queries or "
                                       f'a smaller "topk"')
        return parts

    @staticmethod
    def join(parts: list[bytes]) -> bytes:
        """The response body of the queries' encoded result lists (as json.dumps writes it)."""
        return b'{"result": [' + b", ".join(parts) + b"]}"


class _App:
    """The ASGI app: routes, validates, searches and encodes through `batcher`."""

    def __init__(self, batcher: Batcher, limits: Limits, about: Mapping[str, Any]):
        self.batcher = batcher
        self.limits = limits
        self.about = dict(about)
        self.gate = _Gate(limits)
        self.requests = 0

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        body = _Body(receive)
        try:
            status, data = await self._respond(scope, body)
        except RequestError as e:
            await body.discard(self.limits.linger_s)
            return await _send(send, e.status, e.body(), close=True, **e.headers)
        except _ClientGone:
            return
        await _send(send, status, data)

    async def _respond(self, scope: dict[str, Any], body: _Body) -> tuple[int, bytes]:
        if len(scope["headers"]) > MAX_HEADERS:
            raise RequestError("Too many headers", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
        method, path = scope["method"], scope["path"]
        route = ROUTES.get(path)
        if route is None:
            raise RequestError(f"no route {method} {path}", HTTPStatus.NOT_FOUND)
        if route != method:
            raise RequestError(f"{path} takes {route}, not {method}", HTTPStatus.METHOD_NOT_ALLOWED,
                               {"Allow": route})
        if route == "GET":
            health = {"status": "ok", "requests": self.requests, "search_calls": self.batcher.search_calls}
            return HTTPStatus.OK, json.dumps({**health, **self.about}).encode()
        queries, topk, return_scores = parse_request(await self._read_json(scope, body), self.limits)
        self.requests += 1
        encoder = _Encoder(return_scores, self.limits.max_response_bytes, len(queries))
        try:
            parts = await asyncio.wrap_future(self.batcher.submit(queries, topk, encoder))
        except ResponseTooLarge as e:
            return e.status, e.body()
        except Exception as e:
            return HTTPStatus.INTERNAL_SERVER_ERROR, json.dumps({"error": f"search failed: {e}"}).encode()
        return HTTPStatus.OK, encoder.join(parts)

    async def _read_json(self, scope: dict[str, Any], body: _Body) -> Any:
        """The body's JSON. h11 has checked Content-Length (digits, one value); a request that also carries
        Transfer-Encoding is refused, as its length would be ambiguous to a proxy in front."""
        length = _header(scope, b"content-length")
        if length is None:
            raise RequestError("a Content-Length header is required", HTTPStatus.LENGTH_REQUIRED)
        if _header(scope, b"transfer-encoding") is not None:
            raise RequestError("a request may carry Content-Length or Transfer-Encoding, not both")
        if int(length) > self.limits.max_body_bytes:
            raise RequestError(f"body of {length} bytes exceeds {self.limits.max_body_bytes}",
                               HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        try:
            return json.loads(await body.read())
        except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, huge numbers, nested too deep
            raise RequestError(f"invalid JSON: {e}") from None


async def _send(send: Send, status: int, data: bytes, close: bool = False, **headers: str) -> None:
    """A JSON response; `close` closes the connection after it."""
    fields = {"content-type": "application/json", "content-length": str(len(data)), **headers}
    if close:
        fields["connection"] = "close"
    await send({"type": "http.response.start", "status": status,
                "headers": [(name.lower().encode(), value.encode()) for name, value in fields.items()]})
    await send({"type": "http.response.body", "body": data})


class RetrievalServer:
    """`RetrievalServer(retriever, "127.0.0.1", 0).start()` serves in a background thread (0: any free port);
    `.url` is where; `serve_forever()` serves in the calling thread (SIGINT / SIGTERM stop it gracefully).
    `about` is added to GET /health's answer (JSON values naming what is served)."""

    def __init__(self, retriever: Retriever, host: str, port: int, limits: Limits = Limits(),
                 verbose: bool = False, about: Mapping[str, Any] | None = None):
        self.limits = limits
        self.socket = socket.create_server((host, port), backlog=1024)  # bound now, so `.url` is known
        self.batcher = Batcher(retriever, limits)
        self.app = _App(self.batcher, limits, about or {})
        config = uvicorn.Config(self.app, http=_Protocol, ws="none", lifespan="off", log_config=None,
                                access_log=verbose, proxy_headers=False, server_header=False,
                                h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                                timeout_keep_alive=math.ceil(limits.idle_timeout_s),
                                timeout_graceful_shutdown=math.ceil(limits.linger_s))
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def requests(self) -> int:
        return self.app.requests

    @property
    def server_address(self) -> tuple[str, int]:
        return self.socket.getsockname()[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self._server.run(sockets=[self.socket])

    def start(self) -> RetrievalServer:
        self._thread = threading.Thread(target=self.serve_forever, name="retrieval-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stops serving (if started in the background), closes the socket and the batcher."""
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join()
        self.socket.close()
        self.batcher.close()

    def __enter__(self) -> RetrievalServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
