"""BEIR queries and per-split views."""
import json

import pytest

from searchrl.data import DataFormatError, read_beir_queries, read_beir_split


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _beir(root):
    (root / "qrels").mkdir(parents=True)
    _jsonl(root / "queries.jsonl", [{"_id": "q1", "text": "where is paris"}, {"_id": 2, "text": "untitled"},
                                    {"_id": "q3", "text": "unjudged"}])
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n2\td2\t1\nq1\td1\t2\nq1\td2\t0\n")
    return root


def test_read_beir_split(tmp_path):
    root = _beir(tmp_path / "toy")
    queries = read_beir_queries(root / "queries.jsonl")
    assert queries == {"q1": "where is paris", "2": "untitled", "q3": "unjudged"}
    # queries of the split, in queries.jsonl order; q3 has no qrels.
    assert read_beir_split(root, "test") == [
        {"id": "q1", "text": "where is paris", "qrels": {"d1": 2, "d2": 0}},
        {"id": "2", "text": "untitled", "qrels": {"d2": 1}}]


@pytest.mark.parametrize("rows, message", [
    ([{"_id": "q1"}], "queries.jsonl:1: field 'text': missing"),
    ([{"text": "x"}], "queries.jsonl:1: field '_id': missing"),
    ([{"_id": "q1", "text": "a"}, {"_id": "q1", "text": "b"}],
     r"queries.jsonl:2: field '_id': duplicate id 'q1' \(first at .*queries.jsonl:1\)"),
    ([{"_id": "q1", "text": ""}], "queries.jsonl:1: field 'text': empty"),
])
def test_bad_queries(tmp_path, rows, message):
    with pytest.raises(DataFormatError, match=message):
        read_beir_queries(_jsonl(tmp_path / "queries.jsonl", rows))


def test_qrels_for_unknown_query(tmp_path):
    root = _beir(tmp_path / "toy")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq9\td1\t1\n")
    unknown = r"test.tsv:3: field 'query-id': query id 'q9' is not in queries.jsonl"
    with pytest.raises(DataFormatError, match=unknown):
        read_beir_split(root, "test")
