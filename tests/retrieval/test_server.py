"""The /retrieve server (validation, batching, resilience) and the HTTP client (parsing, retries, batches)."""
import http.client
import json
import re
import select
import socket
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from searchrl.retrieval import RetrievalConfig, make_retriever
from searchrl.retrieval.remote import RemoteRetriever, parse_response
from searchrl.retrieval.types import Hit, RetrievalError, search_each
from searchrl.retrieval.corpus import CorpusStore
from searchrl.serving.server import Batcher, Limits, RequestError, RetrievalServer, format_results, \
    parse_request


class FakeRetriever:
    """Query q -> hits q-0, q-1, ... with scores k, k-1, ...; records every search call."""

    def __init__(self, delay_s: float = 0.0):
        self.calls: list[tuple[list[str], int]] = []
        self.delay_s = delay_s
        self.fail = False

    def search(self, queries, k):
        self.calls.append((list(queries), k))
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("index exploded")
        return [[Hit(f"{q}-{i}", float(k - i), f"T {q}", f"text {i}") for i in range(k)] for q in queries]


@pytest.fixture
def fake():
    return FakeRetriever()


@pytest.fixture
def server(fake):
    with RetrievalServer(fake, "127.0.0.1", 0, limits=Limits(max_queries=8, max_query_chars=50, max_topk=20,
                                                     max_body_bytes=200_000)).start() as srv:
        yield srv


