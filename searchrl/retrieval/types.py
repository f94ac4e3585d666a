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
    """A remote search that failed for good: the server refused the request (a 4xx) or answered nonsense."""


class RetrievalUnavailable(RetrievalError):
    """The server could not answer: failed connections, timeouts, 5xx or unreadable bodies outlasted the
    retries."""


def search_each(retriever: Retriever, queries: Sequence[str], k: int) -> list[list[Hit] | RetrievalError]:
    """One batched search; when the batch is refused (`RetrievalError`), one search per query, so one bad query
    cannot fail the others: a query's own error is its outcome. Raises when the retriever is down
    (`RetrievalUnavailable`: its retries used up), or when no query can be searched even alone."""
    try:
        return retriever.search(queries, k)
    except RetrievalUnavailable:
        raise
    except RetrievalError:
        alone = [_search_alone(retriever, query, k) for query in queries]
        if all(isinstance(outcome, RetrievalError) for outcome in alone):
            raise
        return alone


def _search_alone(retriever: Retriever, query: str, k: int) -> list[Hit] | RetrievalError:
    try:
        return retriever.search([query], k)[0]
    except RetrievalUnavailable:
        raise
    except RetrievalError as e:
        return e


def search_or_explain(retriever: Retriever, queries: Sequence[str], k: int,
                      max_chars: int = MAX_QUERY_CHARS) -> list[list[Hit] | str]:
    """Each query's hits, or why it has none, as a bad tool call is told: a query with a `query_problem` is
    not sent, and one the backend refuses says so (`search_each`, which raises when the backend is down)."""
    problems = [query_problem(q, max_chars) for q in queries]
    valid = [q for q, problem in zip(queries, problems) if problem is None]
    outcomes = iter(search_each(retriever, valid, k) if valid else [])
    return [_explained(next(outcomes)) if problem is None else problem for problem in problems]


def _explained(outcome: list[Hit] | RetrievalError) -> list[Hit] | str:
    return f"The search failed: {outcome}"[:500] if isinstance(outcome, RetrievalError) else outcome
