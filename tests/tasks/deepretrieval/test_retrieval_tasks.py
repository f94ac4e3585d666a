"""DeepRetrieval's task families as records: literature JSONL, BEIR, Spider and BIRD, and load_examples."""
import json
import re

import pytest

from searchrl.data import DataFormatError, datasets
from searchrl.data.config import DataConfig
from searchrl.tasks.deepretrieval import data as retrieval_tasks
from tests.data.retrieval_helpers import (
    CONCERT_SCHEMA, PETS_TABLES, PICO, SHOP_TABLES, beir_dir, bird_dir, file_snapshot, literature_dir,
    literature_rows, spider_dir, write_json, write_jsonl)


def convert_dict_to_str(pico_dict):  # DeepRetrieval code/data_preprocess/pubmed.py, verbatim
    pico_str = ""
    pico_str += f"P: {pico_dict['P']}\n"
    pico_str += f"I: {pico_dict['I']}\n"
    pico_str += f"C: {pico_dict['C']}\n"
    pico_str += f"O: {pico_dict['O']}\n"
    return pico_str


def test_pico_text_is_the_public_rendering():
    assert retrieval_tasks.pico_to_text(PICO) == convert_dict_to_str(PICO)
    assert retrieval_tasks.pico_to_text(PICO) == (
        "P: Adults with asthma\nI: Inhaled corticosteroids\nC: \nO: Exacerbations\n")


def test_read_literature(tmp_path):
    path = literature_dir(tmp_path) / "test.jsonl"
    assert retrieval_tasks.read_literature_jsonl(path) == [
        {"id": "r1", "question": convert_dict_to_str(PICO), "qrels": {"123": 1, "456": 1},
         "max_date": "2019/05/01"},
        {"id": "7", "question": "statins after stroke", "qrels": {"NCT00000001": 1}, "max_date": ""}]


_GOOD = {"id": "x", "question": "q", "relevant_ids": ["1"]}


@pytest.mark.parametrize("row, field, message", [
    ({"question": "q", "relevant_ids": ["1"]}, "id", "missing"),
    ({**_GOOD, "id": ["x"]}, "id", "expected a string, got list"),
    ({"id": "x", "relevant_ids": ["1"]}, "question", r"missing \(and no 'pico' either\)"),
    ({**_GOOD, "question": 3}, "question", "expected a string, got int"),
    ({**_GOOD, "question": "  "}, "question", "empty"),
    ({**_GOOD, "pico": PICO}, "pico", "give 'question' or 'pico', not both"),
    ({"id": "x", "pico": "P: x", "relevant_ids": ["1"]}, "pico", "expected an object with keys"),
    ({"id": "x", "pico": {"P": "a", "I": "b", "C": "c"}, "relevant_ids": ["1"]}, "pico.O", "missing"),
    ({"id": "x", "pico": {**PICO, "C": 2}, "relevant_ids": ["1"]}, "pico.C", "expected a string, got 2"),
    ({"id": "x", "question": "q"}, "relevant_ids", "expected a non-empty list of ids, got None"),
    ({**_GOOD, "relevant_ids": []}, "relevant_ids", r"expected a non-empty list of ids, got \[\]"),
    ({**_GOOD, "relevant_ids": "123"}, "relevant_ids", "expected a non-empty list of ids, got '123'"),
    ({**_GOOD, "relevant_ids": ["1", ""]}, "relevant_ids", "item 1 must be a non-empty string, got ''"),
    ({**_GOOD, "relevant_ids": [1.5]}, "relevant_ids", "item 0 must be a non-empty string, got 1.5"),
    ({**_GOOD, "max_date": "2019-05-01"}, "max_date", "expected a date YYYY/MM/DD, got '2019-05-01'"),
    ({**_GOOD, "max_date": "2019/13/01"}, "max_date", "expected a date YYYY/MM/DD"),
    ({**_GOOD, "max_date": 2019}, "max_date", "expected a string, got int"),
])
def test_bad_literature_rows(tmp_path, row, field, message):
    path = write_jsonl(tmp_path / "pubmed" / "test.jsonl", [{**_GOOD, "id": "ok"}, row])
    expected = rf"pubmed/test.jsonl:2: field '{re.escape(field)}': {message}"
    with pytest.raises(DataFormatError, match=expected):
        retrieval_tasks.read_literature_jsonl(path)


