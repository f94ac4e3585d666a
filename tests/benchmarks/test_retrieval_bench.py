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


def test_end_to_end_bm25_vs_dense_rewrites_once_and_states_the_ratio(tmp_path):
    """Both backends retrieve the same rewrites (from a fake chat endpoint speaking the OpenAI API); the
    ratio is dense's end-to-end seconds over BM25's, each the shared rewriting time plus its own retrieval.
    (The "dense" backend here is a second BM25 index: building a real encoder's index takes a minute on two
    cores, and the composition does not depend on the backend.)"""
    from searchrl.eval import chat_api
    from searchrl.retrieval.bm25 import BM25Retriever
    from searchrl.tasks.deepretrieval import end_to_end
    from tests.eval.test_chat_api import FakeEndpoint

    corpus = tmp_path / "corpus.jsonl"
    docs = retrieval.synthetic_corpus(corpus, 40, seed=0)
    queries = retrieval.make_queries(docs, 6, seed=0)
    BM25Retriever.build(corpus, tmp_path / "bm25", show_progress=False)

    class Counting:
        def __init__(self, inner):
            self.inner, self.asked = inner, []

        def search(self, queries, k):
            self.asked.append(list(queries))
            return self.inner.search(queries, k)

    backends = {"bm25": Counting(BM25Retriever(tmp_path / "bm25")),
                "dense": Counting(BM25Retriever(tmp_path / "bm25"))}
    with FakeEndpoint(lambda body: '<answer>{"query": "rewritten words"}</answer>') as fake:
        rewrite = end_to_end.chat_rewriter(chat_api.ChatAPIConfig(base_url=fake.url, model="policy"))
        out = retrieval.bench_end_to_end(queries, rewrite, backends)
    assert len(fake.requests) == 6 and backends["bm25"].asked == backends["dense"].asked == [
        ["rewritten words"] * 6]
    for name in backends:
        assert out[f"{name}_end_to_end_s"] == out["rewrite_s"] + out[f"{name}_retrieval_s"]
    assert out["ratio_dense_vs_bm25"] == out["dense_end_to_end_s"] / out["bm25_end_to_end_s"]
    plain = retrieval.bench_end_to_end(queries, None, backends)
    assert not plain["rewriter"] and backends["bm25"].asked[-1] == queries
    result = {"passages": 40, "queries": 6, "k": retrieval.K, "cpus": 2, "bm25_build_s": 0.1,
              "bm25s_raw_qps": 100.0, "bm25_wrapper_qps": 90.0, "ratio_wrapper_vs_raw": 0.9,
              "lucene_skipped": "no java", "dense": {"skipped": "no encoder"}, "server_qps": 80.0,
              "server_p50_ms": 1.0, "server_p99_ms": 2.0, "ratio_server_vs_inprocess": 0.9, "end_to_end": out}
    last = retrieval.table(result).splitlines()[-1]
    assert last.startswith("end to end, bm25 (rewrite + retrieval)")
    assert last.endswith(f"= {out['ratio_dense_vs_bm25']:.1f} x")
