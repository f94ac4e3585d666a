"""BEIR retrieval datasets: corpus.jsonl, queries.jsonl and qrels/{split}.tsv.

corpus.jsonl rows: {"_id", "title", "text", "metadata"?}; queries.jsonl rows: {"_id", "text", "metadata"?};
qrels/{split}.tsv: a "query-id<TAB>corpus-id<TAB>score" header, then one integer-graded pair per line.
The corpus and the qrels are read by the retrieval package's readers (`searchrl.retrieval.corpus.CorpusScan`,
`searchrl.retrieval.metrics.read_beir_qrels`); this module adds the queries and the per-split view.
"""
from __future__ import annotations

import pathlib
from typing import TypedDict

from searchrl.data.jsonl import DataFormatError, read_jsonl, string_field, unique_id
from searchrl.retrieval.metrics import read_beir_qrels


class BeirDoc(TypedDict):
    """One corpus passage."""

    id: str
    title: str
    text: str


class BeirQuery(TypedDict):
    """One query with its graded relevance judgements {corpus id: score}."""

    id: str
    text: str
    qrels: dict[str, int]


def read_beir_queries(path: str | pathlib.Path) -> dict[str, str]:
    """Reads queries.jsonl into {query id: text}, in file order."""
    queries, seen = {}, {}
    for location, row in read_jsonl(path):
        qid = unique_id(seen, string_field(row, "_id", location, allow_int=True), location, "_id")
        queries[qid] = string_field(row, "text", location)
    return queries


def read_beir_split(root: str | pathlib.Path, split: str) -> list[BeirQuery]:
    """The queries of `split` (those with qrels in qrels/{split}.tsv), in queries.jsonl order."""
    root = pathlib.Path(root)
    qrels_path = root / "qrels" / f"{split}.tsv"
    qrels = read_beir_qrels(qrels_path)
    queries = read_beir_queries(root / "queries.jsonl")
    unknown = [qid for qid in qrels if qid not in queries]
    if unknown:
        raise DataFormatError(str(qrels_path), f"query ids not in queries.jsonl: {unknown[:5]}", "query-id")
    return [BeirQuery(id=qid, text=text, qrels=qrels[qid]) for qid, text in queries.items() if qid in qrels]