def test_duplicate_literature_id(tmp_path):
    path = write_jsonl(tmp_path / "test.jsonl", [_GOOD, {**_GOOD, "id": "y"}, _GOOD])
    duplicate = r"test.jsonl:3: field 'id': duplicate id 'x' \(first at .*test.jsonl:1\)"
    with pytest.raises(DataFormatError, match=duplicate):
        retrieval_tasks.read_literature_jsonl(path)


def test_read_beir_task(tmp_path):
    assert retrieval_tasks.read_beir_task(beir_dir(tmp_path), "test") == [
        {"id": "q1", "question": "does aspirin help", "qrels": {"d1": 2}}]


def test_read_spider(tmp_path):
    root = spider_dir(tmp_path)
    records = retrieval_tasks.read_sql_task(root, "dev", "spider")
    concert, pets = (str(root / "database" / db / f"{db}.sqlite") for db in ("concert", "pets"))
    assert records == [
        {"id": "dev_0", "question": "How many singers are there?", "db_id": "concert", "db_path": concert,
         "gold_sql": "SELECT count(*) FROM singer", "knowledge": "", "schema": CONCERT_SCHEMA, "reasoning": ""},
        {"id": "dev_1", "question": "List every pet kind.", "db_id": "pets", "db_path": pets,
         "gold_sql": "SELECT kind FROM pet", "knowledge": "", "schema": "\n\n".join(PETS_TABLES), "reasoning": ""},
        {"id": "dev_2", "question": "Names of singers?", "db_id": "concert", "db_path": concert,
         "gold_sql": "SELECT Name FROM singer", "knowledge": "", "schema": CONCERT_SCHEMA, "reasoning": ""}]


def test_spider_schema_from_db_id_sql(tmp_path):
    root = spider_dir(tmp_path)
    folder = root / "database" / "concert"
    (folder / "schema.sql").rename(folder / "concert.sql")
    assert retrieval_tasks.spider_schema(folder / "concert.sqlite", "concert") == CONCERT_SCHEMA


def test_read_bird(tmp_path):
    root = bird_dir(tmp_path)
    db_path = str(root / "dev_databases" / "shop" / "shop.sqlite")
    schema = "\n\n".join(SHOP_TABLES)  # sqlite_sequence, the index and the view are left out
    assert retrieval_tasks.read_sql_task(root, "dev", "bird") == [
        {"id": "dev_0", "question": "What is the cheapest product?", "db_id": "shop", "db_path": db_path,
         "gold_sql": "SELECT id FROM product ORDER BY cost LIMIT 1",
         "knowledge": "cheapest refers to MIN(cost)", "schema": schema, "reasoning": ""},
        {"id": "dev_1", "question": "How many orders?", "db_id": "shop", "db_path": db_path,
         "gold_sql": "SELECT count(*) FROM `order`", "knowledge": "", "schema": schema, "reasoning": ""}]


def test_database_found_under_split_databases_for_spider_too(tmp_path):
    root = spider_dir(tmp_path)
    (root / "database").rename(root / "dev_databases")
    records = retrieval_tasks.read_sql_task(root, "dev", "spider")
    assert records[1]["db_path"] == str(root / "dev_databases" / "pets" / "pets.sqlite")
    assert records[0]["schema"] == CONCERT_SCHEMA


def test_schema_read_once_per_database(tmp_path, monkeypatch):
    root, calls = spider_dir(tmp_path), []
    schema_prompt = retrieval_tasks.schema_prompt
    monkeypatch.setattr(retrieval_tasks, "schema_prompt", lambda *a: calls.append(a[1]) or schema_prompt(*a))
    retrieval_tasks.read_sql_task(root, "dev", "spider")
    assert calls == ["concert", "pets"]


def test_reading_schemas_writes_nothing(tmp_path):
    spider_dir(tmp_path)
    bird_dir(tmp_path)
    before = file_snapshot(tmp_path)
    assert not [name for name in before if name.endswith(("-wal", "-shm", "-journal"))]
    retrieval_tasks.read_sql_task(tmp_path / "spider", "dev", "spider")
    retrieval_tasks.read_sql_task(tmp_path / "bird", "dev", "bird")
    assert file_snapshot(tmp_path) == before  # same files, byte for byte: no -wal, -shm or journal


