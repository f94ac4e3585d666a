"""Fuzzing every reader of user files with hypothesis: arbitrary bytes, and lines mixing near-valid rows with
hazards (deep nesting, over-long integers, invalid UTF-8, lone surrogates, BOMs, CR), never raise anything but
a ValueError (DataFormatError included) whose message starts with the file it is about (and, for line-based
files, the line); what they do accept round-trips."""
import json
import re
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchrl.data import read_beir_queries, read_beir_split, read_flashrag_jsonl
from searchrl.metric_writer import drop_rows_after, parse_row
from searchrl.retrieval.corpus import CorpusScan, CorpusStore, join_contents
from searchrl.retrieval.metrics import read_beir_qrels, read_qrels, read_trec_qrels
from searchrl.retrieval.search import read_queries
from searchrl.tasks.deepretrieval import data as retrieval_tasks
from tests.data.retrieval_helpers import bird_dir, spider_dir

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
FEW, SOME = settings(max_examples=80, **SETTINGS), settings(max_examples=200, **SETTINGS)

HAZARDS = [
    b"", b"   ", b"\r", b"\xef\xbb\xbf{}", b"[" * 3000, b'{"a": ' + b"[" * 3000, b"9" * 4301,
    b'{"id": ' + b"1" * 5000 + b"}", b"\xff\xfe", b'"caf\xe9"', b'{"id": "\\ud800"}', b'"\\udc00\\ud800"',
    b"\xed\xa0\x80", b"\x00", b"NaN", b"-Infinity", b"1e999", b"\t\x0b\x0c", b"\xc2\x85", b"\xe2\x80\xa8",
]
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
                   st.sampled_from(["", " ", "x", "1", "\n", '"T"\nbody', "2019/05/01", "concert", "shop"]))
VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


def rows(required, optional=None):
    """JSON objects: the `required` fields with plausible values (and maybe some `optional` ones), or any
    subset of both, each field plausible or any JSON value."""
    fields = {**required, **(optional or {})}
    plausible = st.fixed_dictionaries(required, optional=optional or {})
    mutated = st.fixed_dictionaries({}, optional={k: st.one_of(v, VALUES) for k, v in fields.items()})
    return st.one_of(plausible, plausible, mutated)


def dumped(values):
    """JSON text of `values`, ASCII-escaped or not, as bytes."""
    return st.tuples(values, st.booleans()).map(lambda v: json.dumps(v[0], ensure_ascii=v[1]).encode())


def joined(lines):
    """Lines joined by LF or CRLF, with or without a last line break."""
    return st.tuples(st.lists(lines, max_size=6), st.sampled_from([b"\n", b"\r\n"]), st.booleans()).map(
        lambda t: t[1].join(t[0]) + (t[1] if t[2] else b""))


def files(row_strategy):
    """File contents: rows and blank lines only, or rows mixed with other JSON, hazards and raw bytes."""
    clean = joined(st.one_of(dumped(row_strategy), dumped(row_strategy), st.just(b"")))
    dirty = joined(st.one_of(dumped(row_strategy), dumped(row_strategy), dumped(VALUES),
                             st.sampled_from(HAZARDS), st.binary(max_size=30)))
    return st.one_of(clean, dirty)


IDS = st.one_of(st.text(min_size=1, max_size=4), st.integers(0, 10**6), st.sampled_from(["q1", "q2", "", 7]))
TEXT = st.text(min_size=1, max_size=20)
CONTENTS = st.one_of(TEXT, st.lists(st.text(max_size=6), max_size=4).map("\n".join),
                     st.tuples(TEXT, TEXT).map(lambda t: f'"{t[0]}"\n{t[1]}'))
ANSWERS = st.lists(TEXT, min_size=1, max_size=3)
SCORES = st.integers(-2, 3).map(str)
BAD_SCORES = st.sampled_from(["9" * 4400, "high", "1.5", "", "1_0", "\u0663", "+1", "--1", "\u00b2"])