def request(server, method, path, body=None, headers=None):
    """(status, decoded JSON) of one request; `body` is sent as is when bytes, else JSON-encoded."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=headers or {})
    response = conn.getresponse()
    status, payload = response.status, json.loads(response.read())
    conn.close()
    return status, payload


def test_retrieve_with_and_without_scores(server):
    body = {"queries": ["a", "b"], "topk": 2, "return_scores": True}
    status, body = request(server, "POST", "/retrieve", body)
    assert status == 200
    assert body == {"result": [
        [{"document": {"id": "a-0", "contents": "T a\ntext 0"}, "score": 2.0},
         {"document": {"id": "a-1", "contents": "T a\ntext 1"}, "score": 1.0}],
        [{"document": {"id": "b-0", "contents": "T b\ntext 0"}, "score": 2.0},
         {"document": {"id": "b-1", "contents": "T b\ntext 1"}, "score": 1.0}]]}
    status, body = request(server, "POST", "/retrieve", {"queries": ["a"], "topk": 1})
    assert (status, body) == (200, {"result": [[{"id": "a-0", "contents": "T a\ntext 0"}]]})
    status, body = request(server, "POST", "/retrieve", {"queries": ["a"]})  # Search-R1's default topk: 3
    assert status == 200 and len(body["result"][0]) == 3
    assert request(server, "GET", "/health") == (200, {"status": "ok", "requests": 3, "search_calls": 3})


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "invalid JSON"),
    (b"\xff\xfe", 400, "invalid JSON"),
    ([1, 2], 400, "must be a JSON object"),
    ({"topk": 3}, 400, '"queries" must be a list'),
    ({"queries": "what"}, 400, '"queries" must be a list'),
    ({"queries": []}, 400, '"queries" is empty'),
    ({"queries": ["ok", 7]}, 400, r'"queries"\[1\] must be a string'),
    ({"queries": ["ok", "  "]}, 400, r'"queries"\[1\] is empty'),
    ({"queries": ["x" * 51]}, 400, "51 characters, more than 50"),
    ({"queries": ["ok", "alpha \ud800"]}, 400, r'"queries"\[1\] is not valid text'),  # a lone surrogate
    ({"queries": ["q"] * 9}, 413, "9 entries, more than 8"),
    ({"queries": ["q"], "topk": 0}, 400, r'"topk" must be an integer in \[1, 20\]'),
    ({"queries": ["q"], "topk": 21}, 400, '"topk" must be'),
    ({"queries": ["q"], "topk": "3"}, 400, '"topk" must be'),
    ({"queries": ["q"], "topk": True}, 400, '"topk" must be'),
    ({"queries": ["q"], "topk": 2.5}, 400, '"topk" must be'),
    ({"queries": ["q"], "return_scores": "yes"}, 400, '"return_scores" must be a boolean'),
    (b"x" * 200_001, 413, "exceeds 200000"),
])
def test_bad_requests_get_4xx_and_server_keeps_serving(server, fake, body, status, message):
    got_status, got = request(server, "POST", "/retrieve", body)
    assert got_status == status
    named = re.match(r'"queries"\[(\d+)\]', got["error"])  # an error about one query's text names it
    assert got == {"error": got["error"]} | ({"query": int(named[1])} if named else {})
    assert re.search(message, got["error"])
    assert fake.calls == []  # nothing reached the retriever
    assert request(server, "POST", "/retrieve", {"queries": ["ok"], "topk": 1})[0] == 200


def test_routes_and_length_required(server):
    assert request(server, "GET", "/nope")[0] == 404
    assert request(server, "POST", "/search", {"queries": ["q"]})[0] == 404
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    conn.putrequest("POST", "/retrieve")
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 411 and "Content-Length" in json.loads(response.read())["error"]
    conn.close()
    assert request(server, "GET", "/health")[0] == 200


def test_search_failure_is_500_and_server_recovers(server, fake):
    fake.fail = True
    status, body = request(server, "POST", "/retrieve", {"queries": ["q"]})
    assert status == 500 and "index exploded" in body["error"]
    fake.fail = False
    assert request(server, "POST", "/retrieve", {"queries": ["q"]})[0] == 200


def post(body: bytes, length: bytes | None = None) -> bytes:
    """The raw bytes of a POST /retrieve with `body` (and a Content-Length of `length`, default its size)."""
    length = str(len(body)).encode() if length is None else length
    return b"POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Length: " + length + b"\r\n\r\n" + body


def exchange(server, data: bytes) -> tuple[http.client.HTTPResponse, dict]:
    """Sends raw bytes on a new connection; the response (read) and its decoded JSON body."""
    with socket.create_connection(server.server_address[:2], timeout=10) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response, json.loads(response.read())


@pytest.mark.parametrize("data, status, message", [
    (post(b'{"queries": ["q"], "topk": ' + b"1" * 5000), 400, "invalid JSON: Exceeds the limit"),
    (post(b"[" * 100_000), 400, "invalid JSON: maximum recursion depth"),
    (post(b"{}", length=b"\xb2"), 400, "bad Content-Length"),  # latin-1 superscript two
    (post(b"{}", length=b"\xd9\xa2"), 400, "bad Content-Length"),  # UTF-8 Arabic-Indic two
    (post(b"x" * 9_000_000), 413, "body of 9000000 bytes exceeds 200000"),
    (post(b"{}", length=b"9" * 20), 413, "body of 9{20} bytes exceeds 200000"),
    (post(b"{}", length=b"9" * 5000), 400, "bad Content-Length"),  # over h11's 20 digits
    (b"FOO /retrieve HTTP/1.1\r\nHost: t\r\n\r\n", 405, "/retrieve takes POST, not FOO"),
    (b"DELETE /health HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc", 405, "/health takes GET"),
    (b"GET /retrieve HTTP/1.1\r\nHost: t\r\n\r\n", 405, "/retrieve takes POST, not GET"),
    (b"POST /retrieve HTTP/1.1\r\nHost: t\r\n" + b"X: y\r\n" * 200 + b"\r\n", 431, "Too many headers"),
])
def test_malformed_requests_get_a_4xx_the_client_can_read(server, fake, data, status, message):
    response, body = exchange(server, data)
    assert response.status == status and re.search(message, body["error"])
    assert response.getheader("Connection") == "close"
    if status == 405:
        assert response.getheader("Allow") in ("GET", "POST")
    assert fake.calls == []
    assert request(server, "POST", "/retrieve", {"queries": ["ok"], "topk": 1})[0] == 200


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `seconds`."""
    if not select.select([sock], [], [], seconds)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def trickle(sock: socket.socket, data: bytes, interval: float) -> float:
    """Sends `data` a byte every `interval` s; the time at which the server closed the connection."""
    for byte in data:
        try:
            sock.send(bytes([byte]))
        except OSError:
            return time.monotonic()
        if closed_within(sock, interval):
            return time.monotonic()
    raise AssertionError("the server kept a trickling connection open")