@pytest.mark.parametrize("fmt, index, item, field, message", [
    ("spider", 1, {"db_id": "pets", "query": "SELECT 1"}, "question", "missing"),
    ("spider", 1, {"db_id": "pets", "question": "q", "query": ["S"]}, "query", "expected a string, got list"),
    ("spider", 1, {"db_id": "pets", "question": "q", "SQL": "SELECT 1"}, "query", "missing"),
    ("spider", 1, {"question": "q", "query": "SELECT 1"}, "db_id", "missing"),
    ("spider", 1, {"db_id": 3, "question": "q", "query": "SELECT 1"}, "db_id", "expected a string, got int"),
    ("bird", 1, {"db_id": "shop", "question": "q", "SQL": "SELECT 1"}, "evidence", "missing"),
    ("bird", 1, {"db_id": "shop", "question": "q", "evidence": "", "query": "SELECT 1"}, "SQL", "missing"),
])
def test_bad_sql_items(tmp_path, fmt, index, item, field, message):
    root = spider_dir(tmp_path) if fmt == "spider" else bird_dir(tmp_path)
    items = json.loads((root / "dev.json").read_text())[:1] + [item]
    write_json(root / "dev.json", items)
    with pytest.raises(DataFormatError, match=rf"{fmt}/dev.json\[{index}\]: field '{field}': {message}"):
        retrieval_tasks.read_sql_task(root, "dev", fmt)


def test_unknown_db_id_names_the_paths_tried(tmp_path):
    root = bird_dir(tmp_path)
    write_json(root / "dev.json", [{"db_id": "nope", "question": "q", "evidence": "", "SQL": "SELECT 1"}])
    with pytest.raises(DataFormatError) as error:
        retrieval_tasks.read_sql_task(root, "dev", "bird")
    message = str(error.value)
    assert message.startswith(f"{root / 'dev.json'}[0]: field 'db_id': unknown db_id 'nope': none of")
    for folder in ("database", "dev_databases", "dev_database"):
        assert str(root / folder / "nope" / "nope.sqlite") in message


@pytest.mark.parametrize("text, where, message", [
    ('{"db_id": "shop"}', "dev.json", "expected a JSON list of questions, got dict"),
    ('[\n{"db_id": "shop"},\n{"db_id": }\n]', "dev.json:3", "invalid JSON"),
    ('[{"db_id": "shop", "question": "q", "evidence": "", "SQL": "S"}, "q2"]', r"dev.json\[1\]",
     "expected a JSON object, got str"),
    ("[" * 100_000, "dev.json", r"invalid JSON \(nested too deeply\)"),
    ('[\n{"db_id": ' + "9" * 4301 + "}]", "dev.json", r"invalid JSON \(Exceeds the limit \(4300 digits\)"),
    ('[{"db_id": "\\udbff"}]', "dev.json", r"invalid JSON \(a \\u escape of a lone UTF-16 surrogate"),
])
def test_bad_sql_files(tmp_path, text, where, message):
    root = bird_dir(tmp_path)
    (root / "dev.json").write_text(text)
    with pytest.raises(DataFormatError, match=rf"bird/{where}: {message}"):
        retrieval_tasks.read_sql_task(root, "dev", "bird")


def test_unreadable_database_and_schema_file(tmp_path):
    root = bird_dir(tmp_path)
    db_path = root / "dev_databases" / "shop" / "shop.sqlite"
    db_path.write_bytes(b"not a database" * 100)
    with pytest.raises(DataFormatError, match=rf"{re.escape(str(db_path))}: cannot read the schema"):
        retrieval_tasks.read_sql_task(root, "dev", "bird")
    root = spider_dir(tmp_path)
    schema_sql = root / "database" / "concert" / "schema.sql"
    schema_sql.write_bytes(b"CREATE TABLE \xff;\n")
    with pytest.raises(DataFormatError, match=rf"{re.escape(str(schema_sql))}: not UTF-8"):
        retrieval_tasks.read_sql_task(root, "dev", "spider")
    with pytest.raises(ValueError, match="unknown SQL format 'wikisql'"):
        retrieval_tasks.read_sql_task(root, "dev", "wikisql")


_KEYS = {
    "literature": {"id", "question", "qrels", "max_date", "dataset"},
    "beir": {"id", "question", "qrels", "dataset"},
    "spider": {"id", "question", "db_id", "db_path", "gold_sql", "knowledge", "schema", "reasoning", "dataset"},
    "bird": {"id", "question", "db_id", "db_path", "gold_sql", "knowledge", "schema", "reasoning", "dataset"},
}


