"""BEIR retrieval datasets: corpus.jsonl, queries.jsonl and qrels/{split}.tsv.

corpus.jsonl rows: {"_id", "title", "text", "metadata"?}; queries.jsonl rows: {"_id", "text", "metadata"?};
qrels/{split}.tsv: a "query-id<TAB>corpus-id<TAB>score" header, then one integer-graded pair per line.
The corpus and the qrels are read by the retrieval package's readers (`searchrl.retrieval.corpus.CorpusScan`,
`searchrl.retrieval.metrics.beir_judgements`); this module adds the queries and the per-split view.
"""
from __future__ import annotations

import pathlib
from typing import TypedDict

from searchrl.data.jsonl import DataFormatError, read_jsonl, string_field, unique_id
from searchrl.retrieval.metrics import beir_judgements


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
    """The queries of `split` (those with qrels in qrels/{split}.tsv), in queries.jsonl order. A judgement of
    a query id that queries.jsonl lacks raises DataFormatError at its qrels line."""
    root = pathlib.Path(root)
    queries = read_beir_queries(root / "queries.jsonl")
    qrels: dict[str, dict[str, int]] = {}
    for where, qid, docid, score in beir_judgements(root / "qrels" / f"{split}.tsv"):
        if qid not in queries:
            raise DataFormatError(where, f"query id {qid!r} is not in queries.jsonl", "query-id")
        qrels.setdefault(qid, {})[docid] = score
    return [BeirQuery(id=qid, text=text, qrels=qrels[qid]) for qid, text in queries.items() if qid in qrels]
