"""Literature search engines as Retrievers: PubMed (NCBI E-utilities ESearch) and ClinicalTrials.gov (API v2),
the engines DeepRetrieval rewards a rewritten query against (Recall@3000 of the ranked ids).

A `SearchEngine` pages through one API until it has k ids, spacing every request with a shared
`RateLimiter`, retrying transient failures with exponential backoff, and remembering each (engine, query, k)
in a `SearchCache` so a training run never asks twice. Hits carry the engine's ids in its order, score
1 / rank (rank 1 first), and no title or text (ESearch and NCTId-only study pages return ids alone).
Stdlib only (urllib).
"""
from __future__ import annotations

import concurrent.futures
import email.utils
import http.client
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from typing import Any, Callable, Protocol, Sequence

from searchrl.retrieval import RETRIEVERS, RetrievalConfig
from searchrl.retrieval.types import Hit, RetrievalError, RetrievalUnavailable

Cursor = int | str | None  # the next page: ESearch's retstart or CT.gov's pageToken; None: the first page
PUBMED_URL = "https://eutils.ncbi.nlm.nih.gov/entrez/eutils/"
CTGOV_URL = "https://clinicaltrials.gov/api/v2/"
PUBMED_RATE, PUBMED_RATE_WITH_KEY = 3.0, 10.0  # NCBI: 3 requests/s per IP, 10 with an API key
CTGOV_RATE = 50 / 60  # ClinicalTrials.gov: about 50 requests per minute per IP
PUBMED_MAX_RESULTS = 9_999  # ESearch refuses retstart > 9998: only a query's first 9,999 PubMed records
PUBMED_PAGE_SIZE = 10_000  # the most ids one ESearch response holds
CTGOV_PAGE_SIZE = 1_000  # the largest page API v2 serves (a larger pageSize is coerced down)
_HEADERS = {"User-Agent": "searchrl", "Accept": "application/json"}


class SearchEngineError(RetrievalError):
    """A search that failed for good: a refused request (4xx other than 429, an E-utilities ERROR)."""


class SearchEngineUnavailable(SearchEngineError, RetrievalUnavailable):
    """Transient failures (429, 5xx, timeouts, dropped connections, malformed bodies) outlasted the retries."""


class Malformed(ValueError):
    """A body that is not what the API documents (retried: proxies and overloaded servers send such)."""


class Refused(ValueError):
    """The API answered that it will not run the query (not retried: asking again gets the same answer)."""


class _Transient(Exception):
    """A failed attempt worth retrying, with the server's Retry-After (seconds) when it sent one."""

    def __init__(self, problem: str, wait_s: float | None = None):
        super().__init__(problem)
        self.wait_s = wait_s


def short(query: str, limit: int = 80) -> str:
    """A query quoted for an error message, truncated to about `limit` characters."""
    return repr(query if len(query) <= limit else query[:limit] + "...")


def parse_esearch(body: Any, retstart: int) -> tuple[list[str], Cursor]:
    """An ESearch JSON body -> (this page's PMIDs, the next page's retstart or None when no more)."""
    if isinstance(body, dict) and "error" in body:
        raise Refused(str(body["error"]))
    result = body.get("esearchresult") if isinstance(body, dict) else None
    if not isinstance(result, dict):
        raise Malformed(f'expected {{"esearchresult": {{...}}}}, got {body!r:.200}')
    if "ERROR" in result:
        raise Refused(str(result["ERROR"]))
    ids, count = result.get("idlist"), str(result.get("count", ""))
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or not count.isdigit():
        raise Malformed(f'expected "count" and an "idlist" of strings, got {result!r:.200}')
    end = retstart + len(ids)
    return ids, end if ids and end < min(int(count), PUBMED_MAX_RESULTS) else None


def parse_studies(body: Any) -> tuple[list[str], Cursor]:
    """A ClinicalTrials.gov /studies JSON body -> (this page's NCT ids, the next page's token or None)."""
    studies = body.get("studies") if isinstance(body, dict) else None
    if not isinstance(studies, list):
        raise Malformed(f'expected {{"studies": [...]}}, got {body!r:.200}')
    ids = []
    for study in studies:
        try:
            nct_id = study["protocolSection"]["identificationModule"]["nctId"]
        except (KeyError, TypeError):
            nct_id = None
        if not isinstance(nct_id, str):
            raise Malformed(f"a study without protocolSection.identificationModule.nctId: {study!r:.200}")
        ids.append(nct_id)
    token = body.get("nextPageToken")
    if token is not None and not isinstance(token, str):
        raise Malformed(f'"nextPageToken" must be a string, got {token!r:.100}')
    return ids, token or None