def test_load_examples_by_format(tmp_path):
    literature_dir(tmp_path, "pubmed")
    literature_dir(tmp_path, "ctgov")
    beir_dir(tmp_path)
    spider_dir(tmp_path)
    bird_dir(tmp_path)
    for fmt, names, split in [("literature", "pubmed, ctgov", "test"), ("beir", "scifact", "test"),
                              ("spider", "spider", "dev"), ("bird", "bird", "dev")]:
        out = datasets.load_examples(str(tmp_path), names, split, fmt, "")
        assert list(out) == [n.strip() for n in names.split(",")]
        for name, records in out.items():
            assert len(records) and all(set(r) == _KEYS[fmt] and r["dataset"] == name for r in records)
    pubmed = datasets.load_examples(str(tmp_path), "pubmed", "test", "literature", "")["pubmed"]
    assert pubmed[0]["question"] == convert_dict_to_str(literature_rows()[0]["pico"])
    bird = datasets.load_examples(str(tmp_path), "bird", "dev", "bird", "")["bird"]
    direct = retrieval_tasks.read_sql_task(tmp_path / "bird", "dev", "bird")
    assert list(bird) == [{**r, "dataset": "bird"} for r in direct]


def test_load_examples_qa_is_the_default(tmp_path):
    write_jsonl(tmp_path / "nq" / "test.jsonl", [{"id": "1", "question": "q?", "golden_answers": ["a"]}])
    record = {"id": "1", "question": "q?", "golden_answers": ["a"], "metadata": {}, "dataset": "nq"}
    loaded = datasets.load_examples(str(tmp_path), "nq", "test", DataConfig().format, DataConfig().tfds_dir)
    assert {name: list(records) for name, records in loaded.items()} == {"nq": [record]}
    assert DataConfig().format == "qa"


def test_load_examples_errors(tmp_path):
    known = r"config.data.format='sql' is not a known data format; known: \['beir', 'bird', 'literature', 'qa'"
    with pytest.raises(ValueError, match=known):
        datasets.load_examples(str(tmp_path), "x", "test", "sql", "")
    (tmp_path / "scifact" / "qrels").mkdir(parents=True)
    missing = r"No queries.jsonl and qrels/test.tsv for beir dataset 'scifact'"
    with pytest.raises(FileNotFoundError, match=missing):
        datasets.load_examples(str(tmp_path), "scifact", "test", "beir", "")
    missing = r"No dev.json for bird dataset 'bird' under .*\(config.data.dir\)"
    with pytest.raises(FileNotFoundError, match=missing):
        datasets.load_examples(str(tmp_path), "bird", "dev", "bird", "")
    with pytest.raises(FileNotFoundError, match=r"No train.jsonl for literature dataset 'pubmed'"):
        datasets.load_examples(str(tmp_path), "pubmed", "train", "literature", "")


REASONING = "Count the rows of singer: every singer is one row, so count(*) over the table answers it."


@pytest.mark.parametrize("reasoning", [True, False])
def test_sql_cold_start_trains_on_the_records_reasoning(tmp_path, reasoning):
    """The SFT target of a record holding a reasoning string is that text in <think>, then the gold SQL (the
    no-reasoning variant: the gold SQL alone); a reasoning cold start on a record without one is refused."""
    from searchrl.tasks.deepretrieval import env as qr

    root = spider_dir(tmp_path, split="train")
    items = json.loads((root / "train.json").read_text())
    items[0]["reasoning"] = f"\n{REASONING}\n"
    write_json(root / "train.json", items)
    records = retrieval_tasks.read_sql_task(root, "train", "spider")
    assert [r["reasoning"] for r in records] == [REASONING, "", ""]
    env = qr.QueryRewriteEnv(qr.Config(task="sql", reasoning=reasoning), None)
    full = env.template.assistant + env.reference_response(records[0])
    if reasoning:
        assert full == ("Let me write the SQL query with reasoning. \n<think>\n" + REASONING +
                        '\n</think>\n<answer>\n{"sql": "SELECT count(*) FROM singer"}\n</answer>')
        with pytest.raises(ValueError, match=r"SQL example 'train_1' .* no \"reasoning\": .* empty <think>"):
            env.reference_response(records[1])
    else:
        assert full == 'Let me write the SQL query. \n<answer>\n{"sql": "SELECT count(*) FROM singer"}\n</answer>'
        assert env.reference_response(records[1]).endswith('{"sql": "SELECT kind FROM pet"}\n</answer>')
