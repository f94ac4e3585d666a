"""Batch search from the command line: one JSON line per query with its ranked hits.

  python -m searchrl.retrieval.search --index DIR --queries Q.jsonl -k 10 [--out run.jsonl]

Query lines are BEIR {"_id", "text"} or FlashRAG {"id", "question"}; ids are unique.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Sequence

from absl import flags
from tqdm import tqdm

from searchrl import cli
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.corpus import parse_json
from searchrl.retrieval.types import Hit, Retriever


def parse_query(row: Any) -> tuple[str, str]:
    """One decoded query line -> (query id, text). Raises ValueError naming what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    qid = row.get("_id", row.get("id"))
    text = row.get("text", row.get("question"))
    if not isinstance(qid, (str, int)) or isinstance(qid, bool) or qid == "":
        raise ValueError('no non-empty string (or integer) "_id" or "id" field')
    if not isinstance(text, str):
        raise ValueError('no string "text" or "question" field')
    return str(qid), text


def read_queries(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(query id, text) pairs from a JSONL file, in file order. A malformed line or a repeated id raises
    `ValueError("file:line: reason")`."""
    queries, first_line = [], {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                qid, text = parse_query(parse_json(line))
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None
            if qid in first_line:
                raise ValueError(f"{path}:{lineno}: duplicate query id {qid!r} "
                                 f"(first at line {first_line[qid]})")
            first_line[qid] = lineno
            queries.append((qid, text))
    return queries


def search_all(retriever: Retriever, queries: Sequence[tuple[str, str]], k: int, batch_size: int,
               show_progress: bool = True) -> dict[str, list[Hit]]:
    """Query id -> top-k hits, searching in batches of `batch_size`."""
    if k < 1 or batch_size < 1:
        raise ValueError(f"k and batch_size must be >= 1, got k={k}, batch_size={batch_size}")
    run: dict[str, list[Hit]] = {}
    with tqdm(total=len(queries), unit="query", desc="search", disable=not show_progress) as bar:
        for start in range(0, len(queries), batch_size):
            batch = queries[start:start + batch_size]
            for (qid, _), hits in zip(batch, retriever.search([text for _, text in batch], k)):
                run[qid] = hits
            bar.update(len(batch))
    return run


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    index = flags.DEFINE_string("index", None, "index dir (any kind)", required=True, flag_values=values)
    queries_path = flags.DEFINE_string("queries", None, "queries JSONL", required=True, flag_values=values)
    k = flags.DEFINE_integer("k", 10, "hits per query", lower_bound=1, flag_values=values)
    batch_size = flags.DEFINE_integer("batch_size", RetrievalConfig.batch_size, "queries per search call", lower_bound=1,
                                      flag_values=values)
    out_path = flags.DEFINE_string("out", None, "output JSONL (default: stdout)", flag_values=values)
    cli.parse(values, argv, __doc__)

    from searchrl.retrieval import load_retriever
    queries = read_queries(queries_path.value)
    run = search_all(load_retriever(index.value), queries, k.value, batch_size.value)
    out = open(out_path.value, "w", encoding="utf-8") if out_path.value else sys.stdout
    try:
        for qid, _ in queries:
            hits = [{"id": h.id, "score": h.score} for h in run[qid]]
            out.write(json.dumps({"query_id": qid, "hits": hits}, ensure_ascii=False) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()


if __name__ == "__main__":
    cli.run(main)