def tsv(separator, ids=st.text(max_size=6)):
    """Qrels-like text: a header or not, then judgement lines (query id, [iteration,] doc id, score) only, or
    mixed with junk, hazards and raw bytes."""
    def judgements(scores):
        return st.tuples(ids, st.sampled_from([[], ["0"], ["Q0"]]), ids, scores).map(
            lambda t: separator.join([str(t[0]), *t[1], str(t[2]), t[3]]).encode())
    junk = st.lists(st.one_of(st.text(max_size=6), BAD_SCORES), max_size=5).map(
        lambda fields: separator.join(fields).encode())
    clean = st.lists(judgements(SCORES), max_size=6)
    dirty = st.lists(st.one_of(judgements(st.one_of(SCORES, BAD_SCORES)), junk, st.sampled_from(HAZARDS),
                               st.binary(max_size=20)), max_size=6)
    header = st.sampled_from([[], [b"query-id\tcorpus-id\tscore"],
                              [b"\xef\xbb\xbfquery-id\tcorpus-id\tscore"]])  # with a UTF-8 byte-order mark
    return st.tuples(header, st.one_of(clean, dirty)).map(lambda t: b"\n".join(t[0] + t[1]))


def located(error, *paths, line=True):
    """`error` is one of the documented errors and starts with one of `paths` (and ':<line>: ')."""
    assert isinstance(error, ValueError), repr(error)
    suffix = r":\d+: " if line else r"(:\d+)?(\[\d+\])?: "
    assert any(re.match(re.escape(str(p)) + suffix, str(error)) for p in paths), str(error)


def read(reader, *paths, line=True):
    """The reader's result, or None after checking the error it raised."""
    try:
        return reader()
    except Exception as error:  # noqa: BLE001 - the point is to see every kind
        located(error, *paths, line=line)
        return None


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@SOME
@given(data=files(st.one_of(rows({"id": IDS, "contents": CONTENTS}),
                            rows({"_id": IDS, "title": TEXT, "text": TEXT}),
                            rows({"id": IDS, "text": TEXT}, {"title": TEXT, "contents": CONTENTS}))))
def test_corpus_jsonl(root, data):
    path = root / "corpus.jsonl"
    path.write_bytes(data)
    scanned = read(lambda: list(CorpusScan(path)), path)
    read(lambda: list(CorpusScan(path, skip_malformed=True)), path)  # duplicate ids still fail
    if scanned is None:
        return
    shutil.rmtree(root / "store", ignore_errors=True)
    store = CorpusStore.build(path, root / "store", show_progress=False)
    assert list(store) == [(doc_id, title, text) for _, doc_id, title, text in scanned]
    for offset, _, title, text in scanned:
        row = json.loads(data[offset:].split(b"\n", 1)[0].decode("utf-8").removeprefix("\ufeff"))
        if "contents" in row:
            assert join_contents(title, text) == row["contents"]  # the stored string comes back


@SOME
@given(data=files(rows({"id": IDS, "question": TEXT, "golden_answers": ANSWERS},
                       {"metadata": st.dictionaries(TEXT, LEAVES, max_size=2)})))
def test_flashrag_jsonl(root, data):
    path = root / "qa.jsonl"
    path.write_bytes(data)
    records = read(lambda: read_flashrag_jsonl(path), path)
    if records is not None:
        assert len({r["id"] for r in records}) == len(records)


@SOME
@given(data=files(st.one_of(rows({"_id": IDS, "text": TEXT}), rows({"id": IDS, "question": TEXT}))))
def test_query_jsonl(root, data):
    path = root / "queries.jsonl"
    path.write_bytes(data)
    for reader in (lambda: list(read_beir_queries(path).items()), lambda: read_queries(path)):
        queries = read(reader, path)
        if queries is not None:
            assert len({qid for qid, _ in queries}) == len(queries)


@SOME
@given(beir=tsv("\t"), trec=tsv(" "))
def test_qrels(root, beir, trec):
    for data in (beir, trec):
        path = root / "qrels.txt"
        path.write_bytes(data)
        for reader in (read_beir_qrels, read_trec_qrels, read_qrels):
            qrels = read(lambda: reader(path), path)
            if qrels is not None:
                assert all(isinstance(rel, int) and abs(rel) < 10**18
                           for docs in qrels.values() for rel in docs.values())
                assert "score" not in {doc for docs in qrels.values() for doc in docs}  # a header, BOM or not


@SOME
@given(data=files(rows({"step": st.integers(0, 6)}, {"x": st.floats(allow_nan=False), "note": TEXT})))
def test_metrics_jsonl_resume(root, data):
    """Whatever a metrics file holds, a resume keeps its rows up to the step and sets the rest of its lines
    aside, losing none."""
    path = root / "metrics.jsonl"
    path.write_bytes(data)
    (root / "metrics.jsonl.corrupt").unlink(missing_ok=True)
    drop_rows_after(str(path), 3)
    kept = [parse_row(line) for line in path.read_bytes().split(b"\n")[:-1]]
    assert all(row is not None and row["step"] <= 3 for row in kept)
    aside = root / "metrics.jsonl.corrupt"
    aside_lines = aside.read_bytes().split(b"\n")[:-1] if aside.exists() else []
    assert all(parse_row(line) is None for line in aside_lines)
    assert len(kept) + len(aside_lines) <= len([line for line in data.split(b"\n") if line.strip()])


