"""BM25 on bm25s: index, save/load (memory-mapped), batched search, scores against the BM25 formula."""
import json
import logging
import math

import numpy as np
import pytest

from searchrl.retrieval import RetrievalConfig, load_retriever, make_retriever
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.retrieval.corpus import write_manifest

# After lowercasing, stopword removal ("the", "and", "a") and stemming, each passage is these tokens
# (every word here is its own Snowball stem):
DOCS = {
    "a": ("", "cat dog", ["cat", "dog"]),
    "b": ("", "Cat cat fish", ["cat", "cat", "fish"]),
    "c": ("", "the bird and the tree", ["bird", "tree"]),
    "d": ("Fish", "fish bird green tree", ["fish", "fish", "bird", "green", "tree"]),
    "e": ("", "a red dog", ["red", "dog"]),
}
K1, B = 0.9, 0.4


def bm25_reference(query_terms, k1=K1, b=B):
    """Lucene-variant BM25 straight from the formula: idf = ln(1 + (N - df + 0.5) / (df + 0.5)),
    term score = idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))."""
    n = len(DOCS)
    avgdl = sum(len(toks) for _, _, toks in DOCS.values()) / n  # 14 / 5 = 2.8
    scores = {}
    for doc_id, (_, _, toks) in DOCS.items():
        score = 0.0
        for term in query_terms:
            tf = toks.count(term)
            if tf:
                df = sum(term in t for _, _, t in DOCS.values())
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                score += idf * tf / (tf + k1 * (1 - b + b * len(toks) / avgdl))
        if score:
            scores[doc_id] = score
    return scores


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bm25")
    corpus = tmp / "corpus.jsonl"
    rows = [{"_id": i, "title": title, "text": text} for i, (title, text, _) in DOCS.items()]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    BM25Retriever.build(corpus, tmp / "index", show_progress=False)
    return tmp / "index"


@pytest.fixture(scope="module")
def retriever(index_dir):
    return BM25Retriever(index_dir)


def test_hand_checkable_ranking(retriever):
    # "cat": only a (tf 1, dl 2) and b (tf 2, dl 3) match; b's higher tf outweighs its length.
    hits = retriever.search(["cat"], 10)[0]
    assert [h.id for h in hits] == ["b", "a"]
    assert hits[0].text == "Cat cat fish" and hits[0].title == ""
    # Case and punctuation are normalized like the documents.
    assert [h.id for h in retriever.search(["CAT!!"], 10)[0]] == ["b", "a"]


def test_scores_match_the_bm25_formula(retriever):
    for query, terms in [("fish bird", ["fish", "bird"]), ("green cat", ["green", "cat"]), ("cat", ["cat"])]:
        expected = bm25_reference(terms)
        hits = retriever.search([query], 10)[0]
        assert [h.id for h in hits] == sorted(expected, key=expected.get, reverse=True)
        np.testing.assert_allclose([h.score for h in hits], [expected[h.id] for h in hits], rtol=1e-5)


def test_titles_are_indexed_and_returned(retriever):
    # d's title "Fish" counts as a term occurrence: fish tf = 2 in d.
    hit = retriever.search(["fish"], 1)[0][0]
    assert (hit.id, hit.title, hit.contents) == ("d", "Fish", "Fish\nfish bird green tree")


def test_batched_equals_single_and_edge_cases(retriever):
    queries = ["cat", "fish bird", "the and", "zebra", "dog"]
    batched = retriever.search(queries, 3)
    assert batched == [retriever.search([q], 3)[0] for q in queries]
    assert batched[2] == [] and batched[3] == []  # only stopwords / unknown terms: no hits
    assert all(len(hits) <= 3 for hits in batched)
    assert len(retriever.search(["fish bird dog cat"], 100)[0]) == 5  # k beyond the corpus size
    assert retriever.search([], 5) == []
    with pytest.raises(ValueError, match="k must be >= 1"):
        retriever.search(["cat"], 0)


def test_saved_index_loads_memory_mapped(index_dir, retriever):
    loaded = load_retriever(index_dir, n_threads=2)
    assert isinstance(loaded, BM25Retriever)
    assert isinstance(loaded.model.scores["data"], np.memmap)
    queries = ["fish bird", "red dog", "tree"]
    assert loaded.search(queries, 5) == retriever.search(queries, 5)
    made = make_retriever(RetrievalConfig(kind="local", index_dir=str(index_dir), options={"n_threads": 0}))
    assert isinstance(made, BM25Retriever) and made.n_threads == 0
    assert made.search(queries, 5) == retriever.search(queries, 5)


def test_flashrag_corpus_and_bm25_params(tmp_path):
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"Title {i}"\nbody {w}'}) + "\n"
                              for i, w in enumerate(["alpha", "beta", "gamma"])))
    retriever = BM25Retriever.build(corpus, tmp_path / "idx", k1=1.2, b=0.75, show_progress=False)
    assert json.loads((tmp_path / "idx" / "searchrl_index.json").read_text())["k1"] == 1.2
    hit = retriever.search(["beta"], 2)[0][0]
    assert (hit.id, hit.title, hit.text) == ("1", '"Title 1"', "body beta")  # the title line as stored
    assert hit.contents == '"Title 1"\nbody beta'
    # One matching term, df = 1 of N = 3, every doc 3 tokens long (= avgdl): idf * 1 / (1 + k1).
    assert hit.score == pytest.approx(math.log(1 + 2.5 / 1.5) / 2.2, rel=1e-6)


def test_rejects_other_kinds(tmp_path):
    write_manifest(tmp_path, "lucene", tmp_path / "c.jsonl")
    with pytest.raises(ValueError, match="not a bm25 index"):
        BM25Retriever(tmp_path)
    with pytest.raises(ValueError, match="unknown stemmer"):
        BM25Retriever.build(tmp_path / "c.jsonl", tmp_path / "x", stemmer="klingon")


def test_building_logs_nothing_at_info(index_dir, caplog):
    """bm25s sets its logger to DEBUG when imported: "Building index from IDs" in every build's output."""
    with caplog.at_level(logging.DEBUG):
        BM25Retriever.build(index_dir.parent / "corpus.jsonl", index_dir.parent / "again", show_progress=False)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("bm25s")] == []