def test_stalled_connections_time_out_and_excess_ones_get_503(fake):
    limits = Limits(timeout_s=1.0, max_connections=3, linger_s=0.2)
    with RetrievalServer(fake, "127.0.0.1", 0, limits=limits).start() as server:
        address = server.server_address[:2]
        start = time.monotonic()
        idle = socket.create_connection(address)
        partial = socket.create_connection(address)
        partial.sendall(post(b'{"queries": ["q"]}')[:-3])
        slow = socket.create_connection(address)
        busy, body = exchange(server, post(b'{"queries": ["q"]}'))  # a fourth connection: refused at once
        assert (busy.status, busy.getheader("Retry-After"), body) == \
            (503, "1", {"error": "too many connections; retry later"})
        assert time.monotonic() - start < 0.8
        closed = trickle(slow, post(b'{"queries": ["' + b"q" * 100 + b'"]}'), 0.05)
        assert 0.9 < closed - start < 2.5, "a trickling client is cut off at the deadline"
        assert closed_within(idle, 1.0) and closed_within(partial, 1.0)
        for sock in (idle, partial, slow):
            sock.close()
        deadline = time.monotonic() + 5
        while (status := request(server, "POST", "/retrieve", {"queries": ["q"]})[0]) == 503:
            assert time.monotonic() < deadline, "the slots of closed connections were not freed"
            time.sleep(0.02)
        assert status == 200 and fake.calls == [(["q"], 3)]


def test_non_finite_scores_are_a_500_not_invalid_json(server, fake, monkeypatch):
    monkeypatch.setattr(fake, "search", lambda queries, k: [[Hit("x", float("nan"))] for _ in queries])
    status, body = request(server, "POST", "/retrieve", {"queries": ["q"], "return_scores": True})
    assert status == 500 and "Out of range float values" in body["error"]


def test_work_and_response_size_per_request_are_bounded(fake):
    with pytest.raises(RequestError, match='1024 queries x "topk" 1000 = 1024000 hits, more than 100000'):
        parse_request({"queries": ["q"] * 1024, "topk": 1000}, Limits())  # the 578 MB response
    limits = Limits(max_hits=20, max_response_bytes=1000)
    with RetrievalServer(fake, "127.0.0.1", 0, limits=limits).start() as server:
        status, body = request(server, "POST", "/retrieve", {"queries": ["a", "b", "c"], "topk": 7})
        assert status == 413 and body["error"] == '3 queries x "topk" 7 = 21 hits, more than 20'
        assert fake.calls == []
        status, body = request(server, "POST", "/retrieve",
                               {"queries": ["a", "b", "c", "d"], "topk": 5, "return_scores": True})
        assert status == 413 and re.fullmatch(r"the response is \d+ bytes, more than 1000: ask for fewer "
                                              r'queries or a smaller "topk"', body["error"])
        assert request(server, "POST", "/retrieve", {"queries": ["a"], "topk": 5})[0] == 200


def test_batches_never_exceed_max_hits():
    fake = FakeRetriever(delay_s=0.01)
    batcher = Batcher(fake, Limits(max_wait_ms=50, max_hits=12))
    asked = [(["a", "b"], 3), (["c"], 10), (["d", "e"], 2), (["f"], 1), (["g", "h", "i"], 4)]
    results = [None] * len(asked)

    def worker(i):
        results[i] = batcher.search(*asked[i])
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(asked))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    assert all(len(queries) * k <= 12 for queries, k in fake.calls), fake.calls
    assert sorted(q for queries, _ in fake.calls for q in queries) == list("abcdefghi")
    for (queries, k), hits in zip(asked, results):
        assert [[h.id for h in row] for row in hits] == [[f"{q}-{j}" for j in range(k)] for q in queries]