QID_POOL = ["q1", "q2", "q3", 4]
QIDS = st.sampled_from(QID_POOL)
UNIQUE_QUERIES = st.one_of(st.lists(QIDS, unique=True), st.just(QID_POOL)).flatmap(
    lambda qids: st.lists(TEXT, min_size=len(qids), max_size=len(qids)).map(
        lambda texts: b"\n".join(json.dumps({"_id": q, "text": t}).encode() for q, t in zip(qids, texts))))


@FEW
@given(queries=st.one_of(UNIQUE_QUERIES, files(rows({"_id": QIDS, "text": TEXT}))), qrels=tsv("\t", QIDS))
def test_beir_split(root, queries, qrels):
    """Query ids from a small pool, so that qrels often refer to queries that exist."""
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True, exist_ok=True)
    (beir / "queries.jsonl").write_bytes(queries)
    (beir / "qrels" / "test.tsv").write_bytes(qrels)
    read(lambda: read_beir_split(beir, "test"), beir / "queries.jsonl", beir / "qrels" / "test.tsv")


PICO = rows({k: st.text(max_size=8) for k in ("P", "I", "C", "O")})
REVIEW = {"id": IDS, "relevant_ids": st.lists(IDS, min_size=1, max_size=3)}
DATE = {"max_date": st.sampled_from(["2019/05/01", "2019/13/01", "", "x", "2019/05/01\x00"])}


@SOME
@given(data=files(st.one_of(rows({**REVIEW, "question": TEXT}, DATE), rows({**REVIEW, "pico": PICO}, DATE))))
def test_literature_jsonl(root, data):
    path = root / "pubmed.jsonl"
    path.write_bytes(data)
    read(lambda: retrieval_tasks.read_literature_jsonl(path), path)


@pytest.fixture(scope="module")
def sql_roots(root):
    bird = bird_dir(root / "sql")
    (bird / "fuzz_databases").symlink_to(bird / "dev_databases")  # BIRD's <split>_databases/
    return {"spider": spider_dir(root / "sql"), "bird": bird}


DB_IDS = {"spider": ["concert", "pets"], "bird": ["shop"]}
ODD_DB_IDS = ["nope", "x" * 300, "a\x00b", "../shop", ".", ""]
SQL_FIELDS = {"spider": {"query": TEXT}, "bird": {"SQL": TEXT, "evidence": st.text(max_size=9)}}


def sql_files(fmt):
    """A <split>.json of `fmt`: lists of questions, or other JSON, bytes and hazards."""
    db_ids = st.one_of(st.sampled_from(DB_IDS[fmt]), st.sampled_from(DB_IDS[fmt] + ODD_DB_IDS))
    items = st.lists(rows({"db_id": db_ids, "question": TEXT, **SQL_FIELDS[fmt]}), max_size=4)
    other = st.one_of(dumped(VALUES), st.binary(max_size=60), st.sampled_from(HAZARDS))
    return st.tuples(st.just(fmt), st.one_of(dumped(items), dumped(items), other))


@SOME
@given(case=st.sampled_from(["spider", "bird"]).flatmap(sql_files))
def test_spider_bird_json(sql_roots, case):
    fmt, data = case
    path = sql_roots[fmt] / "fuzz.json"
    path.write_bytes(data)
    records = read(lambda: retrieval_tasks.read_sql_task(sql_roots[fmt], "fuzz", fmt), path, line=False)
    if records:
        assert {r["db_id"] for r in records} <= set(DB_IDS[fmt]) and all(r["schema"] for r in records)


@FEW
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes(root, sql_roots, data):
    for name, reader in (("c.jsonl", lambda p: list(CorpusScan(p))), ("qa.jsonl", read_flashrag_jsonl),
                         ("q.jsonl", read_beir_queries), ("q2.jsonl", read_queries),
                         ("lit.jsonl", retrieval_tasks.read_literature_jsonl), ("qrels.tsv", read_qrels)):
        path = root / name
        path.write_bytes(data)
        read(lambda: reader(path), path)
    path = sql_roots["bird"] / "bytes.json"
    path.write_bytes(data)
    read(lambda: retrieval_tasks.read_sql_task(sql_roots["bird"], "bytes", "bird"), path, line=False)