class LiteratureAPI(Protocol):
    """What a `SearchEngine` needs to know about one search API."""

    name: str  # in error messages
    cache_name: str  # the cache's engine key: `name` plus any option that changes the results
    default_url: str
    default_rate_per_s: float
    max_results: int  # the most ids one query can get
    path: str  # appended to the base URL

    def params(self, query: str, cursor: Cursor, want: int) -> dict[str, str]:
        """The query string for the page at `cursor`, asking for up to `want` ids."""
        ...

    def parse(self, body: Any, cursor: Cursor) -> tuple[list[str], Cursor]:
        """A decoded body -> (ids, next cursor or None); raises Malformed or Refused."""
        ...


class PubMed:
    """NCBI E-utilities ESearch on db=pubmed. `api_key` (default: $NCBI_API_KEY) raises the rate limit to
    10/s; `sort` ("" = ESearch's default order, as DeepRetrieval uses; or relevance, pub_date, ...);
    `tool`/`email` identify the caller to NCBI. A date filter belongs in the term, e.g.
    `... AND ("1970/01/01"[dp] : "2020/12/31"[dp])`."""

    name = "pubmed"
    default_url = PUBMED_URL
    max_results = PUBMED_MAX_RESULTS
    path = "esearch.fcgi"

    def __init__(self, api_key: str | None = None, sort: str = "", tool: str = "", email: str = "",
                 page_size: int = PUBMED_PAGE_SIZE):
        if not 1 <= page_size <= PUBMED_PAGE_SIZE:
            raise ValueError(f"pubmed: page_size must be in [1, {PUBMED_PAGE_SIZE}], got {page_size}")
        self.api_key = os.environ.get("NCBI_API_KEY", "") if api_key is None else api_key
        self.sort, self.tool, self.email, self.page_size = sort, tool, email, page_size
        self.cache_name = f"pubmed?sort={sort}" if sort else "pubmed"
        self.default_rate_per_s = PUBMED_RATE_WITH_KEY if self.api_key else PUBMED_RATE

    def params(self, query: str, cursor: Cursor, want: int) -> dict[str, str]:
        retstart = int(cursor or 0)
        retmax = min(want, self.page_size, PUBMED_MAX_RESULTS - retstart)
        params = {"db": "pubmed", "term": query, "retmode": "json", "retstart": str(retstart),
                  "retmax": str(retmax)}
        optional = {"sort": self.sort, "tool": self.tool, "email": self.email, "api_key": self.api_key}
        return params | {name: value for name, value in optional.items() if value}

    def parse(self, body: Any, cursor: Cursor) -> tuple[list[str], Cursor]:
        return parse_esearch(body, int(cursor or 0))


class ClinicalTrials:
    """ClinicalTrials.gov API v2 GET /studies with query.term, NCT ids only, following nextPageToken."""

    name = cache_name = "ctgov"
    default_url = CTGOV_URL
    default_rate_per_s = CTGOV_RATE
    max_results = sys.maxsize  # no limit: every page of a query can be read
    path = "studies"

    def __init__(self, page_size: int = CTGOV_PAGE_SIZE):
        if not 1 <= page_size <= CTGOV_PAGE_SIZE:
            raise ValueError(f"ctgov: page_size must be in [1, {CTGOV_PAGE_SIZE}], got {page_size}")
        self.page_size = page_size

    def params(self, query: str, cursor: Cursor, want: int) -> dict[str, str]:
        params = {"query.term": query, "pageSize": str(min(want, self.page_size)), "fields": "NCTId",
                  "format": "json"}
        return params | {"pageToken": str(cursor)} if cursor is not None else params

    def parse(self, body: Any, cursor: Cursor) -> tuple[list[str], Cursor]:
        return parse_studies(body)