def test_concurrent_requests_are_batched():
    fake = FakeRetriever(delay_s=0.05)
    n = 16
    with RetrievalServer(fake, "127.0.0.1", 0, Limits(max_wait_ms=20)).start() as server:
        results = [None] * n

        def worker(i):
            results[i] = request(server, "POST", "/retrieve",
                                 {"queries": [f"q{i}", f"r{i}"], "topk": 1 + i % 4, "return_scores": True})
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(fake.calls) < n / 2, f"{n} requests took {len(fake.calls)} search calls"
    assert sum(len(queries) for queries, _ in fake.calls) == 2 * n
    for i, (status, body) in enumerate(results):
        assert status == 200
        k = 1 + i % 4  # each request gets its own top-k of a batch searched at the largest k
        assert [[d["document"]["id"] for d in hits] for hits in body["result"]] == \
            [[f"q{i}-{j}" for j in range(k)], [f"r{i}-{j}" for j in range(k)]]


def test_client_against_server(server, fake):
    client = RemoteRetriever(RetrievalConfig(url=server.url, batch_size=3))
    hits = client.search([f"q{i}" for i in range(7)], 2)
    assert hits[6] == [Hit("q6-0", 2.0, "T q6", "text 0"), Hit("q6-1", 1.0, "T q6", "text 1")]
    assert [len(queries) for queries, _ in fake.calls] == [3, 3, 1]  # split into batches of 3
    with pytest.raises(RetrievalError, match=r"HTTP 400: \"topk\" must be an integer in \[1, 20\], got 99$"):
        client.search(["q"], 99)


class TokenizingRetriever(FakeRetriever):
    """Fails the whole search call on a lone surrogate, as a tokenizer does."""

    def search(self, queries, k):
        for q in queries:
            q.encode("utf-8")
        return super().search(queries, k)


def test_a_lone_surrogate_query_fails_only_itself():
    fake = TokenizingRetriever()
    with RetrievalServer(fake, "127.0.0.1", 0).start() as server:
        outcomes = search_each(RemoteRetriever(RetrievalConfig(url=server.url, retries=0)), ["alpha", "alpha \ud800", "beta"], 1)
    assert [o[0].id for o in (outcomes[0], outcomes[2])] == ["alpha-0", "beta-0"]
    assert isinstance(outcomes[1], RetrievalError) and "not valid text" in str(outcomes[1])


