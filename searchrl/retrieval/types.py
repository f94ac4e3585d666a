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
