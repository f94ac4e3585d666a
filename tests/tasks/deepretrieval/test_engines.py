"""PubMed / ClinicalTrials.gov search engines against the local fake server: ranking, paging, retries,
errors, rate limiting, the on-disk cache and the config hook."""
import json
import threading
import time
import urllib.error
import urllib.request
import warnings

import pytest

from searchrl import run_config
from searchrl.configlib import ConfigError
from searchrl.retrieval import RetrievalConfig, make_retriever
from searchrl.retrieval.types import Hit
from searchrl.tasks.deepretrieval.engines import (MAX_RETRY_AFTER_S, PUBMED_MAX_RESULTS, ClinicalTrials,
                                                  ClinicalTrialsOptions, Malformed, PubMed, PubMedOptions,
                                                  RateLimiter, SearchCache, SearchEngine, SearchEngineError,
                                                  SearchEngineUnavailable, make_engine, parse_esearch,
                                                  parse_studies, retry_after_s)
from tests.tasks.deepretrieval.test_presets import deepretrieval
from tests.fakes.engines import Fault, FakeEngineServer, esearch_error_body, studies_body
from tests.processes import free_port

CORPUS = {  # "cancer" ranks 1003 (3 times), 1001 (2), then 1002 and 1005 (1 each, corpus order)
    "1001": "cancer screening and cancer risk",
    "1002": "aspirin for cancer prevention",
    "1003": "cancer cancer cancer trial",
    "1004": "aspirin dosage in children",
    "1005": "lung cancer outcomes",
}
TRIALS = {f"NCT0000000{i}": text for i, text in enumerate(CORPUS.values())}
MANY = {str(2000 + i): "metformin diabetes" for i in range(10)}


class FakeClock:
    """A clock that moves only when slept on; records the sleeps."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds

    def backoffs(self):
        """The sleeps longer than a rate-limiter slot at the tests' 1e9 requests/s."""
        return [s for s in self.sleeps if s > 1e-6]


@pytest.fixture(autouse=True)
def no_api_key(monkeypatch):
    monkeypatch.delenv("NCBI_API_KEY", raising=False)


@pytest.fixture
def fake():
    with FakeEngineServer({**CORPUS, **MANY}, trials={**TRIALS, **MANY}) as server:
        yield server


def engine(api, fake, clock=None, **kwargs):
    """An engine on the fake server whose sleeps go to a fake clock (no real waiting)."""
    clock = clock or FakeClock()
    kwargs = {"rate_per_s": 1e9, "backoff_s": 0.5, "workers": 1, "timeout_s": 5.0,
              "retries": RetrievalConfig().retries, **kwargs}
    return SearchEngine(api, url=fake.url, clock=clock, sleep=clock.sleep, **kwargs)


def ids(hits):
    return [[h.id for h in row] for row in hits]


def test_pubmed_returns_ranked_ids_with_rank_scores(fake):
    hits = engine(PubMed(), fake).search(["cancer", "aspirin", "cancer"], k=3)
    assert hits[0] == [Hit("1003", 1.0), Hit("1001", 0.5), Hit("1002", 1 / 3)]
    assert ids(hits) == [["1003", "1001", "1002"], ["1002", "1004"], ["1003", "1001", "1002"]]
    assert fake.request_count == 2  # the repeated query is asked once
    request = fake.requests[0]
    assert request.path == "/esearch.fcgi"
    assert request.params == {"db": "pubmed", "term": "cancer", "retmode": "json", "retstart": "0",
                              "retmax": "3"}


def test_ctgov_returns_ranked_ids(fake):
    hits = engine(ClinicalTrials(), fake).search(["lung cancer", "aspirin"], k=10)
    assert ids(hits) == [["NCT00000004"], ["NCT00000001", "NCT00000003"]]
    request = fake.requests[0]
    assert request.path == "/studies"
    assert request.params == {"query.term": "lung cancer", "pageSize": "10", "fields": "NCTId",
                              "format": "json"}


