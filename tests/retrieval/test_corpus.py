"""Corpus parsing (FlashRAG, BEIR), the offset-indexed store, malformed lines, index manifests and atomic
index builds."""
import json
import os

import numpy as np
import pytest

from searchrl.retrieval import index_kind, load_retriever
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.retrieval.corpus import CorpusScan, CorpusStore, JSONError, building, join_contents, \
    parse_json, parse_record, read_manifest, split_contents, write_manifest
from searchrl.retrieval.types import Hit
from searchrl.serving.server import format_results
from searchrl.tasks.search_r1.env import format_passages


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
    ('"Alan Turing"\nAlan was here', ('"Alan Turing"', "Alan was here")),  # wiki-18: quotes kept
    ("Plain\nbody\nmore", ("Plain", "body\nmore")),
    ("no newline at all", ("", "no newline at all")),
    ('"half quoted\nx', ('"half quoted', "x")),
    ('""\nempty title', ('""', "empty title")),
    (" padded \n text ", (" padded ", " text ")),
    ("\nno title line", ("", "\nno title line")),
    ("title only\n", ("title only", "")),
    ("", ("", "")),
])
def test_split_contents_round_trips(contents, expected):
    assert split_contents(contents) == expected
    assert join_contents(*expected) == contents


WIKI = [  # wiki-18 rows, and the edge cases of Search-R1's first-line split
    '"Evan Morris"\nEvan L. Morris (January 26, 1977 \u2013 July 9, 2015) was a lobbyist.',
    '"Morris (surname)"\nMorris is a surname.\nIt has a second line.',
    '"Morris"\n\nMorris after a blank line.',
    "Morris on a single line",
    "\nMorris after an empty first line",
]


def passages2string(documents):
    """Search-R1's `_passages2string` (search_r1/llm_agent/generation.py), on its /retrieve documents."""
    out = ""
    for idx, doc_item in enumerate(documents):
        content = doc_item["document"]["contents"]
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        out += f"Doc {idx+1}(Title: {title}) {text}\n"
    return out


def test_served_contents_are_the_stored_bytes(tmp_path):
    src = write_jsonl(tmp_path / "wiki.jsonl", [{"id": str(i), "contents": c} for i, c in enumerate(WIKI)])
    hits = BM25Retriever.build(src, tmp_path / "idx", show_progress=False).search(["morris"], 10)[0]
    assert sorted(h.contents for h in hits) == sorted(WIKI)
    body = json.loads(json.dumps(format_results([hits], return_scores=True)))
    assert [doc["document"]["contents"] for doc in body["result"][0]] == [h.contents for h in hits]
    observation = format_passages(hits)
    assert observation == passages2string(body["result"][0])  # every row, titled or not
    assert 'Doc 1(Title: "' in observation and "(Title: Evan Morris)" not in observation


def test_parse_record_formats():
    assert parse_record(ROWS[0]) == ("d1", '"Alan Turing"',
                                     "Alan Turing was a mathematician.\nHe broke codes.")
    assert parse_record(ROWS[1]) == ("d2", "Ada Lovelace", "She wrote the first program.")
    assert parse_record(ROWS[2]) == ("7", "", "An untitled passage.")
    assert Hit("d1", 0.0, *parse_record(ROWS[0])[1:]).contents == ROWS[0]["contents"]


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
    assert store[0] == ("d1", '"Alan Turing"', "Alan Turing was a mathematician.\nHe broke codes.")
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


HAZARDS = [  # (line bytes, what the error says)
    (b"[" * 100_000 + b"]" * 100_000, r"nested too deeply"),
    (b'{"id": ' + b"9" * 5000 + b', "contents": "x"}', r"Exceeds the limit \(4300 digits\)"),
    (b'{"id": "a", "contents": "caf\xe9"}', r"not UTF-8 \(invalid continuation byte at byte 29\)"),
    (b'{"id": "a", "contents": "\\ud800"}', r"lone UTF-16 surrogate"),
    (b'{"id": "a", "contents": "x"', r"invalid JSON \(Expecting ',' delimiter at column 28\)"),
]


