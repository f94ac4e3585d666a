"""The /retrieve server (validation, batching, resilience) and the HTTP client (parsing, retries, batches)."""
import dataclasses
import http.client
import json
import re
import select
import socket
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from searchrl.retrieval import RetrievalConfig, make_retriever
from searchrl.retrieval.remote import RemoteRetriever, parse_response
from searchrl.retrieval.types import Hit, RetrievalError, search_each
from searchrl.serving.server import Batcher, Limits, RequestError, RetrievalServer, parse_request


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


def test_stalled_connections_time_out_and_give_their_place_to_a_request(fake):
    limits = Limits(timeout_s=1.0, max_connections=3, linger_s=0.2)
    with RetrievalServer(fake, "127.0.0.1", 0, limits=limits).start() as server:
        address = server.server_address[:2]
        start = time.monotonic()
        idle = socket.create_connection(address)
        partial = socket.create_connection(address)
        partial.sendall(post(b'{"queries": ["q"]}')[:-3])
        slow = socket.create_connection(address)
        time.sleep(0.1)  # all three admitted
        assert request(server, "POST", "/retrieve", {"queries": ["q"]})[0] == 200  # a fourth connection
        assert closed_within(idle, 0.3), "the oldest connection holding no request gave its place"
        assert time.monotonic() - start < 0.8
        closed = trickle(slow, post(b'{"queries": ["' + b"q" * 100 + b'"]}'), 0.05)
        assert 0.9 < closed - start < 2.5, "a trickling client is cut off at the deadline"
        assert closed_within(partial, 1.0)
        for sock in (idle, partial, slow):
            sock.close()
        assert request(server, "POST", "/retrieve", {"queries": ["r"]})[0] == 200
        assert fake.calls == [(["q"], 3), (["r"], 3)]


