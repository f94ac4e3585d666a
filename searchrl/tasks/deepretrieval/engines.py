"""Literature search engines as Retrievers: PubMed (NCBI E-utilities ESearch) and ClinicalTrials.gov (API v2),
the engines DeepRetrieval rewards a rewritten query against (Recall@3000 of the ranked ids).

A `SearchEngine` pages through one API until it has k ids, spacing every request with a shared
`RateLimiter`, retrying transient failures with exponential backoff, and remembering each (engine, query, k)
in a `SearchCache` so a training run never asks twice. Hits carry the engine's ids in its order, score
1 / rank (rank 1 first), and no title or text (ESearch and NCTId-only study pages return ids alone). They are
the retriever kinds "pubmed" and "ctgov" of `config.retrieval`, whose options (the cache, the rate and the
API's own) are the groups `PubMedOptions` and `ClinicalTrialsOptions`.

No server can hold or crash a client, as with the `/retrieve` client (`searchrl.retrieval.remote`): each
attempt is over within `timeout_s` however slowly the body trickles, a Retry-After is honoured only when it
is a valid value and then for at most MAX_RETRY_AFTER_S, a body over MAX_BODY_BYTES is not read, a body of
the wrong shape (deep nesting, non-ASCII digits, huge integers, ids that are not ids) is a retried engine
error, and paging stops at a repeated page token or after a page budget. Stdlib only (http.client).
"""
from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import email.utils
import http.client
import json
import math
import os
import re
import reprlib
import sys
import threading
import time
import urllib.parse
import warnings
from typing import Any, Callable, Protocol, Sequence

from searchrl.configlib import group, ranged
from searchrl.retrieval import RetrievalConfig, register_retriever
from searchrl.retrieval.deadline import Connection, TLSConnection
from searchrl.retrieval.types import Hit, QueryRefused, RetrievalError, RetrievalUnavailable

Cursor = int | str | None  # the next page: ESearch's retstart or CT.gov's pageToken; None: the first page
PUBMED_URL = "https://eutils.ncbi.nlm.nih.gov/entrez/eutils/"
CTGOV_URL = "https://clinicaltrials.gov/api/v2/"
PUBMED_RATE, PUBMED_RATE_WITH_KEY = 3.0, 10.0  # NCBI: 3 requests/s per IP, 10 with an API key
CTGOV_RATE = 50 / 60  # ClinicalTrials.gov: about 50 requests per minute per IP
PUBMED_MAX_RESULTS = 9_999  # ESearch refuses retstart > 9998: only a query's first 9,999 PubMed records
PUBMED_PAGE_SIZE = 10_000  # the most ids one ESearch response holds
CTGOV_PAGE_SIZE = 1_000  # the largest page API v2 serves (a larger pageSize is coerced down)
MAX_RETRY_AFTER_S = 60.0  # the longest Retry-After honoured
MAX_BODY_BYTES = 8 << 20  # the largest response body read (a full ESearch page is about 150 KB)
MAX_ID_CHARS = 64  # the longest id taken from a response
MAX_TOKEN_CHARS = 4096  # the longest CT.gov page token followed
_HEADERS = {"User-Agent": "searchrl", "Accept": "application/json", "Connection": "close"}
_DATE = re.compile(r"[0-9]{4}(/[0-9]{2}(/[0-9]{2})?)?")  # E-utilities: YYYY, YYYY/MM or YYYY/MM/DD


class SearchEngineError(RetrievalError):
    """A search that failed for good: a refused request (4xx other than 429, an E-utilities ERROR)."""


class SearchEngineUnavailable(SearchEngineError, RetrievalUnavailable):
    """Transient failures (429, 5xx, timeouts, dropped connections, malformed bodies) outlasted the retries."""


class SearchEngineRefused(SearchEngineError, QueryRefused):
    """The engine refused a query for its text (an E-utilities ERROR), or it is not valid text."""


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


def brief(value: Any) -> str:
    """A bounded repr of a decoded body for error messages: deep or huge values are abbreviated."""
    return reprlib.repr(value)[:200]


def _text(value: Any) -> str:
    """An error field's text: a string as it is (shortened), anything else as `brief` shows it."""
    return value[:300] if isinstance(value, str) else brief(value)


