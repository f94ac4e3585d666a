"""Retrieval quality of an index on a query set with relevance judgements, as one JSON object.

  python -m searchrl.retrieval.evaluate --index DIR --queries Q.jsonl --qrels QRELS [-k 100]
  -> {"ndcg@10": ..., "recall@100": ..., "mrr@10": ..., "queries": n}

Only queries that have judgements are searched and scored (BEIR's queries.jsonl holds every split).
"""
from __future__ import annotations

import argparse
import json
from typing import Sequence

from searchrl.retrieval.metrics import evaluate, read_qrels
from searchrl.retrieval.search import read_queries, search_all


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="index dir (any kind)")
    parser.add_argument("--queries", required=True, help="queries JSONL (BEIR or FlashRAG)")
    parser.add_argument("--qrels", required=True, help="qrels: BEIR tsv or TREC")
    parser.add_argument("-k", type=int, default=100, help="depth searched and cut-off of recall")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)

    from searchrl.retrieval import load_retriever
    qrels = read_qrels(args.qrels)
    queries = [(qid, text) for qid, text in read_queries(args.queries) if qid in qrels]
    if not queries:
        raise SystemExit(f"no query of {args.queries} has judgements in {args.qrels}")
    qrels = {qid: qrels[qid] for qid, _ in queries}
    run = search_all(load_retriever(args.index), queries, max(args.k, 10), args.batch_size)
    ranked = {qid: [h.id for h in hits] for qid, hits in run.items()}
    scores = evaluate(ranked, qrels, ["ndcg@10", f"recall@{args.k}", "mrr@10"])
    result = {**scores, "queries": len(queries)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
