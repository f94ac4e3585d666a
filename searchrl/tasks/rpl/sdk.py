"""The retrieval SDK that Retrieval Program Learning programs call: `sparse_retrieval`, `dense_retrieval`,
`fuse` (reciprocal-rank fusion), `dedup` and `rerank`, on lists of `Hit`."""
from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable, Sequence

from searchrl.retrieval.types import Hit, Retriever, query_problem

if TYPE_CHECKING:  # the dense stack (JAX, FAISS) loads only when a dense encoder is used
    from searchrl.retrieval.encoder import DenseEncoder
    from searchrl.retrieval.rerank import Reranker

SDK_FUNCTIONS = ("sparse_retrieval", "dense_retrieval", "fuse", "dedup", "rerank")


def _check_hits(docs: Any, where: str) -> Sequence[Hit]:
    if isinstance(docs, (str, bytes)) or not isinstance(docs, Sequence):
        raise TypeError(f"{where}: expected a list of Hit, got {type(docs).__name__}")
    for i, doc in enumerate(docs):
        if not isinstance(doc, Hit):
            raise TypeError(f"{where}: item {i} is {type(doc).__name__}, not Hit")
    return docs


def _check_top_k(top_k: Any, where: str, optional: bool = False) -> None:
    if optional and top_k is None:
        return
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"{where}: top_k must be a positive integer{' or None' if optional else ''}, "
                         f"got {top_k!r}")


def fuse(*lists: Sequence[Hit], k: int = 60, top_k: int | None = None) -> list[Hit]:
    """Reciprocal-rank fusion: score(d) = sum over the lists holding d of 1 / (k + rank), rank 1-based.

    A doc repeated within one list counts at its first rank only. Scores are summed exactly (fractions), so
    equal sums tie exactly; ties go to the doc reached first when the lists are read rank by rank (rank 1 of
    every list in argument order, then rank 2, ...). A fused hit keeps the title and text of that first
    occurrence and carries its fused score.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"fuse: k must be a non-negative integer, got {k!r}")
    _check_top_k(top_k, "fuse", optional=True)
    lists = tuple(_check_hits(docs, f"fuse argument {i}") for i, docs in enumerate(lists))
    scores: dict[str, Fraction] = {}  # insertion order = the order docs are first reached
    first: dict[str, Hit] = {}
    seen: list[set[str]] = [set() for _ in lists]
    for rank in range(max((len(docs) for docs in lists), default=0)):
        for docs, seen_here in zip(lists, seen):
            if rank >= len(docs) or docs[rank].id in seen_here:
                continue
            doc = docs[rank]
            seen_here.add(doc.id)
            scores[doc.id] = scores.get(doc.id, Fraction(0)) + Fraction(1, k + rank + 1)
            first.setdefault(doc.id, doc)
    order = sorted(scores, key=lambda doc_id: -scores[doc_id])  # stable: ties keep first-reached order
    return [Hit(d, float(scores[d]), first[d].title, first[d].text) for d in order[:top_k]]


def dedup(docs: Sequence[Hit]) -> list[Hit]:
    """Drops repeated ids; the first occurrence wins and the order is kept."""
    seen: set[str] = set()
    out = []
    for doc in _check_hits(docs, "dedup"):
        if doc.id not in seen:
            seen.add(doc.id)
            out.append(doc)
    return out


class BackendNotConfigured(RuntimeError):
    """A program called an SDK function whose backend this RetrievalSDK was not given."""


class RetrievalSDK:
    """The SDK functions bound to configured backends, in single-query form (one query -> list[Hit]).

    `rerank` uses the cross-encoder when one is given; otherwise it falls back to dense similarity with
    `encoder`, or with the dense retriever's encoder.
    """

    def __init__(self, sparse: Retriever | None = None, dense: Retriever | None = None,
                 reranker: Reranker | None = None, encoder: DenseEncoder | None = None, rrf_k: int = 60,
                 available: Sequence[str] = SDK_FUNCTIONS):
        if unknown := [name for name in available if name not in SDK_FUNCTIONS]:
            raise ValueError(f"unknown SDK functions {unknown}; the SDK has {SDK_FUNCTIONS}")
        self.sparse, self.dense, self.rrf_k = sparse, dense, rrf_k
        self.available = tuple(available)  # the functions programs may call (an action space)
        if reranker is None:
            encoder = encoder if encoder is not None else getattr(dense, "encoder", None)  # a DenseRetriever's
            if encoder is not None:
                from searchrl.retrieval.rerank import DenseSimilarityReranker
                reranker = DenseSimilarityReranker(encoder)
        self.reranker = reranker

    def functions(self) -> dict[str, Callable[..., list[Hit]]]:
        """The available SDK functions by name, as a program's namespace."""
        return {name: getattr(self, name) for name in self.available}

    @staticmethod
    def _search(backend: Retriever | None, name: str, kind: str, q: Any, top_k: Any) -> list[Hit]:
        if backend is None:
            raise BackendNotConfigured(f"{name}: no {kind} retriever is configured")
        if not isinstance(q, str):
            raise TypeError(f"{name}: query must be a string, got {type(q).__name__}")
        if problem := query_problem(q):  # refused alike by every backend, local or remote
            raise ValueError(f"{name}: {problem}")
        _check_top_k(top_k, name)
        return backend.search([q], top_k)[0]

    def sparse_retrieval(self, q: str, top_k: int = 10) -> list[Hit]:
        """Top-k passages for q from the sparse (BM25 / Lucene) backend."""
        return self._search(self.sparse, "sparse_retrieval", "sparse", q, top_k)

    def dense_retrieval(self, q: str, top_k: int = 10) -> list[Hit]:
        """Top-k passages for q from the dense (FAISS) backend."""
        return self._search(self.dense, "dense_retrieval", "dense", q, top_k)

    def fuse(self, *lists: Sequence[Hit], top_k: int | None = None) -> list[Hit]:
        """Reciprocal-rank fusion of ranked lists with this SDK's k."""
        return fuse(*lists, k=self.rrf_k, top_k=top_k)

    def dedup(self, docs: Sequence[Hit]) -> list[Hit]:
        return dedup(docs)

    def rerank(self, q: str, docs: Sequence[Hit], top_k: int | None = None) -> list[Hit]:
        """docs re-scored for q (cross-encoder, or dense cosine as the fallback), best first."""
        if self.reranker is None:
            raise BackendNotConfigured("rerank: no cross-encoder and no dense encoder is configured")
        if not isinstance(q, str):
            raise TypeError(f"rerank: query must be a string, got {type(q).__name__}")
        _check_top_k(top_k, "rerank", optional=True)
        return self.reranker.rerank(q, list(_check_hits(docs, "rerank")), top_k)