def is_id(value: Any) -> bool:
    """Whether a response value is an id: a string of 1 to MAX_ID_CHARS printable ASCII characters, no
    spaces."""
    return (isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and value.isascii()
            and value.isprintable() and " " not in value)


def _count(value: Any) -> int | None:
    """ESearch's "count": a string of at most 18 ASCII digits (int() takes "²" and "1_0", and refuses 4,300
    digits), else None."""
    text = value if isinstance(value, str) else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def parse_esearch(body: Any, retstart: int) -> tuple[list[str], Cursor]:
    """An ESearch JSON body -> (this page's PMIDs, the next page's retstart or None when no more)."""
    if isinstance(body, dict) and "error" in body:
        raise Refused(_text(body["error"]))
    result = body.get("esearchresult") if isinstance(body, dict) else None
    if not isinstance(result, dict):
        raise Malformed(f'expected {{"esearchresult": {{...}}}}, got {brief(body)}')
    if "ERROR" in result:
        raise Refused(_text(result["ERROR"]))
    ids, count = result.get("idlist"), _count(result.get("count"))
    if not isinstance(ids, list) or count is None:
        raise Malformed(f'expected a digit-string "count" and an "idlist", got {brief(result)}')
    if not all(is_id(i) and i.isdigit() for i in ids):
        raise Malformed(f'"idlist" must hold PMIDs (digit strings), got {brief(ids)}')
    end = retstart + len(ids)
    return ids, end if ids and end < min(count, PUBMED_MAX_RESULTS) else None


def parse_studies(body: Any) -> tuple[list[str], Cursor]:
    """A ClinicalTrials.gov /studies JSON body -> (this page's NCT ids, the next page's token or None)."""
    studies = body.get("studies") if isinstance(body, dict) else None
    if not isinstance(studies, list):
        raise Malformed(f'expected {{"studies": [...]}}, got {brief(body)}')
    ids = []
    for study in studies:
        try:
            nct_id = study["protocolSection"]["identificationModule"]["nctId"]
        except (KeyError, TypeError):
            nct_id = None
        if not is_id(nct_id):
            raise Malformed(f"a study without an id at protocolSection.identificationModule.nctId: "
                            f"{brief(study)}")
        ids.append(nct_id)
    token = body.get("nextPageToken")
    if token is not None and not (isinstance(token, str) and len(token) <= MAX_TOKEN_CHARS
                                  and token.isascii() and token.isprintable()):
        raise Malformed(f'"nextPageToken" must be a printable ASCII string, got {brief(token)}')
    return ids, token or None


class LiteratureAPI(Protocol):
    """What a `SearchEngine` needs to know about one search API."""

    name: str  # in error messages
    cache_name: str  # the cache's engine key: `name` plus any option that changes the results
    default_url: str
    default_rate_per_s: float
    max_results: int  # the most ids one query can get
    page_size: int  # the most ids one page is asked for
    path: str  # appended to the base URL

    def params(self, query: str, cursor: Cursor, want: int) -> dict[str, str]:
        """The query string for the page at `cursor`, asking for up to `want` ids."""
        ...

    def parse(self, body: Any, cursor: Cursor) -> tuple[list[str], Cursor]:
        """A decoded body -> (ids, next cursor or None); raises Malformed or Refused."""
        ...


@group
class EngineOptions:
    """The `config.retrieval.options` every search engine reads beside its API's own (a subclass adds those:
    `PubMedOptions`, `ClinicalTrialsOptions`)."""

    cache_path: str = ""  # JSONL cache of ranked ids ("": no cache)
    rate_per_s: float = ranged(0.0, "[0, inf)")  # requests per second (0: the API's default)

    def api_options(self) -> dict[str, Any]:
        """The options the engine's API takes: every field but EngineOptions' own."""
        own = {field.name for field in dataclasses.fields(EngineOptions)}
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if field.name not in own}


@group
class PubMedOptions(EngineOptions):
    """`config.retrieval.options` of kind "pubmed": the engine's, and `PubMed`'s."""

    api_key: str | None = None  # None: $NCBI_API_KEY ("": none)
    sort: str = ""  # "": ESearch's default order (DeepRetrieval's); or relevance, pub_date, ...
    tool: str = ""  # tool and email identify the caller to NCBI
    email: str = ""
    page_size: int = ranged(PUBMED_PAGE_SIZE, f"[1, {PUBMED_PAGE_SIZE}]")  # ids asked for per request