def test_a_connection_is_refused_only_when_every_place_is_serving_a_request():
    fake = FakeRetriever(delay_s=0.6)
    limits = Limits(max_connections=2, linger_s=0.2)
    with RetrievalServer(fake, "127.0.0.1", 0, limits=limits).start() as server:
        served = []
        threads = [threading.Thread(target=lambda: served.append(request(server, "POST", "/retrieve",
                                                                         {"queries": ["q"]})[0]))
                   for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # both requests are being searched
        busy, body = exchange(server, post(b'{"queries": ["q"]}'))
        assert (busy.status, busy.getheader("Retry-After"), body) == \
            (503, "1", {"error": "too many connections; retry later"})
        for t in threads:
            t.join()
        assert served == [200, 200]


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
        assert status == 413 and re.fullmatch(r"the response exceeds 1000 bytes \(\d+ after 3 of 4 "
                                              r'queries\): ask for fewer queries or a smaller "topk"',
                                              body["error"])
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


class CostlyRetriever(FakeRetriever):
    """Searches in time proportional to the characters searched (a search's work grows with its query
    terms), answering with short documents; records every search call."""

    def __init__(self, seconds_per_char: float):
        super().__init__()
        self.seconds_per_char = seconds_per_char

    def search(self, queries, k):
        self.calls.append((list(queries), k))
        time.sleep(self.seconds_per_char * sum(map(len, queries)))
        return [[Hit(f"{q[-4:]}-{i}", float(k - i), "", "text") for i in range(k)] for q in queries]


def test_a_small_request_is_not_stuck_behind_the_largest_valid_one():
    """Issue 67 cause 7: a request of 1,024 queries x 4,096 characters held the one search thread ~10 s and
    a 1-query request sent meanwhile waited 9.6 s. Here the largest request the default limits allow takes
    ~2 s of search; a small client's requests meanwhile wait for at most one slice of it: p99 under 0.4 s
    (~0.05 s unloaded), where searching requests whole made each wait for the rest of the large one."""
    limits = Limits()
    retriever = CostlyRetriever(seconds_per_char=0.5e-6)
    largest = ["w " * (limits.max_query_chars // 2 - 3) + f"{i:04d}" for i in range(limits.max_queries)]
    assert max(map(len, largest)) <= limits.max_query_chars
    with RetrievalServer(retriever, "127.0.0.1", 0, limits).start() as server:
        big = {}

        def send_largest():
            start = time.monotonic()
            big["status"], big["body"] = request(server, "POST", "/retrieve", {"queries": largest, "topk": 3})
            big["seconds"] = time.monotonic() - start
        thread = threading.Thread(target=send_largest)
        thread.start()
        while not retriever.calls:  # the large request is being searched
            time.sleep(0.005)
        latencies = []
        while thread.is_alive():
            start = time.monotonic()
            status, body = request(server, "POST", "/retrieve", {"queries": ["small"], "topk": 1})
            latencies.append(time.monotonic() - start)
            assert status == 200 and body["result"] == [[{"id": "mall-0", "contents": "text"}]]
        thread.join()
    assert big["status"] == 200 and [hits[0]["id"] for hits in big["body"]["result"]] == \
        [f"{i:04d}-0" for i in range(limits.max_queries)]
    assert big["seconds"] > 1.5 and len(latencies) >= 10, (big["seconds"], len(latencies))
    p99 = float(np.percentile(latencies, 99))
    assert p99 < 0.4, f"the small client's p99 latency is {p99:.3f} s beside the largest request"
    assert max(len(queries) for queries, _ in retriever.calls) <= limits.max_batch_chars // 4096 + 1


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
        opened = time.monotonic()
        held = [connect_from(server, "127.0.2.1") for _ in range(3)]
        time.sleep(0.1)  # all three admitted
        start = time.monotonic()
        with connect_from(server, "127.0.2.1") as extra:  # the fourth takes the oldest idle one's place
            extra.sendall(post(b'{"queries": ["q"]}'))
            response = http.client.HTTPResponse(extra)
            response.begin()
            assert response.status == 200
        assert closed_within(held[0], 0.3) and time.monotonic() - start < 0.4
        assert all(still_open(sock) for sock in held[1:])
        assert all(closed_within(sock, 2.0) for sock in held[1:])
        assert 0.4 < time.monotonic() - opened < 1.5, "idle connections are closed after idle_timeout_s"
        for sock in held:
            sock.close()


def test_slow_local_neighbours_cannot_keep_a_client_out(fake):
    """Issue 67 cause 6: 64 one-byte connections from 127.0.0.1 (the per-address cap) made the trainer's
    client fail with RetrievalUnavailable; here the neighbour also reopens each connection it loses."""
    with RetrievalServer(fake, "127.0.0.1", 0).start() as server:  # default limits: 64 per address
        stop, opened = threading.Event(), []

        def neighbour():
            slow: list[socket.socket] = []
            while not stop.is_set():
                slow = [sock for sock in slow if still_open(sock) or sock.close()]
                while len(slow) < 64:
                    slow.append(socket.create_connection(server.server_address, timeout=10))
                    slow[-1].sendall(b"P")
                    opened.append(1)
                time.sleep(0.005)
            for sock in slow:
                sock.close()
        thread = threading.Thread(target=neighbour)
        thread.start()
        try:
            while len(opened) < 64:
                time.sleep(0.01)
            client = RemoteRetriever(RetrievalConfig(url=server.url, timeout_s=2.0, retries=0))
            for i in range(20):
                assert client.search([f"q{i}"], 1)[0][0].id == f"q{i}-0"
        finally:
            stop.set()
            thread.join()
        assert len(opened) > 64, "requests took the places of slow connections, which were reopened"


def test_a_response_is_bounded_by_what_it_returns_and_refused_early():
    """Issue 67 cause 5: the bound was queries x topk x 3 x the longest corpus line, before searching. Now
    each searched slice is encoded at once: a response is refused once what it returns passes the bound,
    holding little more than that bound in memory, and the rest of the request is not searched."""
    def peak_memory(server, body):
        tracemalloc.start()
        try:
            return request(server, "POST", "/retrieve", body), tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    body = {"queries": [f"query {i}" for i in range(300)], "topk": 40, "return_scores": True}
    fake = FakeRetriever()
    limits = Limits(max_batch=64, max_response_bytes=128 << 10)
    with RetrievalServer(fake, "127.0.0.1", 0, limits).start() as server:
        (status, payload), refused_peak = peak_memory(server, body)
        assert status == 413 and re.fullmatch(r"the response exceeds 131072 bytes \(\d+ after \d+ of 300 "
                                              r'queries\): ask for fewer queries or a smaller "topk"',
                                              payload["error"])
        assert [len(queries) for queries, _ in fake.calls] == [64]  # one slice searched, not five
        status, payload = request(server, "POST", "/retrieve", {**body, "queries": body["queries"][:20]})
        assert status == 200 and len(payload["result"]) == 20 and len(json.dumps(payload)) < 128 << 10
    with RetrievalServer(fake, "127.0.0.1", 0, dataclasses.replace(limits, max_response_bytes=64 << 20)
                         ).start() as server:
        (status, payload), full_peak = peak_memory(server, body)
        assert status == 200 and len(json.dumps(payload)) > 768 << 10
    assert refused_peak < full_peak / 3, (refused_peak, full_peak)


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
