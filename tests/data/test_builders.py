"""TFDS builders: build array_record datasets from a manual directory and read them back without TF."""
import sys

import pytest
import tensorflow_datasets as tfds

from searchrl.data import DataFormatError, builders, read_flashrag_jsonl, retrieval_tasks
from tests.data.retrieval_helpers import bird_dir, literature_dir, spider_dir, write_json, write_jsonl


def _qa_rows(prefix, n):
    return [{"id": f"{prefix}_{i}", "question": f"question {i} é?", "golden_answers": [f"answer {i}", "x"],
             "metadata": {"hops": i % 3}} for i in range(n)]


def test_qa_roundtrip(tmp_path):
    manual, data = tmp_path / "manual", tmp_path / "data"
    test_file = write_jsonl(manual / "hotpotqa" / "test.jsonl", _qa_rows("test", 40))
    write_jsonl(manual / "hotpotqa" / "train.jsonl", _qa_rows("train", 3))
    records = builders.load_qa("hotpotqa", "test", data, manual)
    assert records == read_flashrag_jsonl(test_file)  # same records, file order kept
    builder = builders.prepare_qa("hotpotqa", data)  # reused: no manual dir needed any more
    assert set(builder.info.splits) == {"train", "test"}
    assert list((data / "flashrag_qa" / "hotpotqa" / "1.0.0").glob("*-test.array_record-*"))
    source = tfds.data_source("flashrag_qa/hotpotqa", split="train", data_dir=str(data), download=False)
    assert builders.decode_qa(source[2])["id"] == "train_2"  # random access
    assert "tensorflow" not in sys.modules


def test_qa_malformed_row_fails_the_build(tmp_path):
    rows = _qa_rows("test", 2) + [{"id": "test_9", "question": "q", "golden_answers": "x"}]
    write_jsonl(tmp_path / "manual" / "nq" / "test.jsonl", rows)
    with pytest.raises(DataFormatError, match=r"nq/test.jsonl:3: field 'golden_answers'"):
        builders.load_qa("nq", "test", tmp_path / "data", tmp_path / "manual")


def test_qa_missing_files(tmp_path):
    write_jsonl(tmp_path / "manual" / "nq" / "test.jsonl", _qa_rows("t", 1))
    with pytest.raises(FileNotFoundError, match=r"no \{train,dev,test\}.jsonl in .*manual/popqa"):
        builders.load_qa("popqa", "test", tmp_path / "data", tmp_path / "manual")
    with pytest.raises(ValueError, match="unknown QA dataset 'squad'"):
        builders.load_qa("squad", "test", tmp_path / "data", tmp_path / "manual")


def test_beir_roundtrip(tmp_path):
    root = tmp_path / "manual" / "my-beir"
    write_jsonl(root / "corpus.jsonl", [{"_id": "d1", "title": "Paris", "text": "Paris is in France."},
                                         {"_id": "d2", "title": "", "text": "Lyon."}])
    write_jsonl(root / "queries.jsonl", [{"_id": "q1", "text": "where is paris"},
                                          {"_id": "q2", "text": "lyon"}])
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t1\n")
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq2\td2\t1\n")
    data = tmp_path / "data"
    corpus = builders.load_beir("my-beir", "corpus", data, tmp_path / "manual")
    assert corpus == [{"id": "d1", "title": "Paris", "text": "Paris is in France."},
                      {"id": "d2", "title": "", "text": "Lyon."}]
    assert builders.load_beir("my-beir", "test", data) == [
        {"id": "q1", "text": "where is paris", "qrels": {"d1": 2, "d2": 1}}]
    assert builders.load_beir("my-beir", "train", data) == [{"id": "q2", "text": "lyon", "qrels": {"d2": 1}}]


def test_literature_roundtrip(tmp_path):
    manual, data = tmp_path / "manual", tmp_path / "data"
    path = literature_dir(manual, "pubmed", "test") / "test.jsonl"
    write_jsonl(manual / "pubmed" / "train.jsonl", [{"id": "t", "question": "q", "relevant_ids": ["9"]}])
    records = builders.load_literature("pubmed", "test", data, manual)
    assert records == retrieval_tasks.read_literature_jsonl(path)
    assert records[0]["question"].startswith("P: ")  # the rendered PICO is what is stored
    assert set(builders.prepare_literature("pubmed", data).info.splits) == {"train", "test"}
    assert builders.load_literature("pubmed", "train", data) == [
        {"id": "t", "question": "q", "qrels": {"9": 1}, "max_date": ""}]


def test_literature_malformed_row_fails_the_build(tmp_path):
    row = {"id": "a", "question": "q", "relevant_ids": []}
    write_jsonl(tmp_path / "manual" / "ctgov" / "test.jsonl", [row])
    with pytest.raises(DataFormatError, match=r"ctgov/test.jsonl:1: field 'relevant_ids'"):
        builders.load_literature("ctgov", "test", tmp_path / "data", tmp_path / "manual")


def test_spider_roundtrip(tmp_path):
    manual, data = tmp_path / "manual", tmp_path / "data"
    root = spider_dir(manual)
    records = builders.load_sql("spider", "spider", "dev", data, manual)
    assert records == retrieval_tasks.read_sql_task(root, "dev", "spider")
    assert set(builders.prepare_sql("spider", "spider", data).info.splits) == {"dev"}  # not tables.json
    source = tfds.data_source("spider_sql/spider", split="dev", data_dir=str(data), download=False)
    assert "db_path" not in source[0]
    assert "tensorflow" not in sys.modules


def test_bird_roundtrip_with_a_database_dir(tmp_path):
    manual, data = tmp_path / "manual", tmp_path / "data"
    root = bird_dir(manual, "mini-bird")
    direct = retrieval_tasks.read_sql_task(root, "dev", "bird")
    assert builders.load_sql("bird", "mini-bird", "dev", data, manual) == direct
    moved = tmp_path / "elsewhere"
    (root / "dev_databases").rename(moved)
    records = builders.load_sql("bird", "mini-bird", "dev", data, database_dir=moved)
    assert records == [{**r, "db_path": str(moved / "shop" / "shop.sqlite")} for r in direct]
    gone = r"bird_sql/mini-bird:dev\[0\]: field 'db_id': unknown db_id 'shop'"
    with pytest.raises(DataFormatError, match=gone):
        builders.load_sql("bird", "mini-bird", "dev", data, manual)
    with pytest.raises(ValueError, match="needs manual_dir or database_dir"):
        builders.load_sql("bird", "mini-bird", "dev", data)
    with pytest.raises(ValueError, match="unknown SQL format 'wikisql'"):
        builders.load_sql("wikisql", "mini-bird", "dev", data, manual)


def test_sql_unknown_db_id_fails_the_build(tmp_path):
    root = spider_dir(tmp_path / "manual")
    write_json(root / "dev.json", [{"db_id": "gone", "question": "q", "query": "SELECT 1"}])
    with pytest.raises(DataFormatError, match=r"spider/dev.json\[0\]: field 'db_id': unknown db_id 'gone'"):
        builders.load_sql("spider", "spider", "dev", tmp_path / "data", tmp_path / "manual")