def test_a_failing_request_does_not_fail_the_others_of_its_batch():
    class Picky(FakeRetriever):
        def search(self, queries, k):
            if "boom" in queries:
                raise RuntimeError("cannot search boom")
            return super().search(queries, k)

    fake = Picky()
    batcher = Batcher(fake, Limits(max_wait_ms=200))
    results = {}

    def ask(query):
        try:
            results[query] = batcher.search([query], 1)
        except RuntimeError as e:
            results[query] = e
    threads = [threading.Thread(target=ask, args=(q,)) for q in ("a", "boom", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    assert results["a"][0][0].id == "a-0" and results["b"][0][0].id == "b-0"
    assert str(results["boom"]) == "cannot search boom"


class FlakyHandler(BaseHTTPRequestHandler):
    """Search-R1-shaped answers after `failures` 503s; counts requests on the server."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests += 1
        if self.server.requests <= self.server.failures:
            status, body = self.server.fail_status, {"error": "busy"}
        else:
            document = {"id": "7", "contents": "Paris\nCapital of France."}
            status, body = 200, {"result": [[{"document": document, "score": 3.5}]]}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FlakyHandler)
    srv.requests, srv.failures, srv.fail_status = 0, 1, 503
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_client_retries_5xx_then_succeeds(flaky):
    url = f"http://127.0.0.1:{flaky.server_address[1]}/retrieve"
    client = RemoteRetriever(RetrievalConfig(url=url, retries=2), backoff_s=0.01)
    assert client.search(["capital of france"], 1) == [[Hit("7", 3.5, "Paris", "Capital of France.")]]
    assert flaky.requests == 2


def test_client_gives_up_after_retries(flaky):
    flaky.failures = 10
    url = f"http://127.0.0.1:{flaky.server_address[1]}"
    client = RemoteRetriever(RetrievalConfig(url=url, retries=2), backoff_s=0.01)
    with pytest.raises(RetrievalError, match="failed after 3 attempts"):
        client.search(["q"], 1)
    assert flaky.requests == 3


def test_client_does_not_retry_4xx(flaky):
    flaky.failures, flaky.fail_status = 10, 422
    url = f"http://127.0.0.1:{flaky.server_address[1]}"
    client = RemoteRetriever(RetrievalConfig(url=url, retries=3), backoff_s=0.01)
    with pytest.raises(RetrievalError, match="HTTP 422"):
        client.search(["q"], 1)
    assert flaky.requests == 1


def test_client_retries_connection_errors():
    with ThreadingHTTPServer(("127.0.0.1", 0), FlakyHandler) as probe:  # a port nothing listens on afterwards
        port = probe.server_address[1]
    client = RemoteRetriever(RetrievalConfig(url=f"http://127.0.0.1:{port}", retries=1, timeout_s=2),
                             backoff_s=0.01)
    with pytest.raises(RetrievalError, match="failed after 2 attempts"):
        client.search(["q"], 1)


def test_parse_search_r1_response_shapes():
    docs = [{"id": "1", "contents": "A\nalpha"}, {"title": "B", "text": "beta"}]
    assert parse_response({"result": [docs]}, 1) == [[Hit("1", 0.0, "A", "alpha"), Hit("", 0.0, "B", "beta")]]
    assert parse_response([[{"document": docs[0], "score": 1}]], 1) == [[Hit("1", 1.0, "A", "alpha")]]
    with pytest.raises(RetrievalError, match="for each of 2 queries"):
        parse_response({"result": [docs]}, 2)
    with pytest.raises(RetrievalError, match=r'result\[0\]\[0\]: document has no "contents"'):
        parse_response({"result": [[{"id": "1"}]]}, 1)
    with pytest.raises(RetrievalError, match=r"result\[0\]\[0\]: expected a document"):
        parse_response({"result": [["plain string"]]}, 1)


def test_make_retriever_remote_and_errors(server):
    retriever = make_retriever(RetrievalConfig(kind="remote", url=server.url, timeout_s=5.0, retries=0,
                                               batch_size=4))
    assert isinstance(retriever, RemoteRetriever) and retriever.batch_size == 4 and retriever.retries == 0
    assert retriever.search(["q"], 1)[0][0].id == "q-0"
    with pytest.raises(ValueError, match='"url"'):
        make_retriever(RetrievalConfig(kind="remote"))
    with pytest.raises(ValueError, match='"index_dir"'):
        make_retriever(RetrievalConfig(kind="local"))
    known = r"config.retrieval.kind='cloud' is not a known retriever kind; known: \[.*'local', .*'remote'\]"
    with pytest.raises(ValueError, match=known):
        make_retriever(RetrievalConfig(kind="cloud"))


def connect_from(server, source: str) -> socket.socket:
    """A connection to `server` from the loopback address `source` (any 127.x.y.z is this host)."""
    return socket.create_connection(server.server_address, timeout=10, source_address=(source, 0))


def still_open(sock: socket.socket) -> bool:
    """Whether `sock` is open with nothing to read (select() cannot watch descriptors over 1023)."""
    sock.setblocking(False)
    try:
        sock.recv(1)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)
    return False


def test_a_thousand_idle_connections_do_not_deny_service(fake):
    """Issue 39 cause 9: 128 idle connections used to fail every other client."""
    limits = Limits(max_client_connections=50, idle_timeout_s=30)
    with RetrievalServer(fake, "127.0.0.1", 0, limits=limits).start() as server:
        idle = [connect_from(server, f"127.0.1.{1 + i // 50}") for i in range(1000)]
        client = RemoteRetriever(RetrievalConfig(url=server.url, timeout_s=2.0, retries=0))
        start = time.monotonic()
        for i in range(20):
            assert client.search([f"q{i}"], 1)[0][0].id == f"q{i}-0"
        assert time.monotonic() - start < 5
        assert all(still_open(sock) for sock in idle), "idle connections are held, not dropped"
        for sock in idle:
            sock.close()


def test_connections_per_client_are_capped_and_idle_ones_closed(fake):
    limits = Limits(max_client_connections=3, idle_timeout_s=0.5, linger_s=0.2)
    with RetrievalServer(fake, "127.0.0.1", 0, limits=limits).start() as server:
        held = [connect_from(server, "127.0.2.1") for _ in range(3)]
        with connect_from(server, "127.0.2.1") as extra:
            extra.sendall(post(b'{"queries": ["q"]}'))
            response = http.client.HTTPResponse(extra)
            response.begin()
            assert (response.status, response.getheader("Retry-After"), json.loads(response.read())) == \
                (503, "1", {"error": "too many connections; retry later"})
        assert request(server, "POST", "/retrieve", {"queries": ["q"]})[0] == 200  # another client is served
        start = time.monotonic()
        assert all(closed_within(sock, 2.0) for sock in held)
        assert 0.4 < time.monotonic() - start < 1.5, "idle connections are closed after idle_timeout_s"
        for sock in held:
            sock.close()
        with connect_from(server, "127.0.2.1") as again:  # their slots are free again
            again.sendall(post(b'{"queries": ["q"]}'))
            response = http.client.HTTPResponse(again)
            response.begin()
            assert response.status == 200


class SizedRetriever(FakeRetriever):
    """A FakeRetriever that knows its largest document's JSON size."""

    max_document_bytes = 1000


def test_a_response_too_large_for_memory_is_refused_before_searching():
    """Issue 39 cause 10: 1,000 queries x top-k 100 got its 413 only after the response was built."""
    fake = SizedRetriever()
    with RetrievalServer(fake, "127.0.0.1", 0).start() as server:
        body = {"queries": [f"query {i}" for i in range(1000)], "topk": 100, "return_scores": True}
        tracemalloc.start()
        status, payload = request(server, "POST", "/retrieve", body)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert status == 413 and re.fullmatch(
            r'1000 queries x "topk" 100 may need a response of \d+ bytes \(documents of up to 1000\), '
            r'more than 67108864: ask for fewer queries or a smaller "topk"', payload["error"])
        assert fake.calls == [] and server.batcher.search_calls == 0
        assert peak < 8 << 20, f"{peak} bytes allocated to refuse it"
        assert request(server, "POST", "/retrieve", {"queries": ["q"] * 100, "topk": 100})[0] == 200
    with pytest.raises(RequestError, match="may need a response of"):
        parse_request({"queries": ["q"] * 500, "topk": 200}, Limits(), document_bytes=1000)
    assert parse_request({"queries": ["q"] * 500, "topk": 3}, Limits(), document_bytes=1000)[1] == 3


@pytest.mark.parametrize("headers", [
    b"Content-Length: 18\r\nContent-Length: 60\r\n",
    b"Content-Length: 18, 60\r\n",
    b"Transfer-Encoding: chunked\r\nContent-Length: 18\r\n",
    b"Content-Length: 18\r\nTransfer-Encoding: chunked\r\n",
])
def test_ambiguous_request_lengths_are_refused_and_nothing_is_smuggled(server, fake, headers):
    """Issue 39 cause 11: the first of two lengths won and the leftover bytes were served as a request."""
    smuggled = post(b'{"queries": ["smuggled"]}')
    body = b'{"queries": ["q"]}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    data = b"POST /retrieve HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n" + \
        (chunked if b"chunked" in headers else body) + smuggled
    with socket.create_connection(server.server_address, timeout=10) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        error = json.loads(response.read())["error"]
        assert response.status == 400 and response.getheader("Connection") == "close"
        assert re.search("conflicting Content-Length|Content-Length or Transfer-Encoding, not both", error)
        assert closed_within(sock, 2.0), "the connection is closed after the refusal"
    assert fake.calls == [] and server.requests == 0


def test_a_corpus_store_bounds_its_documents_json(tmp_path):
    rows = [{"id": "a", "contents": "T\nshort"},
            {"id": "b", "title": "Ünïcödé", "text": "é" * 300 + "😀" * 50}]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    store = CorpusStore.build(corpus, tmp_path / "store", show_progress=False)
    largest = max(len(json.dumps(format_results([[store.hit(i, 0.0)]], False)["result"][0][0]))
                  for i in range(len(store)))
    assert largest <= store.max_document_bytes < 4 * largest
