"""The /retrieve server (validation, batching, resilience) and the HTTP client (parsing, retries, batches)."""
import http.client
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import ml_collections
import pytest

from searchrl.retrieval import make_retriever
from searchrl.retrieval.client import RemoteRetriever, RetrievalError, parse_response
from searchrl.retrieval.server import Limits, RetrievalServer
from searchrl.retrieval.types import Hit


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
    with RetrievalServer(fake, port=0, limits=Limits(max_queries=8, max_query_chars=50, max_topk=20,
                                                     max_body_bytes=4096)).start() as srv:
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
    ({"queries": ["q"] * 9}, 413, "9 entries, more than 8"),
    ({"queries": ["q"], "topk": 0}, 400, r'"topk" must be an integer in \[1, 20\]'),
    ({"queries": ["q"], "topk": 21}, 400, '"topk" must be'),
    ({"queries": ["q"], "topk": "3"}, 400, '"topk" must be'),
    ({"queries": ["q"], "topk": True}, 400, '"topk" must be'),
    ({"queries": ["q"], "topk": 2.5}, 400, '"topk" must be'),
    ({"queries": ["q"], "return_scores": "yes"}, 400, '"return_scores" must be a boolean'),
    (b"x" * 5000, 413, "exceeds 4096"),
])
def test_bad_requests_get_4xx_and_server_keeps_serving(server, fake, body, status, message):
    got_status, got = request(server, "POST", "/retrieve", body)
    assert got_status == status
    assert set(got) == {"error"}
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


def test_concurrent_requests_are_batched():
    fake = FakeRetriever(delay_s=0.05)
    n = 16
    with RetrievalServer(fake, port=0, max_wait_ms=20).start() as server:
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
    client = RemoteRetriever(server.url, batch_size=3)
    hits = client.search([f"q{i}" for i in range(7)], 2)
    assert hits[6] == [Hit("q6-0", 2.0, "T q6", "text 0"), Hit("q6-1", 1.0, "T q6", "text 1")]
    assert [len(queries) for queries, _ in fake.calls] == [3, 3, 1]  # split into batches of 3
    with pytest.raises(RetrievalError, match=r"HTTP 400: \"topk\" must be an integer in \[1, 20\], got 99$"):
        client.search(["q"], 99)


class FlakyHandler(BaseHTTPRequestHandler):
    """Search-R1-shaped answers after `failures` 503s; counts requests on the server."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests += 1
        if self.server.requests <= self.server.failures:
            status, body = self.server.fail_status, {"error": "busy"}
        else:
            document = {"id": "7", "contents": '"Paris"\nCapital of France.'}
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
    client = RemoteRetriever(url, retries=2, backoff_s=0.01)
    assert client.search(["capital of france"], 1) == [[Hit("7", 3.5, "Paris", "Capital of France.")]]
    assert flaky.requests == 2


def test_client_gives_up_after_retries(flaky):
    flaky.failures = 10
    client = RemoteRetriever(f"http://127.0.0.1:{flaky.server_address[1]}", retries=2, backoff_s=0.01)
    with pytest.raises(RetrievalError, match="failed after 3 attempts"):
        client.search(["q"], 1)
    assert flaky.requests == 3


def test_client_does_not_retry_4xx(flaky):
    flaky.failures, flaky.fail_status = 10, 422
    client = RemoteRetriever(f"http://127.0.0.1:{flaky.server_address[1]}", retries=3, backoff_s=0.01)
    with pytest.raises(RetrievalError, match="HTTP 422"):
        client.search(["q"], 1)
    assert flaky.requests == 1


def test_client_retries_connection_errors():
    with ThreadingHTTPServer(("127.0.0.1", 0), FlakyHandler) as probe:  # a port nothing listens on afterwards
        port = probe.server_address[1]
    client = RemoteRetriever(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01, timeout=2)
    with pytest.raises(RetrievalError, match="failed after 2 attempts"):
        client.search(["q"], 1)


def test_parse_search_r1_response_shapes():
    docs = [{"id": "1", "contents": '"A"\nalpha'}, {"title": "B", "text": "beta"}]
    assert parse_response({"result": [docs]}, 1) == [[Hit("1", 0.0, "A", "alpha"), Hit("", 0.0, "B", "beta")]]
    assert parse_response([[{"document": docs[0], "score": 1}]], 1) == [[Hit("1", 1.0, "A", "alpha")]]
    with pytest.raises(RetrievalError, match="for each of 2 queries"):
        parse_response({"result": [docs]}, 2)
    with pytest.raises(RetrievalError, match=r'result\[0\]\[0\]: document has no "contents"'):
        parse_response({"result": [[{"id": "1"}]]}, 1)
    with pytest.raises(RetrievalError, match=r"result\[0\]\[0\]: expected a document"):
        parse_response({"result": [["plain string"]]}, 1)


def test_make_retriever_remote_and_errors(server):
    config = ml_collections.ConfigDict({"kind": "remote", "url": server.url, "timeout_s": 5.0, "retries": 0,
                                        "batch_size": 4})
    retriever = make_retriever(config)
    assert isinstance(retriever, RemoteRetriever) and retriever.batch_size == 4 and retriever.retries == 0
    assert retriever.search(["q"], 1)[0][0].id == "q-0"
    with pytest.raises(ValueError, match='"url"'):
        make_retriever({"kind": "remote"})
    with pytest.raises(ValueError, match='"index_dir"'):
        make_retriever({"kind": "local"})
    with pytest.raises(ValueError, match='"local" or "remote"'):
        make_retriever({"kind": "cloud"})
