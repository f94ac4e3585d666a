"""RemoteRetriever against raw misbehaving servers: what is retried, what is refused, and the per-attempt
deadline."""
import socket
import threading
import time

import pytest

from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.remote import RemoteRetriever
from searchrl.retrieval.types import Hit, RetrievalError, RetrievalUnavailable
from tests.fakes.scripted import ScriptedServer, response, trickled

OK_BODY = b'{"result": [[{"document": {"id": "7", "contents": "Paris\\nCapital."}, "score": 3.5}]]}'
OK = response("200 OK", OK_BODY)


@pytest.fixture
def scripted():
    servers = []

    def make(*replies):
        servers.append(ScriptedServer(*replies))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


TRANSIENT = {
    "incomplete read": (response("200 OK", OK_BODY)[:-20], "IncompleteRead"),
    "bad status line": (b"garbage\r\n\r\n", "BadStatusLine"),
    "closed without answer": (b"", "RemoteDisconnected"),
    "not UTF-8": (response("200 OK", b'{"result": "\xff\xfe"}'), "response is not JSON"),
    "not JSON": (response("200 OK", b"<html>"), "response is not JSON"),
    "503": (response("503 Service Unavailable", b'{"error": "busy"}'), "HTTP 503: busy"),
    "429": (response("429 Too Many Requests", b"slow down"), "HTTP 429: slow down"),
    "408": (response("408 Request Timeout", b""), "HTTP 408"),
}


@pytest.mark.parametrize("name", TRANSIENT)
def test_transient_failures_are_retried(scripted, name):
    reply, _ = TRANSIENT[name]
    server = scripted(reply, OK)
    client = RemoteRetriever(RetrievalConfig(url=server.url, retries=1, timeout_s=5), backoff_s=0.01)
    assert client.search(["q"], 1) == [[Hit("7", 3.5, "Paris", "Capital.")]]
    assert server.connections == 2


@pytest.mark.parametrize("name", TRANSIENT)
def test_transient_failures_end_unavailable_naming_the_cause(scripted, name):
    reply, message = TRANSIENT[name]
    server = scripted(reply)
    client = RemoteRetriever(RetrievalConfig(url=server.url, retries=1, timeout_s=5), backoff_s=0.01)
    with pytest.raises(RetrievalUnavailable, match=f"failed after 2 attempts: .*{message}"):
        client.search(["q"], 1)
    assert server.connections == 2


def test_trickling_server_is_cut_off_at_the_deadline(scripted):
    server = scripted(trickled(OK, interval=0.1))
    client = RemoteRetriever(RetrievalConfig(url=server.url, retries=0, timeout_s=0.5))
    start = time.monotonic()
    with pytest.raises(RetrievalUnavailable, match="TimeoutError"):
        client.search(["q"], 1)
    assert time.monotonic() - start < 1.5


def test_retry_after_is_honoured(scripted):
    server = scripted(response("429 Too Many Requests", b"", "Retry-After: 1"), OK)
    client = RemoteRetriever(RetrievalConfig(url=server.url, retries=1, timeout_s=5), backoff_s=0.01)
    start = time.monotonic()
    assert client.search(["q"], 1)[0][0].id == "7"
    assert 1.0 <= time.monotonic() - start < 3.0


@pytest.mark.parametrize("score", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"1" * 400, b"true"])
def test_non_finite_scores_are_a_malformed_response(scripted, score):
    body = b'{"result": [[{"document": {"id": "1", "contents": "x"}, "score": ' + score + b"}]]}"
    server = scripted(response("200 OK", body), OK)
    client = RemoteRetriever(RetrievalConfig(url=server.url, retries=2, timeout_s=5), backoff_s=0.01)
    with pytest.raises(RetrievalError, match=r"result\[0\]\[0\]: the score must be a finite number") as error:
        client.search(["q"], 1)
    assert not isinstance(error.value, RetrievalUnavailable)
    assert server.connections == 1  # a well-formed answer of the wrong shape is not retried


def test_refusals_are_not_retried_and_only_http_is_spoken(scripted):
    server = scripted(response("400 Bad Request", b'{"error": "no"}'))
    with pytest.raises(RetrievalError, match="HTTP 400: no$") as error:
        RemoteRetriever(RetrievalConfig(url=server.url, retries=3), backoff_s=0.01).search(["q"], 1)
    assert not isinstance(error.value, RetrievalUnavailable) and server.connections == 1
    with pytest.raises(ValueError, match="http://HOST"):
        RemoteRetriever(RetrievalConfig(url="https://example.org"))


class HungServer:
    """Accepts connections and never answers, as a SIGSTOPped replica (whose kernel still accepts) does;
    counts the connections."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _hold(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:  # shut down
                return

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join()
        for conn in self.held:
            conn.close()


def test_a_hung_replica_costs_one_timeout_then_is_set_aside_until_probed(scripted):
    """Issue 67 cause 8: a hung replica cost (retries + 1) x timeout on every call (~123 s with the
    defaults). Now it costs one timeout, is set aside, and is probed once its cooldown has passed (then set
    aside for twice as long)."""
    hung, live = HungServer(), scripted(OK)
    try:
        client = RemoteRetriever(RetrievalConfig(url=f"{hung.url},{live.url}", timeout_s=0.4, retries=3),
                                 backoff_s=0.05, cooldown_s=1.0)

        def timed_search() -> float:
            start = time.monotonic()
            assert client.search(["q"], 1) == [[Hit("7", 3.5, "Paris", "Capital.")]]  # one shard: hung's
            return time.monotonic() - start
        assert 0.35 < timed_search() < 1.0 and len(hung.held) == 1  # one timeout, not 4 plus backoff
        assert all(timed_search() < 0.3 for _ in range(3)) and len(hung.held) == 1  # set aside
        time.sleep(max(client.replicas[0].retry_at - time.monotonic(), 0) + 0.05)
        assert 0.35 < timed_search() < 1.0 and len(hung.held) == 2  # probed again: one timeout
        assert client.replicas[0].retry_at - time.monotonic() > 1.5  # now set aside for 2 s
        assert timed_search() < 0.3 and len(hung.held) == 2
        assert live.connections == 6
    finally:
        hung.close()