class RateLimiter:
    """At most `rate_per_s` requests a second: each `wait()` reserves the next free slot, 1 / rate after the
    previous one, and sleeps until it (no bursts). Thread-safe; `clock` and `sleep` are injectable."""

    def __init__(self, rate_per_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be positive, got {rate_per_s}")
        self.interval = 1.0 / rate_per_s
        self.clock, self.sleep = clock, sleep
        self._next = float("-inf")
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = self.clock()
            slot = max(now, self._next)
            self._next = slot + self.interval
        if slot > now:
            self.sleep(slot - now)


class SearchCache:
    """(engine, query, k) -> ranked ids in an append-only JSONL file, one {"engine", "query", "k", "ids"}
    object a line; a result for a larger k serves a smaller k (its prefix).

    Crash-safe: a line is written with one append and fsync'd, so a crash can tear only the last line, which
    the next load skips with a warning (as it does any undecodable line). Memory holds only the index, each
    entry's offset in the file; ids are read back on a hit. Thread-safe. One writing process per file: give
    each process of a multi-process run its own path.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._index: dict[tuple[str, str], tuple[int, int, int]] = {}  # -> (k, offset, length)
        self._lock = threading.Lock()
        self._writer = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._reader = os.open(self.path, os.O_RDONLY)
        self._needs_newline = self._load()

    def _load(self) -> bool:
        """Indexes the file; True when it ends in a torn line (the next write starts a new line)."""
        offset, bad, last = 0, [], b"\n"
        with open(self.path, "rb") as f:
            for number, line in enumerate(f, 1):
                record = _decode(line)
                if record is None:
                    bad.append(number)
                else:
                    self._remember(record["engine"], record["query"], record["k"], offset, len(line))
                offset, last = offset + len(line), line
        if bad:
            warnings.warn(f"{self.path}: skipped {len(bad)} torn or undecodable line(s): {bad[:10]}",
                          stacklevel=3)
        return not last.endswith(b"\n")

    def _remember(self, engine: str, query: str, k: int, offset: int, length: int) -> None:
        known = self._index.get((engine, query))
        if known is None or k >= known[0]:
            self._index[(engine, query)] = (k, offset, length)

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def get(self, engine: str, query: str, k: int) -> list[str] | None:
        """The first k ids cached for (engine, query) under some k' >= k; None when there are none."""
        with self._lock:
            entry = self._index.get((engine, query))
        if entry is None or entry[0] < k:
            return None
        _, offset, length = entry
        return json.loads(os.pread(self._reader, length, offset))["ids"][:k]

    def put(self, engine: str, query: str, k: int, ids: Sequence[str]) -> None:
        """Appends a result, unless one for at least this k is already cached."""
        line = json.dumps({"engine": engine, "query": query, "k": k, "ids": list(ids)}).encode() + b"\n"
        with self._lock:
            known = self._index.get((engine, query))
            if known is not None and known[0] >= k:
                return
            data = b"\n" + line if self._needs_newline else line
            _write_all(self._writer, data)
            os.fsync(self._writer)
            self._needs_newline = False
            end = os.lseek(self._writer, 0, os.SEEK_CUR)
            self._remember(engine, query, k, end - len(line), len(line))

    def close(self) -> None:
        with self._lock:
            for fd in (self._writer, self._reader):
                os.close(fd)


def _decode(line: bytes) -> dict[str, Any] | None:
    """A complete, well-formed cache line, else None."""
    if not line.endswith(b"\n"):
        return None
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    valid = (isinstance(record, dict) and isinstance(record.get("engine"), str)
             and isinstance(record.get("query"), str) and isinstance(record.get("k"), int)
             and isinstance(record.get("ids"), list))
    return record if valid else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _error_message(error: urllib.error.HTTPError) -> str:
    """The server's {"error": ...} message, else the start of its raw body."""
    try:
        text = error.read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return ""
    try:
        return str(json.loads(text)["error"])
    except (json.JSONDecodeError, KeyError, TypeError):
        return text[:300]


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header (delay seconds, or an HTTP date) in seconds from now; None when absent or bad."""
    if value is None:
        return None
    if value.strip().isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


class SearchEngine:
    """A Retriever over a literature search API: for each query, up to k ids in the engine's rank order.

    `url` ("": the API's own), `rate_per_s`, `timeout_s` and `retries` are a `RetrievalConfig`'s. Every
    request waits on one `RateLimiter` (rate_per_s; 0: the API's default). A 429, a 5xx, a timeout, a
    dropped connection or a malformed body is retried `retries` times, after backoff_s * 2**(attempt - 1)
    seconds, or after the server's Retry-After when it sends one; any other 4xx, or an answer that refuses
    the query (E-utilities' ERROR), raises SearchEngineError at once. A blank query gets no hits and no
    request. The queries of a batch run on up to `workers` threads (duplicates once), so latency overlaps
    while the limiter keeps the rate. `cache` (a SearchCache or a path; None: none) answers repeats without a
    request; a result shorter than its k holds all the engine has, so it answers every k.
    """

    def __init__(self, api: LiteratureAPI, *, url: str, rate_per_s: float, timeout_s: float, retries: int,
                 backoff_s: float = 1.0, cache: SearchCache | str | os.PathLike | None = None,
                 workers: int = 4,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.api = api
        self.url = (url or api.default_url).rstrip("/") + "/"
        self.limiter = RateLimiter(rate_per_s or api.default_rate_per_s, clock, sleep)
        self.timeout_s, self.retries, self.backoff_s, self.workers = timeout_s, retries, backoff_s, workers
        self.cache = SearchCache(cache) if isinstance(cache, (str, os.PathLike)) else cache
        self.sleep = sleep

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """For each query, up to k hits: the engine's ids in its order, score 1 / rank."""
        unique = list(dict.fromkeys(queries))
        if len(unique) <= 1 or self.workers <= 1:
            found = {q: self.ranked_ids(q, k) for q in unique}
        else:
            with concurrent.futures.ThreadPoolExecutor(min(self.workers, len(unique))) as pool:
                futures = {q: pool.submit(self.ranked_ids, q, k) for q in unique}
                try:
                    found = {q: future.result() for q, future in futures.items()}
                except BaseException:
                    for future in futures.values():
                        future.cancel()
                    raise
        return [[Hit(id=i, score=1.0 / rank) for rank, i in enumerate(found[q], 1)] for q in queries]

    def ranked_ids(self, query: str, k: int) -> list[str]:
        """Up to k ids for one query, from the cache or the API (then cached)."""
        if k < 1:
            raise ValueError(f"{self.api.name}: k must be at least 1, got {k}")
        if not query.strip():
            return []
        k = min(k, self.api.max_results)
        if self.cache is not None:
            cached = self.cache.get(self.api.cache_name, query, k)
            if cached is not None:
                return cached
        ids = self._fetch(query, k)
        if self.cache is not None:  # fewer than k ids are all there are: cached as the answer for any k
            self.cache.put(self.api.cache_name, query, k if len(ids) == k else self.api.max_results, ids)
        return ids

    def close(self) -> None:
        """Closes the cache (also when it was passed in, shared)."""
        if self.cache is not None:
            self.cache.close()

    def _fetch(self, query: str, k: int) -> list[str]:
        """Pages until k distinct ids or the last page; ids repeated across pages count once."""
        ids: dict[str, None] = {}
        cursor: Cursor = None
        while len(ids) < k:
            page, cursor = self._page(query, cursor, k - len(ids))
            ids.update(dict.fromkeys(page))
            if cursor is None or not page:
                break
        return list(ids)[:k]

    def _page(self, query: str, cursor: Cursor, want: int) -> tuple[list[str], Cursor]:
        """One page, rate-limited and retried."""
        url = self.url + self.api.path + "?" + urllib.parse.urlencode(self.api.params(query, cursor, want))
        request = urllib.request.Request(url, headers=_HEADERS)
        where = f"{self.api.name}: query {short(query)}"
        last = _Transient("no attempt")
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1) if last.wait_s is None else last.wait_s)
            self.limiter.wait()
            try:
                return self._attempt(request, cursor, where)
            except _Transient as e:
                last = e
        raise SearchEngineUnavailable(f"{where}: failed after {self.retries + 1} attempts; last: {last}")

    def _attempt(self, request: urllib.request.Request, cursor: Cursor,
                 where: str) -> tuple[list[str], Cursor]:
        """One request: the parsed page, _Transient for what is worth retrying, else SearchEngineError."""
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                data = response.read()
        except urllib.error.HTTPError as e:
            message = _error_message(e)
            if e.code != 429 and e.code < 500:
                raise SearchEngineError(f"{where}: HTTP {e.code}: {message}") from None
            wait_s = retry_after_s(e.headers.get("Retry-After"))
            raise _Transient(f"HTTP {e.code}: {message}", wait_s) from None
        except (OSError, http.client.HTTPException) as e:  # timeouts, refused/reset connections, short reads
            raise _Transient(f"{type(e).__name__}: {e}") from None
        try:
            return self.api.parse(json.loads(data), cursor)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _Transient(f"malformed body ({e}): {data[:200]!r}") from None
        except Malformed as e:
            raise _Transient(f"malformed body: {e}") from None
        except Refused as e:
            raise SearchEngineError(f"{where}: the engine refused it: {e}") from None


def make_engine(kind: str, config: RetrievalConfig) -> SearchEngine:
    """The engine for `kind` "pubmed" or "ctgov" as `config` sets it up; `config.options` go to its API
    (PubMed: api_key, sort, tool, email, page_size; ctgov: page_size); an empty `config.url` is the real
    service, an empty `config.cache_path` no cache."""
    apis: dict[str, Callable[..., LiteratureAPI]] = {"pubmed": PubMed, "ctgov": ClinicalTrials}
    if kind not in apis:
        raise ValueError(f"unknown search engine {kind!r}; expected one of {sorted(apis)}")
    return SearchEngine(apis[kind](**config.options), url=config.url, rate_per_s=config.rate_per_s,
                        timeout_s=config.timeout_s, retries=config.retries, cache=config.cache_path or None)


@RETRIEVERS.register("pubmed")
def pubmed_retriever(config: RetrievalConfig) -> SearchEngine:
    """PubMed (NCBI E-utilities) as `config.retrieval.kind="pubmed"`."""
    return make_engine("pubmed", config)


@RETRIEVERS.register("ctgov")
def ctgov_retriever(config: RetrievalConfig) -> SearchEngine:
    """ClinicalTrials.gov API v2 as `config.retrieval.kind="ctgov"`."""
    return make_engine("ctgov", config)

