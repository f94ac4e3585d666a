"""The one retrieval interface every backend implements and every env calls, and its errors."""
from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence


@dataclasses.dataclass(frozen=True)
class Hit:
    """One retrieved passage."""

    id: str
    score: float
    title: str = ""
    text: str = ""

    @property
    def contents(self) -> str:
        """FlashRAG/Search-R1 `contents`: title and text on separate lines."""
        return f"{self.title}\n{self.text}" if self.title else self.text


class Retriever(Protocol):
    """Batched top-k search. One call serves every row of a rollout that is waiting on a search."""

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Returns, for each query, up to k hits sorted by descending score."""
        ...


MAX_QUERY_CHARS = 4096  # the longest query searched (the `/retrieve` server's default limit)


def query_problem(query: str, max_chars: int = MAX_QUERY_CHARS) -> str | None:
    """Why a query cannot be sent to a search backend, or None: blank, over `max_chars` characters, or not
    encodable as UTF-8 (a lone surrogate, which tokenizers, HTTP bodies and URLs all refuse)."""
    if not query.strip():
        return "The search query is empty."
    if len(query) > max_chars:
        return f"The search query has {len(query)} characters, more than {max_chars}: use a shorter one."
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"The search query is not valid text (character {e.start + 1} is a lone surrogate)."
    return None


class RetrievalError(RuntimeError):
    """A remote search that failed for good: the server refused the request (a 4xx) or answered nonsense.
    Unless it is a `QueryRefused`, it is not the query's doing: never scored as retrieving nothing."""


class RetrievalUnavailable(RetrievalError):
    """The server could not answer: failed connections, timeouts, 5xx or unreadable bodies outlasted the
    retries."""


class QueryRefused(RetrievalError):
    """The backend refused one query for its text (a search engine that cannot parse it, a server naming
    it): the policy's doing, which it is told of, or which retrieves nothing."""


def search_each(retriever: Retriever, queries: Sequence[str], k: int) -> list[list[Hit] | QueryRefused]:
    """One batched search; when the batch is refused for a query's text (`QueryRefused`), one search per
    query, so one bad query cannot fail the others: a query's own refusal is its outcome. Any other
    `RetrievalError` (the retriever down, a request too large, an answer of the wrong shape) raises: it says
    nothing of the queries."""
    try:
        return retriever.search(queries, k)
    except QueryRefused:
        return [_search_alone(retriever, query, k) for query in queries]


def _search_alone(retriever: Retriever, query: str, k: int) -> list[Hit] | QueryRefused:
    try:
        return retriever.search([query], k)[0]
    except QueryRefused as e:
        return e


def search_or_explain(retriever: Retriever, queries: Sequence[str], k: int,
                      max_chars: int = MAX_QUERY_CHARS) -> list[list[Hit] | str]:
    """Each query's hits, or why it has none, as a bad tool call is told: a query with a `query_problem` is
    not sent, and one the backend refuses for its text says so (`search_each`, which raises any other
    failure)."""
    problems = [query_problem(q, max_chars) for q in queries]
    valid = [q for q, problem in zip(queries, problems) if problem is None]
    outcomes = iter(search_each(retriever, valid, k) if valid else [])
    return [_explained(next(outcomes)) if problem is None else problem for problem in problems]


def _explained(outcome: list[Hit] | QueryRefused) -> list[Hit] | str:
    return f"The search failed: {outcome}"[:500] if isinstance(outcome, QueryRefused) else outcome