@group
class ClinicalTrialsOptions(EngineOptions):
    """`config.retrieval.options` of kind "ctgov": the engine's, and `ClinicalTrials`'."""

    page_size: int = ranged(CTGOV_PAGE_SIZE, f"[1, {CTGOV_PAGE_SIZE}]")  # ids asked for per request


class PubMed:
    """NCBI E-utilities ESearch on db=pubmed. `api_key` (default: $NCBI_API_KEY) raises the rate limit to
    10/s; `sort` ("" = ESearch's default order, as DeepRetrieval uses; or relevance, pub_date, ...);
    `tool`/`email` identify the caller to NCBI. `published_between` gives the API restricted to a
    publication-date range, sent as ESearch's own parameters (`datetype=pdat`, `mindate`, `maxdate`) so that
    no query text can switch it off."""

    name = "pubmed"
    default_url = PUBMED_URL
    max_results = PUBMED_MAX_RESULTS
    path = "esearch.fcgi"
    date_range: tuple[str, str] | None = None  # (mindate, maxdate)

    def __init__(self, api_key: str | None = PubMedOptions.api_key, sort: str = PubMedOptions.sort,
                 tool: str = PubMedOptions.tool, email: str = PubMedOptions.email,
                 page_size: int = PubMedOptions.page_size):
        if not 1 <= page_size <= PUBMED_PAGE_SIZE:
            raise ValueError(f"pubmed: page_size must be in [1, {PUBMED_PAGE_SIZE}], got {page_size}")
        self.api_key = os.environ.get("NCBI_API_KEY", "") if api_key is None else api_key
        self.sort, self.tool, self.email, self.page_size = sort, tool, email, page_size
        self.cache_name = f"pubmed?sort={sort}" if sort else "pubmed"
        self.default_rate_per_s = PUBMED_RATE_WITH_KEY if self.api_key else PUBMED_RATE

    def published_between(self, mindate: str, maxdate: str) -> PubMed:
        """This API restricted to records published from `mindate` to `maxdate` (YYYY[/MM[/DD]]), with its
        own cache entries."""
        for name, date in (("mindate", mindate), ("maxdate", maxdate)):
            if not (date.isascii() and _DATE.fullmatch(date)):
                raise ValueError(f"pubmed: {name} must be YYYY, YYYY/MM or YYYY/MM/DD, got {date!r:.40}")
        dated = copy.copy(self)
        dated.date_range = (mindate, maxdate)
        separator = "&" if "?" in self.cache_name else "?"
        dated.cache_name = f"{self.cache_name}{separator}pdat={mindate}:{maxdate}"
        return dated

    def params(self, query: str, cursor: Cursor, want: int) -> dict[str, str]:
        retstart = int(cursor or 0)
        retmax = min(want, self.page_size, PUBMED_MAX_RESULTS - retstart)
        params = {"db": "pubmed", "term": query, "retmode": "json", "retstart": str(retstart),
                  "retmax": str(retmax)}
        if self.date_range is not None:
            params |= {"datetype": "pdat", "mindate": self.date_range[0], "maxdate": self.date_range[1]}
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

    def __init__(self, page_size: int = ClinicalTrialsOptions.page_size):
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
    the next load skips with a warning (as it does any undecodable line, or one of the wrong shape). It is
    only a cache: an entry whose line no longer reads back as that entry (the file was rewritten under it) is
    a miss. Memory holds only the index, each
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
        known_k, offset, length = entry
        try:
            record = _decode(os.pread(self._reader, length, offset))
        except OSError:
            return None
        if record is None or (record["engine"], record["query"], record["k"]) != (engine, query, known_k):
            return None
        return record["ids"][:k]

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
    """A complete, well-formed cache line ({"engine": str, "query": str, "k": int >= 1, "ids": [id, ...]}),
    else None."""
    if not line.endswith(b"\n"):
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, integers too long, nested too deep
        return None
    if not isinstance(record, dict):
        return None
    k, ids = record.get("k"), record.get("ids")
    valid = (isinstance(record.get("engine"), str) and isinstance(record.get("query"), str)
             and isinstance(k, int) and not isinstance(k, bool) and k >= 1
             and isinstance(ids, list) and all(is_id(i) for i in ids))
    return record if valid else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _error_message(data: bytes) -> str:
    """The server's {"error": ...} message, else the start of its raw body."""
    text = data[:4096].decode(errors="replace")
    try:
        return str(json.loads(text)["error"])[:300]
    except (ValueError, RecursionError, KeyError, TypeError):
        return text[:300]


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header (ASCII delay seconds, or an HTTP date) in seconds from now, at most
    MAX_RETRY_AFTER_S; None when absent or not a valid value."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)  # float(): no digit limit, a huge value is inf
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return min(max(0.0, when - (time.time() if now is None else now)), MAX_RETRY_AFTER_S)


