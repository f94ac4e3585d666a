"""TFDS builders: build array_record datasets from a manual directory and read them back without TF."""
import json
import sys

import pytest
import tensorflow_datasets as tfds

from searchrl.data import DataFormatError, builders, read_flashrag_jsonl


def _qa_rows(prefix, n):
    return [{"id": f"{prefix}_{i}", "question": f"question {i} é?", "golden_answers": [f"answer {i}", "x"],
             "metadata": {"hops": i % 3}} for i in range(n)]


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_qa_roundtrip(tmp_path):
    manual, data = tmp_path / "manual", tmp_path / "data"
    test_file = _write_jsonl(manual / "hotpotqa" / "test.jsonl", _qa_rows("test", 40))
    _write_jsonl(manual / "hotpotqa" / "train.jsonl", _qa_rows("train", 3))
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
    _write_jsonl(tmp_path / "manual" / "nq" / "test.jsonl", rows)
    with pytest.raises(DataFormatError, match=r"nq/test.jsonl:3: field 'golden_answers'"):
        builders.load_qa("nq", "test", tmp_path / "data", tmp_path / "manual")


def test_qa_missing_files(tmp_path):
    _write_jsonl(tmp_path / "manual" / "nq" / "test.jsonl", _qa_rows("t", 1))
    with pytest.raises(FileNotFoundError, match=r"no \{train,dev,test\}.jsonl in .*manual/popqa"):
        builders.load_qa("popqa", "test", tmp_path / "data", tmp_path / "manual")
    with pytest.raises(ValueError, match="unknown QA dataset 'squad'"):
        builders.load_qa("squad", "test", tmp_path / "data", tmp_path / "manual")


def test_beir_roundtrip(tmp_path):
    root = tmp_path / "manual" / "my-beir"
    _write_jsonl(root / "corpus.jsonl", [{"_id": "d1", "title": "Paris", "text": "Paris is in France."},
                                         {"_id": "d2", "title": "", "text": "Lyon."}])
    _write_jsonl(root / "queries.jsonl", [{"_id": "q1", "text": "where is paris"},
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
