"""Corpus parsing (FlashRAG, BEIR), the offset-indexed store, malformed lines and index manifests."""
import json

import numpy as np
import pytest

from searchrl.retrieval import index_kind, load_retriever
from searchrl.retrieval.corpus import CorpusScan, CorpusStore, parse_record, read_manifest, split_contents, \
    write_manifest


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


ROWS = [
    {"id": "d1", "contents": '"Alan Turing"\nAlan Turing was a mathematician.\nHe broke codes.'},
    {"_id": "d2", "title": "Ada Lovelace", "text": "She wrote the first program."},
    {"id": 7, "title": "", "text": "An untitled passage."},
    {"id": "d4", "contents": "One line, no title"},
    {"id": "d5", "contents": "Ünïcode title\ntext with é"},
]


@pytest.mark.parametrize("contents, expected", [
    ('"Alan Turing"\nAlan was here', ("Alan Turing", "Alan was here")),
    ("Plain\nbody\nmore", ("Plain", "body\nmore")),
    ("no newline at all", ("", "no newline at all")),
    ('"half quoted\nx', ('"half quoted', "x")),
    ('""\nempty title', ("", "empty title")),
])
def test_split_contents(contents, expected):
    assert split_contents(contents) == expected


def test_parse_record_formats():
    assert parse_record(ROWS[0]) == ("d1", "Alan Turing", "Alan Turing was a mathematician.\nHe broke codes.")
    assert parse_record(ROWS[1]) == ("d2", "Ada Lovelace", "She wrote the first program.")
    assert parse_record(ROWS[2]) == ("7", "", "An untitled passage.")


@pytest.mark.parametrize("row, reason", [
    ([1, 2], "expected a JSON object"),
    ({"contents": "x"}, 'no "id" or "_id"'),
    ({"id": "", "contents": "x"}, "id must be"),
    ({"id": True, "contents": "x"}, "id must be"),
    ({"id": "a"}, 'no "contents" or "text"'),
    ({"id": "a", "contents": 3}, '"contents" must be a string'),
    ({"_id": "a", "title": 1, "text": "x"}, '"title" and "text" must be strings'),
])
def test_parse_record_errors(row, reason):
    with pytest.raises(ValueError, match=reason):
        parse_record(row)


def test_store_random_access(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", ROWS[:2] + [""] + ROWS[2:])  # a blank line is ignored
    store = CorpusStore.build(src, tmp_path / "store", show_progress=False)
    assert len(store) == 5
    assert store[0] == ("d1", "Alan Turing", "Alan Turing was a mathematician.\nHe broke codes.")
    assert store[4] == ("d5", "Ünïcode title", "text with é")
    assert store[-1] == store[4]
    assert store.ids == ["d1", "d2", "7", "d4", "d5"]
    assert [store.index_of(i) for i in ("d5", "7", "d1")] == [4, 2, 0]
    with pytest.raises(KeyError, match="nope"):
        store.index_of("nope")
    with pytest.raises(IndexError):
        store[5]
    hit = store.hit(1, 2.5)
    assert (hit.id, hit.score, hit.contents) == ("d2", 2.5, "Ada Lovelace\nShe wrote the first program.")
    assert list(store.texts())[3] == "One line, no title"

    reopened = CorpusStore.open(tmp_path / "store")
    assert isinstance(reopened.offsets, np.memmap) and reopened.offsets.dtype == np.int64
    assert list(reopened) == list(store)


def test_store_last_line_without_newline(tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]))
    assert CorpusStore.build(src, tmp_path / "s", show_progress=False)[1][0] == "d2"


def test_malformed_lines_fail_with_file_and_line(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [ROWS[0], ROWS[1], "{not json", ROWS[3]])
    with pytest.raises(ValueError, match=rf"{src}:3: invalid JSON"):
        CorpusStore.build(src, tmp_path / "s", show_progress=False)
    src = write_jsonl(tmp_path / "d.jsonl", [ROWS[0], {"id": "x"}])
    with pytest.raises(ValueError, match=rf'{src}:2: no "contents" or "text"'):
        CorpusStore.build(src, tmp_path / "s", show_progress=False)


def test_malformed_lines_skipped_and_counted(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [ROWS[0], "{not json", {"id": "x"}, ROWS[1], "[]"])
    store = CorpusStore.build(src, tmp_path / "s", skip_malformed=True, show_progress=False)
    assert store.ids == ["d1", "d2"] and store[1][0] == "d2"
    assert json.loads((tmp_path / "s" / "store.json").read_text())["skipped"] == 3
    scan = CorpusScan(src, skip_malformed=True)
    assert [doc_id for _, doc_id, _, _ in scan] == ["d1", "d2"] and scan.skipped == 3


def test_duplicate_ids_always_fail(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [ROWS[0], ROWS[1], ROWS[0]])
    with pytest.raises(ValueError, match=rf"{src}:3: duplicate id 'd1' \(first at line 1\)"):
        CorpusStore.build(src, tmp_path / "s", skip_malformed=True, show_progress=False)


def test_store_detects_changed_or_missing_source(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", ROWS)
    CorpusStore.build(src, tmp_path / "s", show_progress=False)
    with open(src, "a") as f:
        f.write(json.dumps({"id": "new", "contents": "x"}) + "\n")
    with pytest.raises(ValueError, match="changed since the store was built"):
        CorpusStore.open(tmp_path / "s")
    src.unlink()
    with pytest.raises(FileNotFoundError, match="is missing"):
        CorpusStore.open(tmp_path / "s")
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        CorpusStore.build(src, tmp_path / "s2")


def test_manifest_roundtrip_and_errors(tmp_path):
    write_manifest(tmp_path / "idx", "bm25", tmp_path / "c.jsonl", k1=0.9)
    manifest = read_manifest(tmp_path / "idx")
    assert manifest == {"kind": "bm25", "corpus": str((tmp_path / "c.jsonl").resolve()), "k1": 0.9}
    assert index_kind(tmp_path / "idx") == "bm25"
    with pytest.raises(FileNotFoundError, match="searchrl_index.json"):
        read_manifest(tmp_path / "nowhere")
    (tmp_path / "idx" / "searchrl_index.json").write_text("{bad")
    with pytest.raises(ValueError, match="invalid JSON"):
        read_manifest(tmp_path / "idx")
    (tmp_path / "idx" / "searchrl_index.json").write_text('{"corpus": "x"}')
    with pytest.raises(ValueError, match='"kind"'):
        read_manifest(tmp_path / "idx")
    write_manifest(tmp_path / "idx", "splade", tmp_path / "c.jsonl")
    with pytest.raises(ValueError, match="unknown index kind 'splade'"):
        load_retriever(tmp_path / "idx")
