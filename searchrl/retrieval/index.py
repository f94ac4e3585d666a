"""Build a retrieval index from a JSONL corpus (FlashRAG {"id", "contents"} or BEIR {"_id", "title", "text"}).

  python -m searchrl.retrieval.index --kind bm25   --corpus C.jsonl --out DIR [--k1 0.9 --b 0.4]
  python -m searchrl.retrieval.index --kind lucene --corpus C.jsonl --out DIR [--threads 4]
  python -m searchrl.retrieval.index --kind dense  --corpus C.jsonl --out DIR --encoder ENC [--factory Flat]
      [--pooling mean|cls] [--no-normalize] [--query-prefix "query: " --passage-prefix "passage: "] (e5)

Every index dir gets a searchrl_index.json manifest; `searchrl.retrieval.load_retriever(DIR)` opens any kind.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Sequence

from searchrl.retrieval import BM25_B, BM25_K1, KINDS, read_manifest


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", required=True, choices=KINDS)
    parser.add_argument("--corpus", required=True, help="corpus JSONL")
    parser.add_argument("--out", required=True, help="index dir to write")
    parser.add_argument("--k1", type=float, default=BM25_K1, help="BM25 k1 (bm25, lucene)")
    parser.add_argument("--b", type=float, default=BM25_B, help="BM25 b (bm25, lucene)")
    parser.add_argument("--stemmer", default="english", help="PyStemmer algorithm (bm25)")
    parser.add_argument("--threads", type=int, default=-1, help="indexing threads, -1: one per CPU (lucene)")
    parser.add_argument("--skip-malformed", action="store_true", help="skip and count malformed corpus lines")
    parser.add_argument("--encoder", help="local encoder dir (dense)")
    parser.add_argument("--factory", default="Flat", help="FAISS index factory string (dense)")
    parser.add_argument("--pooling", default="mean", choices=("mean", "cls"), help="encoder pooling (dense)")
    parser.add_argument("--no-normalize", dest="normalize", action="store_false",
                        help="keep raw embeddings instead of L2-normalising them (dense)")
    parser.add_argument("--query-prefix", default="", help='prepended to queries, e.g. "query: " for e5 (dense)')
    parser.add_argument("--passage-prefix", default="", help='prepended to passages, e.g. "passage: " (dense)')
    parser.add_argument("--max-length", type=int, default=256, help="encoder max tokens (dense)")
    parser.add_argument("--batch-size", type=int, default=64, help="encoder batch size (dense)")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    if args.kind == "bm25":
        from searchrl.retrieval.bm25 import BM25Retriever
        BM25Retriever.build(args.corpus, args.out, k1=args.k1, b=args.b, stemmer=args.stemmer,
                            skip_malformed=args.skip_malformed)
    elif args.kind == "lucene":
        from searchrl.retrieval.lucene import LuceneRetriever
        LuceneRetriever.build(args.corpus, args.out, k1=args.k1, b=args.b, n_threads=args.threads,
                              skip_malformed=args.skip_malformed)
    else:
        if not args.encoder:
            parser.error("--kind dense needs --encoder")
        from searchrl.retrieval.dense import DenseRetriever
        DenseRetriever.build(args.corpus, args.out, args.encoder, factory=args.factory, pooling=args.pooling,
                             normalize=args.normalize, query_prefix=args.query_prefix,
                             passage_prefix=args.passage_prefix, max_length=args.max_length,
                             batch_size=args.batch_size, skip_malformed=args.skip_malformed)
    print(json.dumps({"kind": args.kind, "out": args.out, "passages": read_manifest(args.out).get("count"),
                      "seconds": round(time.perf_counter() - start, 2)}))


if __name__ == "__main__":
    main()