def read_body(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The response's body; `BodyTooLarge` when it is over `max_bytes` (said by Content-Length or found while
    reading), so that a huge body is never read whole."""
    length = response.getheader("Content-Length", "")
    if length.isascii() and length.isdigit() and (len(length) > 18 or int(length) > max_bytes):
        raise BodyTooLarge(f"a body of {length:.20} bytes, more than {max_bytes}")
    data = response.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BodyTooLarge(f"a body of more than {max_bytes} bytes")
    return data


class BodyTooLarge(Exception):
    """A response body over the engine's `max_body_bytes` (retried: a broken proxy may send one)."""


class SearchEngine:
    """A Retriever over a literature search API: for each query, up to k ids in the engine's rank order.

    `url` ("": the API's own), `timeout_s` and `retries` are a `RetrievalConfig`'s, `rate_per_s` and `cache`
    its `EngineOptions`' (`make_engine`). Every request waits on one `RateLimiter` (rate_per_s; 0: the API's
    default) and must be over within `timeout_s`.
    A 429, a 5xx, a timeout, a dropped connection, a body over `max_body_bytes` or a malformed body is retried
    `retries` times, after backoff_s * 2**(attempt - 1) seconds, or after the server's Retry-After (at most
    MAX_RETRY_AFTER_S) when it sends a valid one; any other status raises SearchEngineError at once, and an
    answer that refuses the query (E-utilities' ERROR) SearchEngineRefused (a `QueryRefused`), as does a query
    that is not valid text (a lone surrogate). A blank query gets no hits and no request. Paging stops at k
    ids, at the last page, at a page that adds no new id or repeats a page token, or after 2 * ceil(k /
    page_size) + 1 pages. The queries of a batch run on up to `workers` threads (duplicates once), so latency
    overlaps while the limiter keeps the rate. `cache` (a SearchCache or a path; None: none) answers repeats
    without a request; a result shorter than its k holds all the engine has, so it answers every k.
    """

    def __init__(self, api: LiteratureAPI, *, url: str, rate_per_s: float, timeout_s: float, retries: int,
                 backoff_s: float = 1.0, cache: SearchCache | str | os.PathLike | None = None,
                 workers: int = 4,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.api = api
        self.url = (url or api.default_url).rstrip("/") + "/"
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{api.name}: the url must be http(s)://HOST[:PORT]/PATH, got {self.url!r}")
        self._connection = TLSConnection if parts.scheme == "https" else Connection
        self._host, self._port, self._base_path = parts.hostname, parts.port, parts.path
        self.max_body_bytes = MAX_BODY_BYTES
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
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as e:
            raise SearchEngineRefused(f"{self.api.name}: query {short(query)} is not valid text (character "
                                    f"{e.start + 1} is a lone surrogate)") from None
        k = min(k, self.api.max_results)
        if self.cache is not None:
            cached = self.cache.get(self.api.cache_name, query, k)
            if cached is not None:
                return cached
        ids = self._fetch(query, k)
        if self.cache is not None:  # fewer than k ids are all there are: cached as the answer for any k
            self.cache.put(self.api.cache_name, query, k if len(ids) == k else self.api.max_results, ids)
        return ids

    def published_between(self, mindate: str, maxdate: str) -> SearchEngine:
        """This engine restricted to records published from `mindate` to `maxdate`, sharing its rate limiter
        and cache; ValueError when its API has no publication-date filter."""
        restrict = getattr(self.api, "published_between", None)
        if restrict is None:
            raise ValueError(f"{self.api.name} has no publication-date filter")
        dated = copy.copy(self)
        dated.api = restrict(mindate, maxdate)
        return dated

    def close(self) -> None:
        """Closes the cache (also when it was passed in, shared)."""
        if self.cache is not None:
            self.cache.close()

    def _fetch(self, query: str, k: int) -> list[str]:
        """Pages until k distinct ids or the last page (see the class docstring for the other stops); ids
        repeated across pages count once."""
        ids: dict[str, None] = {}
        cursor: Cursor = None
        followed: set[Cursor] = set()
        for _ in range(2 * math.ceil(k / self.api.page_size) + 1):
            page, cursor = self._page(query, cursor, k - len(ids))
            before = len(ids)
            ids.update(dict.fromkeys(page))
            if len(ids) >= k or cursor is None or len(ids) == before or cursor in followed:
                break
            followed.add(cursor)
        return list(ids)[:k]

    def _page(self, query: str, cursor: Cursor, want: int) -> tuple[list[str], Cursor]:
        """One page, rate-limited and retried."""
        target = (self._base_path + self.api.path + "?"
                  + urllib.parse.urlencode(self.api.params(query, cursor, want)))
        where = f"{self.api.name}: query {short(query)}"
        last = _Transient("no attempt")
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1) if last.wait_s is None else last.wait_s)
            self.limiter.wait()
            try:
                return self._attempt(target, cursor, where)
            except _Transient as e:
                last = e
        raise SearchEngineUnavailable(f"{where}: failed after {self.retries + 1} attempts; last: {last}")

    def _attempt(self, target: str, cursor: Cursor, where: str) -> tuple[list[str], Cursor]:
        """One GET of `target`, over within `timeout_s`: the parsed page, _Transient for what is worth
        retrying, else SearchEngineError."""
        connection = self._connection(self._host, self._port, time.monotonic() + self.timeout_s)
        try:
            connection.request("GET", target, headers=_HEADERS)
            response = connection.getresponse()
            data = read_body(response, self.max_body_bytes)
        except (OSError, http.client.HTTPException) as e:  # timeouts, refused/reset connections, short reads
            raise _Transient(f"{type(e).__name__}: {e}") from None
        except BodyTooLarge as e:
            raise _Transient(str(e)) from None
        finally:
            connection.close()
        if response.status == 429 or response.status >= 500:
            wait_s = retry_after_s(response.getheader("Retry-After"))
            raise _Transient(f"HTTP {response.status}: {_error_message(data)}", wait_s)
        if response.status != 200:
            raise SearchEngineError(f"{where}: HTTP {response.status}: {_error_message(data)}")
        try:
            body = json.loads(data)
        except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, integers too long, nested too deep
            raise _Transient(f"malformed body ({str(e)[:200]}): {data[:200]!r}") from None
        try:
            return self.api.parse(body, cursor)
        except Malformed as e:
            raise _Transient(f"malformed body: {e}") from None
        except Refused as e:
            raise SearchEngineRefused(f"{where}: the engine refused it: {e}") from None


