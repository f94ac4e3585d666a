"""The retrieval benchmark without the optional Lucene backend: the row is skipped with a one-line note."""
import sys

from searchrl.benchmarks import retrieval


def test_lucene_row_is_skipped_without_pyserini(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyserini", None)  # `import pyserini` raises ImportError
    monkeypatch.setitem(sys.modules, "pyserini.pyclass", None)
    corpus = tmp_path / "corpus.jsonl"
    docs = retrieval.synthetic_corpus(corpus, 50, seed=0)
    queries = retrieval.make_queries(docs, 5, seed=0)
    notes: list[str] = []
    out = retrieval.bench_lucene(corpus, tmp_path, queries, queries, notes.append)
    assert set(out) == {"lucene_skipped"} and out["lucene_skipped"]
    assert notes[-1].startswith("skipping the Lucene row: ") and "\n" not in notes[-1]
    result = {"passages": 50, "queries": 5, "k": retrieval.K, "cpus": 2, "bm25_build_s": 0.1,
              "bm25s_raw_qps": 100.0, "bm25_wrapper_qps": 90.0, "ratio_wrapper_vs_raw": 0.9, **out,
              "dense": {"skipped": "no encoder"}, "server_qps": 80.0, "server_p50_ms": 1.0, "server_p99_ms": 2.0,
              "ratio_server_vs_inprocess": 0.9}
    lucene_line = next(line for line in retrieval.table(result).splitlines() if line.startswith("Lucene"))
    assert "skipped" in lucene_line and out["lucene_skipped"] in lucene_line