def test_pubmed_pages_with_retstart_until_k_or_count(fake):
    search = engine(PubMed(page_size=4), fake)
    assert search.ranked_ids("metformin", 7) == list(MANY)[:7]
    pages = [(r.params["retstart"], r.params["retmax"]) for r in fake.requests]
    assert pages == [("0", "4"), ("4", "3")]
    assert search.ranked_ids("metformin", 50) == list(MANY)  # stops at count, 10
    pages = [(r.params["retstart"], r.params["retmax"]) for r in fake.requests[2:]]
    assert pages == [("0", "4"), ("4", "4"), ("8", "4")]


def test_pubmed_stops_at_esearch_limit_of_9999_records():
    corpus = {str(i): "common" for i in range(10_050)}
    with FakeEngineServer(corpus) as fake:
        found = engine(PubMed(page_size=5_000), fake).ranked_ids("common", 20_000)
        assert found == list(corpus)[:PUBMED_MAX_RESULTS]
        pages = [(r.params["retstart"], r.params["retmax"]) for r in fake.requests]
    assert pages == [("0", "5000"), ("5000", "4999")]


def test_ctgov_follows_page_tokens_until_k_or_last_page(fake):
    search = engine(ClinicalTrials(page_size=4), fake)
    assert search.ranked_ids("metformin", 9) == list(MANY)[:9]
    assert [r.params["pageSize"] for r in fake.requests] == ["4", "4", "1"]
    assert "pageToken" not in fake.requests[0].params
    assert all("pageToken" in r.params for r in fake.requests[1:])
    assert search.ranked_ids("metformin", 100) == list(MANY)
    assert fake.request_count == 6  # 4 + 4 + 2, the last page has no nextPageToken


def test_429_is_retried_after_retry_after(fake):
    fake.inject(Fault(429, retry_after="2"), Fault(429))
    clock = FakeClock()
    assert engine(PubMed(), fake, clock).ranked_ids("aspirin", 5) == ["1002", "1004"]
    assert clock.backoffs() == [2.0, 1.0]  # Retry-After, then backoff_s * 2
    assert fake.request_count == 3


def test_5xx_is_retried_with_exponential_backoff(fake):
    fake.inject(Fault(500), Fault(503))
    clock = FakeClock()
    assert engine(ClinicalTrials(), fake, clock).ranked_ids("aspirin", 5) == ["NCT00000001", "NCT00000003"]
    assert clock.backoffs() == [0.5, 1.0]


def test_exhausted_retries_raise_a_clear_error(fake):
    fake.inject(*[Fault(500)] * 3)
    query = "cancer " * 30
    with pytest.raises(SearchEngineError) as error:
        engine(PubMed(), fake, retries=2).ranked_ids(query, 5)
    message = str(error.value)
    assert message.startswith("pubmed: query 'cancer cancer")
    assert "...'" in message and query not in message  # truncated
    assert "failed after 3 attempts" in message and "HTTP 500" in message
    assert fake.request_count == 3


def test_other_4xx_fails_at_once_with_the_server_message(fake):
    fake.inject(Fault(400, body=b'{"error":"API key invalid","type":"api-key"}'))
    with pytest.raises(SearchEngineError, match=r"pubmed: query 'aspirin': HTTP 400: API key invalid"):
        engine(PubMed(), fake).ranked_ids("aspirin", 5)
    assert fake.request_count == 1


@pytest.mark.parametrize("body", [b"{not json", b"<html>busy</html>", b'{"esearchresult": {"idlist": []}}',
                                  b'{"something": "else"}'])
def test_malformed_body_is_retried_then_raises(fake, body):
    fake.inject(Fault(200, body=body))
    assert engine(PubMed(), fake).ranked_ids("aspirin", 5) == ["1002", "1004"]
    fake.inject(*[Fault(200, body=body)] * 2)
    with pytest.raises(SearchEngineError, match="failed after 2 attempts; last: malformed body"):
        engine(PubMed(), fake, retries=1).ranked_ids("aspirin", 5)


