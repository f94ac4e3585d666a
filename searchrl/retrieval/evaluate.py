"""Retrieval quality of an index on a query set with relevance judgements, as one JSON object.

  python -m searchrl.retrieval.evaluate --index DIR --queries Q.jsonl --qrels QRELS [-k 100]
  -> {"ndcg@10": ..., "recall@100": ..., "mrr@10": ..., "queries": n}

Only queries that have judgements are searched and scored (BEIR's queries.jsonl holds every split).
"""
from __future__ import annotations

import json
from typing import Sequence

from absl import flags

from searchrl import cli
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.metrics import evaluate, read_qrels
from searchrl.retrieval.search import read_queries, search_all


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    values = flags.FlagValues()
    index = flags.DEFINE_string("index", None, "index dir (any kind)", required=True, flag_values=values)
    queries_path = flags.DEFINE_string("queries", None, "queries JSONL (BEIR or FlashRAG)", required=True,
                                       flag_values=values)
    qrels_path = flags.DEFINE_string("qrels", None, "qrels: BEIR tsv or TREC", required=True,
                                     flag_values=values)
    k = flags.DEFINE_integer("k", 100, "depth searched and cut-off of recall", lower_bound=1,
                            flag_values=values)
    batch_size = flags.DEFINE_integer("batch_size", RetrievalConfig.batch_size, "queries per search call", lower_bound=1,
                                      flag_values=values)
    cli.parse(values, argv, __doc__)

    from searchrl.retrieval import load_retriever
    qrels = read_qrels(qrels_path.value)
    queries = [(qid, text) for qid, text in read_queries(queries_path.value) if qid in qrels]
    if not queries:
        raise SystemExit(f"no query of {queries_path.value} has judgements in {qrels_path.value}")
    qrels = {qid: qrels[qid] for qid, _ in queries}
    run = search_all(load_retriever(index.value), queries, max(k.value, 10), batch_size.value)
    ranked = {qid: [h.id for h in hits] for qid, hits in run.items()}
    scores = evaluate(ranked, qrels, ["ndcg@10", f"recall@{k.value}", "mrr@10"])
    result = {**scores, "queries": len(queries)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    cli.run(main)
