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