def make_engine(kind: str, config: RetrievalConfig) -> SearchEngine:
    """The engine for `kind` "pubmed" or "ctgov" as `config` sets it up: `config.options` (the kind's
    `EngineOptions`) give its cache ("": none), its rate (0: the API's default) and its API's own options;
    an empty `config.url` is the real service."""
    apis: dict[str, Callable[..., LiteratureAPI]] = {"pubmed": PubMed, "ctgov": ClinicalTrials}
    if kind not in apis:
        raise ValueError(f"unknown search engine {kind!r}; expected one of {sorted(apis)}")
    options: EngineOptions = config.options
    return SearchEngine(apis[kind](**options.api_options()), url=config.url, rate_per_s=options.rate_per_s,
                        timeout_s=config.timeout_s, retries=config.retries, cache=options.cache_path or None)


@register_retriever("pubmed", PubMedOptions)
def pubmed_retriever(config: RetrievalConfig) -> SearchEngine:
    """PubMed (NCBI E-utilities) as `config.retrieval.kind="pubmed"`."""
    return make_engine("pubmed", config)


@register_retriever("ctgov", ClinicalTrialsOptions)
def ctgov_retriever(config: RetrievalConfig) -> SearchEngine:
    """ClinicalTrials.gov API v2 as `config.retrieval.kind="ctgov"`."""
    return make_engine("ctgov", config)