def test_ctgov_malformed_study_raises(fake):
    fake.inject(*[Fault(200, body=b'{"studies": [{"protocolSection": {}}]}')] * 2)
    with pytest.raises(SearchEngineError, match="ctgov: .*malformed body: a study without"):
        engine(ClinicalTrials(), fake, retries=1).ranked_ids("aspirin", 5)


def test_eutils_error_field_fails_at_once(fake):
    fake.inject(Fault(200, body=esearch_error_body("Invalid query syntax")))
    with pytest.raises(SearchEngineError, match="pubmed: query 'aspirin': the engine refused it: Invalid"):
        engine(PubMed(), fake).ranked_ids("aspirin", 5)
    assert fake.request_count == 1


def test_timeouts_and_refused_connections_are_retried(fake):
    fake.inject(Fault(200, delay_s=2.0))
    assert engine(PubMed(), fake, timeout_s=0.2).ranked_ids("aspirin", 5) == ["1002", "1004"]
    assert fake.request_count == 2
    clock = FakeClock()
    closed = SearchEngine(PubMed(), url=f"http://127.0.0.1:{free_port()}/", rate_per_s=0.0,
                          timeout_s=RetrievalConfig().timeout_s, retries=1, clock=clock, sleep=clock.sleep)
    with pytest.raises(SearchEngineError, match="failed after 2 attempts; last: ConnectionRefusedError"):
        closed.ranked_ids("aspirin", 5)


def test_blank_query_makes_no_request(fake):
    assert engine(PubMed(), fake).search(["  ", ""], k=5) == [[], []]
    assert fake.request_count == 0


def test_api_key_from_the_environment_is_sent_and_raises_the_rate(fake, monkeypatch):
    assert engine(PubMed(), fake, rate_per_s=0).limiter.interval == pytest.approx(1 / 3)
    monkeypatch.setenv("NCBI_API_KEY", "secret")
    search = engine(PubMed(tool="searchrl", email="a@b.c"), fake, rate_per_s=0)
    assert search.limiter.interval == pytest.approx(1 / 10)
    search.ranked_ids("aspirin", 2)
    params = fake.requests[-1].params
    assert (params["api_key"], params["tool"], params["email"]) == ("secret", "searchrl", "a@b.c")
    assert engine(ClinicalTrials(), fake, rate_per_s=0).limiter.interval == pytest.approx(60 / 50)


