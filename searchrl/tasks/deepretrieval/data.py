"""DeepRetrieval's retrieval task families as records for the query-rewriting env.

Every record has "id" and "question" (the user's text, shown to the policy and used as the raw query), plus:
- beir (classic IR, an unzipped BEIR dataset): "qrels" {doc id: graded relevance}.
- literature (PubMed / ClinicalTrials.gov, LEADS-style <split>.jsonl): "qrels" {PMID or NCT id: 1} and
  "max_date", PubMed's publication-date cut-off "YYYY/MM/DD" ("" for none). Rows give "question" or a
  "pico" object rendered as DeepRetrieval's data_preprocess/pubmed.py `convert_dict_to_str` does.
- spider / bird (text-to-SQL database search, the original <split>.json lists): "db_id", "db_path",
  "gold_sql", "knowledge" (BIRD's evidence, "" for Spider), "schema", the schema prompt text, and
  "reasoning", the item's optional "reasoning" string ("" when it has none): the thinking a reasoning cold
  start trains on before the gold SQL (the paper's SFT distilled it from GPT-4o, Appendix "Other Training
  details"; pat-jj/DeepRetrieval code/src/cold_start/sql/generate_data.py).
Databases are only ever opened read-only and immutable, so reading a schema never writes anything.
"""
from __future__ import annotations

import contextlib
import datetime
import pathlib
import sqlite3
from typing import Any, Mapping, Sequence, TypedDict

from searchrl.data import beir
from searchrl.data.datasets import FORMATS, DataFormat
from searchrl.data.jsonl import DataFormatError, read_jsonl, string_field, unique_id
from searchrl.retrieval.corpus import JSONError, parse_json

PICO_KEYS = ("P", "I", "C", "O")
SQL_FORMATS = ("spider", "bird")
_SQL_FIELDS = {"spider": ("query", None), "bird": ("SQL", "evidence")}  # format: (gold SQL, knowledge)
_DATE_FORMAT = "%Y/%m/%d"


class RetrievalRecord(TypedDict):
    """A query with its graded relevance judgements (format "beir")."""

    id: str
    question: str
    qrels: dict[str, int]


class LiteratureRecord(TypedDict):
    """A literature review's query with its relevant PMIDs or NCT ids (format "literature")."""

    id: str
    question: str
    qrels: dict[str, int]
    max_date: str


class SqlRecord(TypedDict):
    """A question over one SQLite database with its gold SQL (formats "spider" and "bird")."""

    id: str
    question: str
    db_id: str
    db_path: str
    gold_sql: str
    knowledge: str
    schema: str
    reasoning: str


def read_beir_task(root: str | pathlib.Path, split: str) -> list[RetrievalRecord]:
    """The queries of one split of an unzipped BEIR dataset, the query text as the question."""
    return [RetrievalRecord(id=q["id"], question=q["text"], qrels=q["qrels"])
            for q in beir.read_beir_split(root, split)]


def pico_to_text(pico: Mapping[str, str]) -> str:
    """The question text of a PICO element, exactly as DeepRetrieval's `convert_dict_to_str` writes it."""
    return "".join(f"{key}: {pico[key]}\n" for key in PICO_KEYS)