@pytest.mark.parametrize("line, reason", HAZARDS)
def test_hazardous_lines_name_file_line_and_reason(tmp_path, line, reason):
    src = tmp_path / "c.jsonl"
    src.write_bytes(json.dumps(ROWS[0]).encode() + b"\n" + line + b"\n")
    with pytest.raises(ValueError, match=rf"{src}:2: .*{reason}"):
        CorpusStore.build(src, tmp_path / "s", show_progress=False)
    scan = CorpusScan(src, skip_malformed=True)
    assert [doc_id for _, doc_id, _, _ in scan] == ["d1"] and scan.skipped == 1


def test_parse_json():
    assert parse_json(b'\xef\xbb\xbf{"a": "\\ud83d\\ude00"}\r\n') == {"a": "\U0001F600"}  # BOM, a pair
    assert parse_json('"\\\\ud800"') == "\\ud800"  # an escaped backslash, not a surrogate
    with pytest.raises(JSONError, match="at column 1") as error:
        parse_json('[1,\n]')
    assert error.value.line == 2
    with pytest.raises(JSONError) as error:
        parse_json("{")
    assert error.value.line == 0


def test_manifest_not_utf8(tmp_path):
    (tmp_path / "searchrl_index.json").write_bytes(b'{"kind": "\xff"}')
    with pytest.raises(ValueError, match="searchrl_index.json: not UTF-8"):
        read_manifest(tmp_path)


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_building_moves_into_place_and_replaces_an_index(tmp_path):
    out = tmp_path / "a" / "b" / "idx"
    with building(out) as tmp:
        assert tmp.parent == out.parent and tmp.name.startswith(".idx.") and not out.exists()
        write_manifest(tmp, "bm25", tmp_path / "c.jsonl", version=1)
    assert read_manifest(out)["version"] == 1
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())
    with building(out) as tmp:
        write_manifest(tmp, "bm25", tmp_path / "c.jsonl", version=2)
    assert read_manifest(out)["version"] == 2 and os.listdir(out.parent) == ["idx"]


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_failed_build_leaves_nothing_behind(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with building(tmp_path / "new" / "deeper" / "idx") as tmp:
            (tmp / "half-written").write_text("x")
            raise RuntimeError("boom")
    assert _tree(tmp_path) == []
    with building(tmp_path / "idx") as tmp:
        write_manifest(tmp, "bm25", tmp_path / "c.jsonl", version=1)
    before = _tree(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with building(tmp_path / "idx") as tmp:
            raise KeyboardInterrupt
    assert _tree(tmp_path) == before and read_manifest(tmp_path / "idx")["version"] == 1


def test_building_refuses_what_is_not_an_index(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    for target, reason in ((tmp_path / "notes", "not a searchrl index dir"),
                           (tmp_path / "file", "not a directory")):
        with pytest.raises(ValueError, match=reason):
            with building(target):
                pass
    assert _tree(tmp_path) == ["file", "notes", "notes/keep.txt"]
    (tmp_path / "empty").mkdir()
    with building(tmp_path / "empty") as tmp:
        write_manifest(tmp, "bm25", tmp_path / "c.jsonl")
    assert read_manifest(tmp_path / "empty")["kind"] == "bm25"


def test_failed_bm25_rebuild_keeps_the_index(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", ROWS)
    BM25Retriever.build(good, tmp_path / "idx", show_progress=False)
    before = _tree(tmp_path / "idx")
    bad = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], "{oops"])
    with pytest.raises(ValueError, match=rf"{bad}:2: invalid JSON"):
        BM25Retriever.build(bad, tmp_path / "idx", show_progress=False)
    assert _tree(tmp_path / "idx") == before
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "good.jsonl", "idx"]
    assert load_retriever(tmp_path / "idx").search(["Turing"], 1)[0][0].id == "d1"


def test_corpus_without_an_indexable_term(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "contents": "the and of"},
                                             {"id": "b", "title": "", "text": "?! a b"}])
    with pytest.raises(ValueError, match=rf"{src}: no passage has an indexable term \(all 2 hold only"):
        BM25Retriever.build(src, tmp_path / "idx", show_progress=False)
    assert os.listdir(tmp_path) == ["c.jsonl"]