def test_rate_limiter_reserves_slots_across_threads():
    sleeps = []
    limiter = RateLimiter(4.0, clock=lambda: 0.0, sleep=sleeps.append)
    threads = [threading.Thread(target=limiter.wait) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(sleeps) == pytest.approx([i / 4 for i in range(1, 8)])  # the first slot needs no sleep
    clock = FakeClock()
    limiter = RateLimiter(4.0, clock=clock, sleep=clock.sleep)
    limiter.wait(), limiter.wait()
    clock.now += 10.0
    limiter.wait()
    assert clock.sleeps == [0.25]  # an idle gap leaves no backlog (no bursts either)


@pytest.mark.parametrize("workers", [1, 4])
def test_engine_spaces_real_requests(fake, workers):
    search = SearchEngine(PubMed(), url=fake.url, rate_per_s=20.0, timeout_s=RetrievalConfig().timeout_s,
                          retries=RetrievalConfig().retries, workers=workers)
    start = time.monotonic()
    search.search([f"aspirin {i}" for i in range(5)], k=2)
    assert time.monotonic() - start >= 4 / 20
    times = sorted(r.time for r in fake.requests)
    assert len(times) == 5 and times[-1] - times[0] >= 4 / 20 / 2  # server-side, with room for jitter


def test_batch_error_propagates_from_worker_threads(fake):
    fake.inject(Fault(404, body=b"no such route"))
    with pytest.raises(SearchEngineError, match="HTTP 404: no such route"):
        engine(PubMed(), fake, workers=4).search(["aspirin", "cancer", "lung"], k=2)


def test_cache_answers_repeats_and_prefixes_without_requests(fake, tmp_path):
    path = tmp_path / "engines.jsonl"
    search = engine(PubMed(), fake, cache=str(path))
    first = search.search(["cancer"], k=3)
    assert fake.request_count == 1
    assert search.search(["cancer"], k=3) == first
    assert ids(search.search(["cancer"], k=2)) == [["1003", "1001"]]  # prefix of the k=3 result
    assert ids(search.search(["nothing matches"], k=2)) == [[]]
    assert search.search(["nothing matches"], k=2) == [[]]  # the empty result is cached too
    assert fake.request_count == 2
    search.search(["cancer"], k=5)  # a larger k asks again
    assert fake.request_count == 3
    engine(ClinicalTrials(), fake, cache=search.cache).search(["cancer"], k=3)  # another engine, own entry
    assert fake.request_count == 4
    search.close()
    reopened = engine(PubMed(), fake, cache=str(path))
    assert ids(reopened.search(["cancer", "nothing matches"], k=4)) == [["1003", "1001", "1002", "1005"], []]
    assert fake.request_count == 4
    assert engine(PubMed(sort="relevance"), fake, cache=reopened.cache).ranked_ids("cancer", 1) == ["1003"]
    assert fake.request_count == 5  # another sort order is another result


def test_cache_tolerates_a_torn_last_line(tmp_path):
    path = tmp_path / "cache.jsonl"
    good = json.dumps({"engine": "pubmed", "query": "a", "k": 2, "ids": ["1", "2"]})
    path.write_text(good + "\n" + good[:25])  # a crash in the middle of the second write
    with pytest.warns(UserWarning, match=r"skipped 1 torn or undecodable line\(s\): \[2\]"):
        cache = SearchCache(path)
    assert cache.get("pubmed", "a", 1) == ["1"]
    cache.put("pubmed", "b", 3, ["7", "8", "9"])
    cache.put("pubmed", "b", 2, ["7", "8"])  # already answered by the k=3 entry: not written
    cache.close()
    with pytest.warns(UserWarning, match=r"\[2\]"):
        cache = SearchCache(path)
    assert len(cache) == 2
    assert (cache.get("pubmed", "a", 2), cache.get("pubmed", "b", 3)) == (["1", "2"], ["7", "8", "9"])
    assert cache.get("pubmed", "a", 3) is None
    cache.close()
    assert len(path.read_text().splitlines()) == 3


def test_cache_is_thread_safe(tmp_path):
    cache = SearchCache(tmp_path / "cache.jsonl")

    def fill(t):
        for i in range(25):
            cache.put("ctgov", f"q{t}-{i}", 2, [f"NCT{t}", f"NCT{i}"])
            assert cache.get("ctgov", f"q{t}-{i}", 2) == [f"NCT{t}", f"NCT{i}"]

    threads = [threading.Thread(target=fill, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cache.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reopened = SearchCache(tmp_path / "cache.jsonl")
    assert len(reopened) == 150 and reopened.get("ctgov", "q5-24", 1) == ["NCT5"]


@pytest.mark.parametrize("kind, expected", [("pubmed", ["1003", "1001"]),
                                            ("ctgov", ["NCT00000002", "NCT00000000"])])
def test_make_retriever_builds_engines(fake, tmp_path, kind, expected):
    options = {"pubmed": PubMedOptions, "ctgov": ClinicalTrialsOptions}[kind]
    retriever = make_retriever(RetrievalConfig(kind=kind, url=fake.url, retries=1, options=options(
        cache_path=str(tmp_path / "c.jsonl"), rate_per_s=1000.0, page_size=1)))
    assert isinstance(retriever, SearchEngine) and retriever.api.page_size == 1
    assert ids(retriever.search(["cancer"], k=2)) == [expected]
    assert fake.request_count == 2  # one id a page
    assert ids(retriever.search(["cancer"], k=2)) == [expected] and fake.request_count == 2
    with pytest.raises(ValueError, match="unknown search engine 'bing'"):
        make_engine("bing", RetrievalConfig())


def test_an_engines_options_are_its_own_group_checked_when_the_config_is_parsed():
    """The cache, the rate and the API's options are `config.retrieval.options`, the group the engine's kind
    declares: the presets' parse into it, and an unknown key or a value out of range is one line naming it."""
    pubmed = run_config.parse(deepretrieval.get_config("literature")).retrieval
    assert pubmed.kind == "pubmed" and pubmed.options == PubMedOptions(cache_path="/data/cache/pubmed.jsonl")
    ctgov = run_config.parse(deepretrieval.get_config("literature_ctgov")).retrieval
    assert ctgov.options == ClinicalTrialsOptions(cache_path="/data/cache/ctgov.jsonl")
    for options, message in [
            (dict(rate_per_s=-1.0), "config.retrieval.options.rate_per_s=-1.0 is out of range: allowed [0, "),
            (dict(page_size=0), "config.retrieval.options.page_size=0 is out of range: allowed [1, 10000]"),
            (dict(cache="c.jsonl"), "config.retrieval.options: unknown key(s) ['cache']; known: ")]:
        config = deepretrieval.get_config("literature")
        config.retrieval.options.update(options)
        with pytest.raises(ConfigError) as error:
            run_config.parse(config)
        assert str(error.value).startswith(message) and "\n" not in str(error.value), error.value
    with pytest.raises(TypeError, match="options of retriever kind 'ctgov' must be a ClinicalTrialsOptions"):
        RetrievalConfig(kind="ctgov", options={"cache_path": "c.jsonl"})


def test_parsers_and_retry_after():
    empty = {"esearchresult": {"count": "0", "retmax": "0", "retstart": "0", "idlist": [],
                               "warninglist": {"outputmessages": ["No items found."]}}}
    assert parse_esearch(empty, 0) == ([], None)
    assert parse_esearch({"esearchresult": {"count": "5", "idlist": ["3", "4"]}}, 2) == (["3", "4"], 4)
    assert parse_studies({"studies": []}) == ([], None)
    with pytest.raises(Malformed):
        parse_studies({"studies": [], "nextPageToken": 7})
    assert retry_after_s("3") == 3.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:05 GMT", now=1445412480.0) == 5.0
    assert retry_after_s("soon") is None and retry_after_s(None) is None


def get(url):
    """(status, decoded JSON or raw bytes) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status, data = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read()
    try:
        return status, json.loads(data)
    except json.JSONDecodeError:
        return status, data


def test_fake_server_speaks_the_real_formats(fake):
    status, body = get(fake.url + "esearch.fcgi?db=pubmed&term=&retmode=json")
    assert (status, body["esearchresult"]) == (200, {"ERROR": "Empty term and query_key - nothing todo"})
    status, body = get(fake.url + "esearch.fcgi?db=pubmed&term=cancer&retstart=9999&retmode=json")
    assert body["esearchresult"]["ERROR"].startswith("Search Backend failed")
    status, body = get(fake.url + "esearch.fcgi?db=pubmed&term=cancer&retmode=json&retmax=2")
    assert body["esearchresult"] | {"querytranslation": ""} == {
        "count": "4", "retmax": "2", "retstart": "0", "idlist": ["1003", "1001"], "translationset": [],
        "querytranslation": ""}
    assert get(fake.url + "studies?query.term=x&pageToken=nope") == (400, b"invalid pageToken")
    fake.inject(Fault(429))
    assert get(fake.url + "esearch.fcgi?term=a") == (429, {"error": "API rate limit exceeded", "count": "11"})


def studies(*ids, token=None):
    """A scripted /studies page."""
    return Fault(200, body=json.dumps(studies_body(list(ids), token)).encode())


@pytest.mark.parametrize("body", [
    b"[" * 100_000,  # nested too deep: RecursionError in the decoder
    b'{"esearchresult": {"count": "\xc2\xb2", "idlist": []}}',  # a superscript two: not an ASCII digit
    b'{"esearchresult": {"count": ' + b"9" * 5000 + b', "idlist": []}}',  # past int()'s 4,300 digits
    b'{"esearchresult": {"count": "' + b"9" * 5000 + b'", "idlist": []}}',
    b'{"esearchresult": {"count": "1_0", "idlist": ["1"]}}',
    b'{"esearchresult": {"count": "2", "idlist": ["1", "\xd9\xa3"]}}',  # an Arabic-Indic digit
    b'{"esearchresult": {"count": "1", "idlist": ["' + b"1" * 100 + b'"]}}',  # not an id
])
def test_hostile_bodies_are_retried_engine_errors(fake, body):
    fake.inject(*[Fault(200, body=body)] * 2)
    with pytest.raises(SearchEngineUnavailable, match="failed after 2 attempts; last: malformed body"):
        engine(PubMed(), fake, retries=1).ranked_ids("aspirin", 5)


def test_hostile_study_pages_are_retried_engine_errors(fake):
    for study in ([{"protocolSection": {"identificationModule": {"nctId": ["NCT1"]}}}],
                  [{"protocolSection": {"identificationModule": {"nctId": "NCT 1\n"}}}]):
        fake.inject(Fault(200, body=json.dumps({"studies": study}).encode()))
        assert engine(ClinicalTrials(), fake).ranked_ids("aspirin", 5) == ["NCT00000001", "NCT00000003"]
    fake.inject(Fault(200, body=json.dumps({"studies": [], "nextPageToken": "\u00e9" * 3}).encode()))
    assert engine(ClinicalTrials(), fake).ranked_ids("aspirin", 5) == ["NCT00000001", "NCT00000003"]


@pytest.mark.parametrize("value, wait", [("\u00b2", 0.5), ("99999999999", 60.0), ("9" * 5000, 60.0),
                                         ("Fri, 31 Dec 9999 23:59:59 GMT", 60.0), ("-3", 0.5)])
def test_retry_after_is_validated_and_capped(fake, value, wait):
    assert MAX_RETRY_AFTER_S == 60.0
    fake.inject(Fault(429, retry_after=value))
    clock = FakeClock()
    assert engine(PubMed(), fake, clock).ranked_ids("aspirin", 5) == ["1002", "1004"]
    assert clock.backoffs() == [wait]  # an invalid value: the backoff


def test_a_trickled_body_is_cut_off_at_the_deadline(fake):
    fake.inject(Fault(200, body=b'{"esearchresult": {"count": "0", "idlist": []}}', trickle_s=0.05))
    start = time.monotonic()
    assert engine(PubMed(), fake, timeout_s=0.3).ranked_ids("aspirin", 5) == ["1002", "1004"]
    assert time.monotonic() - start < 2.0  # the trickle alone takes 2.4 s
    assert fake.request_count == 2


def test_a_body_over_the_cap_is_not_read_and_is_retried(fake):
    search = engine(PubMed(), fake, retries=1)
    search.max_body_bytes = 1000
    huge = json.dumps({"esearchresult": {"count": "1", "idlist": ["1" * 50_000]}}).encode()
    fake.inject(Fault(200, body=huge))
    assert search.ranked_ids("aspirin", 5) == ["1002", "1004"]
    fake.inject(*[Fault(200, body=huge)] * 2)
    with pytest.raises(SearchEngineUnavailable, match="last: a body of 50049 bytes, more than 1000"):
        search.ranked_ids("lung", 5)


def test_ctgov_paging_stops_on_a_repeated_token_or_the_page_budget(fake):
    fake.inject(studies("NCT1", token="same"), studies("NCT2", token="same"))
    assert engine(ClinicalTrials(), fake).ranked_ids("aspirin", 100) == ["NCT1", "NCT2"]
    assert fake.request_count == 2
    fake.inject(studies("NCT9", token="a"), studies("NCT9", token="b"))
    assert engine(ClinicalTrials(), fake).ranked_ids("cancer", 100) == ["NCT9"]  # nothing new: stop
    assert fake.request_count == 4
    fake.inject(*[studies(f"NCT{i}", token=f"t{i}") for i in range(10, 20)])
    found = engine(ClinicalTrials(page_size=10), fake).ranked_ids("lung", 10)  # 2 * ceil(10 / 10) + 1 pages
    assert found == ["NCT10", "NCT11", "NCT12"] and fake.request_count == 7


def test_a_lone_surrogate_query_is_refused_without_a_request(fake):
    with pytest.raises(SearchEngineError, match=r"query 'aspirin \\ud800' is not valid text"):
        engine(PubMed(), fake).ranked_ids("aspirin \ud800", 5)
    assert fake.request_count == 0


def test_pubmed_dates_are_request_parameters_not_query_text(fake, tmp_path):
    search = engine(PubMed(), fake, cache=str(tmp_path / "cache.jsonl"))
    dated = search.published_between("1970/01/01", "2019/05/01")
    assert dated.ranked_ids('aspirin"', 5) == ["1002", "1004"]
    assert fake.requests[-1].params == {
        "db": "pubmed", "term": 'aspirin"', "retmode": "json", "retstart": "0", "retmax": "5",
        "datetype": "pdat", "mindate": "1970/01/01", "maxdate": "2019/05/01"}
    assert search.ranked_ids('aspirin"', 5) == ["1002", "1004"] and fake.request_count == 2  # own entries
    assert "datetype" not in fake.requests[-1].params
    assert dated.limiter is search.limiter and dated.cache is search.cache
    assert dated.api.cache_name == "pubmed?pdat=1970/01/01:2019/05/01"
    assert PubMed(sort="relevance").published_between("2000", "2001/02").cache_name == \
        "pubmed?sort=relevance&pdat=2000:2001/02"
    with pytest.raises(ValueError, match="maxdate must be YYYY, YYYY/MM or YYYY/MM/DD, got '2019-05-01'"):
        PubMed().published_between("1970/01/01", "2019-05-01")
    with pytest.raises(ValueError, match="ctgov has no publication-date filter"):
        engine(ClinicalTrials(), fake).published_between("1970/01/01", "2019/05/01")


@pytest.mark.parametrize("line", [
    b"[" * 100_000 + b"\n",
    b'{"engine": "pubmed", "query": "a", "k": 3, "ids": [1, null, {"a": 1}]}\n',
    b'{"engine": "pubmed", "query": "a", "k": true, "ids": ["1"]}\n',
    b'{"engine": "pubmed", "query": "a", "k": ' + b"9" * 5000 + b', "ids": ["1"]}\n',
    b"\xff\xfe\n",
])
def test_cache_skips_lines_of_the_wrong_shape(tmp_path, line):
    path = tmp_path / "cache.jsonl"
    good = json.dumps({"engine": "pubmed", "query": "b", "k": 1, "ids": ["7"]}).encode() + b"\n"
    path.write_bytes(line + good)
    with pytest.warns(UserWarning, match=r"skipped 1 torn or undecodable line\(s\): \[1\]"):
        cache = SearchCache(path)
    assert cache.get("pubmed", "a", 1) is None and cache.get("pubmed", "b", 1) == ["7"]
    cache.close()


def test_a_cache_file_rewritten_under_it_is_a_miss(tmp_path):
    path = tmp_path / "cache.jsonl"
    cache = SearchCache(path)
    cache.put("pubmed", "a", 2, ["1", "2"])
    cache.put("pubmed", "b", 2, ["3", "4"])
    path.write_bytes(b"garbage\n" * 20)  # another process rewrote the file in place
    assert cache.get("pubmed", "a", 2) is None and cache.get("pubmed", "b", 1) is None
    good = json.dumps({"engine": "pubmed", "query": "b", "k": 2, "ids": ["3", "4"]}).encode() + b"\n"
    path.write_bytes(good + good)  # the same offsets now hold another entry's line
    assert cache.get("pubmed", "a", 2) is None
    cache.close()