def _pico(value: Any, location: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise DataFormatError(location, f"expected an object with keys {PICO_KEYS}, got {value!r}", "pico")
    for key in PICO_KEYS:
        if key not in value:
            raise DataFormatError(location, "missing", f"pico.{key}")
        if not isinstance(value[key], str):
            raise DataFormatError(location, f"expected a string, got {value[key]!r}", f"pico.{key}")
    return value


def _literature_question(row: dict[str, Any], location: str) -> str:
    """The row's "question", or its "pico" rendered as text; exactly one of the two must be given."""
    has_question, has_pico = row.get("question") is not None, row.get("pico") is not None
    if has_question and has_pico:
        raise DataFormatError(location, "give 'question' or 'pico', not both", "pico")
    if has_pico:
        return pico_to_text(_pico(row["pico"], location))
    if "question" not in row:
        raise DataFormatError(location, "missing (and no 'pico' either)", "question")
    return string_field(row, "question", location).strip()


def _relevant_ids(value: Any, location: str) -> list[str]:
    """A non-empty list of non-empty ids; integer PMIDs become strings."""
    if not isinstance(value, list) or not value:
        raise DataFormatError(location, f"expected a non-empty list of ids, got {value!r}", "relevant_ids")
    ids = []
    for i, id_ in enumerate(value):
        if isinstance(id_, int) and not isinstance(id_, bool):
            id_ = str(id_)
        if not isinstance(id_, str) or not id_.strip():
            message = f"item {i} must be a non-empty string, got {id_!r}"
            raise DataFormatError(location, message, "relevant_ids")
        ids.append(id_.strip())
    return ids


def _max_date(row: dict[str, Any], location: str) -> str:
    """The optional "YYYY/MM/DD" publication-date cut-off (PubMed's esearch maxdate), "" when absent."""
    date = string_field(row, "max_date", location, required=False, allow_empty=True).strip()
    if date:
        try:
            datetime.datetime.strptime(date, _DATE_FORMAT)
        except ValueError:
            raise DataFormatError(location, f"expected a date YYYY/MM/DD, got {date!r}", "max_date") from None
    return date


def read_literature_jsonl(path: str | pathlib.Path) -> list[LiteratureRecord]:
    """Reads and validates a literature-search JSONL file: one review per line, ids unique."""
    records, seen = [], {}
    for location, row in read_jsonl(path):
        id_ = unique_id(seen, string_field(row, "id", location, allow_int=True), location, "id")
        records.append(LiteratureRecord(
            id=id_, question=_literature_question(row, location),
            qrels={doc: 1 for doc in _relevant_ids(row.get("relevant_ids"), location)},
            max_date=_max_date(row, location)))
    return records


def database_dirs(root: str | pathlib.Path, split: str) -> tuple[pathlib.Path, ...]:
    """Where a SQL dataset's <db_id>/<db_id>.sqlite may be, in order: database/ (Spider),
    <split>_databases/ (BIRD) and <split>_database/ (Spider's test_database/)."""
    root = pathlib.Path(root).absolute()
    return root / "database", root / f"{split}_databases", root / f"{split}_database"


def _is_file(path: pathlib.Path) -> bool:
    """path.is_file(), False too where the name is too long to look up."""
    try:
        return path.is_file()
    except OSError:
        return False


def find_database(dirs: Sequence[str | pathlib.Path], db_id: str, location: str) -> pathlib.Path:
    """The first dirs[k]/<db_id>/<db_id>.sqlite that exists; a DataFormatError naming every path tried. A
    db_id is a plain name: one with a path separator, or "." or "..", is an error."""
    if "/" in db_id or "\x00" in db_id or db_id in (".", ".."):
        raise DataFormatError(location, f"not a database name (a plain folder name): {db_id!r}", "db_id")
    tried = [pathlib.Path(d).absolute() / db_id / f"{db_id}.sqlite" for d in dirs]
    for path in tried:
        if _is_file(path):
            return path
    message = f"unknown db_id {db_id!r}: none of {[str(p) for p in tried]} exists"
    raise DataFormatError(location, message, "db_id")


def _connect_read_only(db_path: pathlib.Path) -> sqlite3.Connection:
    """A connection that cannot write the database nor create journal, -wal or -shm files beside it."""
    return sqlite3.connect(db_path.absolute().as_uri() + "?mode=ro&immutable=1", uri=True)


def sqlite_schema(db_path: str | pathlib.Path) -> str:
    """The CREATE TABLE statements of a database in sqlite_master order, blank-line separated: BIRD's schema
    prompt (data_preprocess/bird.py `generate_schema_prompt`, num_rows=None). sqlite's own sqlite_sequence
    table is left out, as that function means to (its check compares a row tuple with the name, so keeps
    it)."""
    db_path = pathlib.Path(db_path)
    try:
        with contextlib.closing(_connect_read_only(db_path)) as conn:
            tables = conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table'").fetchall()
    except sqlite3.DatabaseError as e:
        raise DataFormatError(str(db_path), f"cannot read the schema ({e})") from None
    return "\n\n".join(sql for name, sql in tables if name != "sqlite_sequence")


def _sql_file_schema(path: pathlib.Path) -> str:
    """A .sql file without its lines that contain "insert" (any case), stripped."""
    try:
        with path.open(encoding="utf-8") as f:
            return "".join(line for line in f if "insert" not in line.lower()).strip()
    except UnicodeDecodeError as e:
        raise DataFormatError(str(path), f"not UTF-8 ({e.reason})") from None


def spider_schema(db_path: str | pathlib.Path, db_id: str) -> str:
    """Spider's schema prompt (data_preprocess/spider.py `generate_schema_prompt`): the schema.sql, else the
    <db_id>.sql, next to the database, without its INSERT lines. A database with neither file gets its
    sqlite_master CREATE statements (`sqlite_schema`), where the public code leaves the schema empty."""
    folder = pathlib.Path(db_path).parent
    for sql_file in (folder / "schema.sql", folder / f"{db_id}.sql"):
        if sql_file.is_file():
            return _sql_file_schema(sql_file)
    return sqlite_schema(db_path)


def schema_prompt(db_path: str | pathlib.Path, db_id: str, format: str) -> str:
    """The schema text shown with a question of a "spider" or "bird" dataset."""
    return spider_schema(db_path, db_id) if format == "spider" else sqlite_schema(db_path)


def json_list(path: pathlib.Path) -> list[Any]:
    """A JSON file holding a list; errors name the file (and the line of a syntax error)."""
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    try:
        items = parse_json(path.read_bytes())
    except JSONError as e:
        raise DataFormatError(f"{path}:{e.line}" if e.line else str(path), str(e)) from None
    if not isinstance(items, list):
        raise DataFormatError(str(path), f"expected a JSON list of questions, got {type(items).__name__}")
    return items


def read_sql_task(root: str | pathlib.Path, split: str, format: str) -> list[SqlRecord]:
    """The questions of root/<split>.json (Spider: db_id, question, query; BIRD: db_id, question, evidence,
    SQL; either: an optional reasoning), each with its database (see `database_dirs`) and schema prompt; ids are "<split>_<index>"."""
    if format not in SQL_FORMATS:
        raise ValueError(f"unknown SQL format {format!r}; known: {SQL_FORMATS}")
    sql_field, knowledge_field = _SQL_FIELDS[format]
    path = pathlib.Path(root).absolute() / f"{split}.json"
    dirs, schemas, records = database_dirs(root, split), {}, []
    for i, item in enumerate(json_list(path)):
        location = f"{path}[{i}]"
        if not isinstance(item, dict):
            raise DataFormatError(location, f"expected a JSON object, got {type(item).__name__}")
        question = string_field(item, "question", location).strip()
        gold_sql = string_field(item, sql_field, location)
        knowledge = string_field(item, knowledge_field, location, allow_empty=True) if knowledge_field else ""
        reasoning = string_field(item, "reasoning", location, required=False).strip()
        db_id = string_field(item, "db_id", location)
        db_path = find_database(dirs, db_id, location)
        if db_path not in schemas:
            schemas[db_path] = schema_prompt(db_path, db_id, format)
        records.append(SqlRecord(id=f"{split}_{i}", question=question, db_id=db_id, db_path=str(db_path),
                                 gold_sql=gold_sql, knowledge=knowledge, schema=schemas[db_path],
                                 reasoning=reasoning))
    return records


_FILES = {  # what each format reads under dir/<dataset>/
    "beir": ("queries.jsonl", "qrels/{split}.tsv"),
    "literature": ("{split}.jsonl",),
    "spider": ("{split}.json",),
    "bird": ("{split}.json",),
}


def task_root(directory: str, name: str, split: str, format: str) -> pathlib.Path:
    """directory/<name>, once the files that `format` reads for `split` are all there."""
    root = pathlib.Path(directory, name)
    files = [f.format(split=split) for f in _FILES[format]]
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"No {' and '.join(missing)} for {format} dataset {name!r} "
                                f"under {directory!r} (config.data.dir).")
    return root


def read_beir(directory: str, name: str, split: str) -> list[RetrievalRecord]:
    return read_beir_task(task_root(directory, name, split, "beir"), split)


def read_literature(directory: str, name: str, split: str) -> list[LiteratureRecord]:
    return read_literature_jsonl(task_root(directory, name, split, "literature") / f"{split}.jsonl")


def read_spider(directory: str, name: str, split: str) -> list[SqlRecord]:
    return read_sql_task(task_root(directory, name, split, "spider"), split, "spider")


def read_bird(directory: str, name: str, split: str) -> list[SqlRecord]:
    return read_sql_task(task_root(directory, name, split, "bird"), split, "bird")


FORMATS.register("beir")(DataFormat(read_beir, RetrievalRecord))
FORMATS.register("literature")(DataFormat(read_literature, LiteratureRecord))
FORMATS.register("spider")(DataFormat(read_spider, SqlRecord))
FORMATS.register("bird")(DataFormat(read_bird, SqlRecord))
