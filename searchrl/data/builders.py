"""TFDS builders for the search-QA, BEIR, literature-search and text-to-SQL datasets, stored as array_record
(no TensorFlow needed).

Every builder reads files placed by hand in a manual directory:

    manual_dir/
      nq/                 one folder per QA dataset (FlashRAG JSONL), any of:
        train.jsonl         {"id", "question", "golden_answers", "metadata"} per line
        dev.jsonl
        test.jsonl
      scifact/            one folder per BEIR dataset (the unzipped BEIR archive):
        corpus.jsonl        {"_id", "title", "text"} per line
        queries.jsonl       {"_id", "text"} per line
        qrels/test.tsv      query-id, corpus-id, score (and train.tsv / dev.tsv when present)
      pubmed/             one folder per literature-search dataset, a split per <split>.jsonl:
        test.jsonl          {"id", "question" or "pico", "relevant_ids", "max_date"?} per line
      spider/             one folder per text-to-SQL dataset, a split per <split>.json (but *tables.json):
        dev.json            [{"db_id", "question", "query"}, ...]  (BIRD: "evidence" and "SQL")
        database/<db_id>/<db_id>.sqlite  (or <split>_databases/..., BIRD's layout)

Build and read:

    records = load_qa("nq", "test", data_dir="~/searchrl_data", manual_dir="~/flashrag")
    source = prepare_qa("nq", data_dir, manual_dir).as_data_source("test")   # random access, bytes
    tfds.data_source("flashrag_qa/nq", split="test", data_dir=data_dir)       # same, once built
    records = load_sql("bird", "bird", "dev", data_dir, manual_dir)           # db_path found in manual_dir

A built dataset is reused; delete data_dir/<builder>/<name> to rebuild after the files change.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds

from searchrl.data import beir, flashrag, retrieval_tasks
from searchrl.retrieval.corpus import CorpusScan

QA_DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
QA_SPLITS = ("train", "dev", "test")
BEIR_DATASETS = ("msmarco", "trec-covid", "nfcorpus", "nq", "hotpotqa", "fiqa", "arguana", "webis-touche2020",
                 "quora", "dbpedia-entity", "scidocs", "fever", "climate-fever", "scifact")
BEIR_CORPUS_SPLIT = "corpus"
LITERATURE_DATASETS = ("pubmed", "ctgov")
_FILE_FORMAT = "array_record"
_READ_CHUNK = 4096


class FlashragQa(tfds.core.GeneratorBasedBuilder):
    """FlashRAG QA datasets; one config per dataset, one split per file found."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=name) for name in QA_DATASETS]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Place FlashRAG JSONL files as <manual_dir>/<dataset>/{train,dev,test}.jsonl (any subset of the "
        f"three), <dataset> one of {', '.join(QA_DATASETS)}.")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Open-domain QA questions with gold answers (FlashRAG); metadata is JSON text.",
            features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(),
                "question": tfds.features.Text(),
                "golden_answers": tfds.features.Sequence(tfds.features.Text()),
                "metadata": tfds.features.Text(),
            }),
            disable_shuffling=True,  # keep file order
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        root = pathlib.Path(dl_manager.manual_dir) / self.builder_config.name
        files = {split: root / f"{split}.jsonl" for split in QA_SPLITS if (root / f"{split}.jsonl").is_file()}
        if not files:
            raise FileNotFoundError(f"no {{train,dev,test}}.jsonl in {root}. "
                                    f"{self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
        return {split: self._generate_examples(path) for split, path in files.items()}

    def _generate_examples(self, path: pathlib.Path) -> Iterator[tuple[int, dict[str, Any]]]:
        for i, record in enumerate(flashrag.read_flashrag_jsonl(path)):
            yield i, {**record, "metadata": json.dumps(record["metadata"], ensure_ascii=False)}


class BeirRetrieval(tfds.core.GeneratorBasedBuilder):
    """A BEIR dataset: the "corpus" split holds passages, each qrels split holds its queries.

    Every example has id, title, text and qrels; passages have empty qrels, queries an empty title.
    Names outside BUILDER_CONFIGS work too: `BeirRetrieval(config=tfds.core.BuilderConfig(name=...))`.
    """

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=name) for name in BEIR_DATASETS]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Unzip the BEIR archive as <manual_dir>/<dataset>/ with corpus.jsonl, queries.jsonl and "
        "qrels/<split>.tsv.")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="BEIR passages (split 'corpus'); queries with graded qrels, a split per qrels file.",
            features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(),
                "title": tfds.features.Text(),
                "text": tfds.features.Text(),
                "qrels": tfds.features.Sequence({
                    "corpus_id": tfds.features.Text(),
                    "score": tfds.features.Scalar(dtype=np.int32),
                }),
            }),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        root = pathlib.Path(dl_manager.manual_dir) / self.builder_config.name
        splits = sorted(p.stem for p in (root / "qrels").glob("*.tsv"))
        if not (root / "corpus.jsonl").is_file() or not splits:
            raise FileNotFoundError(f"{root} needs corpus.jsonl and qrels/<split>.tsv. "
                                    f"{self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
        return {split: self._generate_examples(root, split) for split in (BEIR_CORPUS_SPLIT, *splits)}

    def _generate_examples(self, root: pathlib.Path, split: str) -> Iterator[tuple[int, dict[str, Any]]]:
        if split == BEIR_CORPUS_SPLIT:
            scan = CorpusScan(root / "corpus.jsonl", show_progress=True)
            for i, (_, doc_id, title, text) in enumerate(scan):
                yield i, {"id": doc_id, "title": title, "text": text, "qrels": []}
            return
        for i, query in enumerate(beir.read_beir_split(root, split)):
            qrels = [{"corpus_id": doc, "score": score} for doc, score in query["qrels"].items()]
            yield i, {"id": query["id"], "title": "", "text": query["text"], "qrels": qrels}


class LiteratureSearch(tfds.core.GeneratorBasedBuilder):
    """Literature-search reviews (PubMed PMIDs, ClinicalTrials.gov NCT ids); one split per <split>.jsonl.

    A "pico" row is stored with its rendered question text. Names outside BUILDER_CONFIGS work too.
    """

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=name) for name in LITERATURE_DATASETS]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Place JSONL files as <manual_dir>/<dataset>/<split>.jsonl, one review a line: {\"id\", \"question\" "
        "or \"pico\" {P, I, C, O}, \"relevant_ids\": [...], \"max_date\": \"YYYY/MM/DD\" (optional)}.")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Literature-review queries with their relevant document ids and a date cut-off.",
            features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(),
                "question": tfds.features.Text(),
                "relevant_ids": tfds.features.Sequence(tfds.features.Text()),
                "max_date": tfds.features.Text(),
            }),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        root = pathlib.Path(dl_manager.manual_dir) / self.builder_config.name
        files = sorted(root.glob("*.jsonl"))
        if not files:
            raise FileNotFoundError(f"no <split>.jsonl in {root}. {self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
        return {path.stem: self._generate_examples(path) for path in files}

    def _generate_examples(self, path: pathlib.Path) -> Iterator[tuple[int, dict[str, Any]]]:
        for i, record in enumerate(retrieval_tasks.read_literature_jsonl(path)):
            yield i, {"id": record["id"], "question": record["question"],
                      "relevant_ids": list(record["qrels"]), "max_date": record["max_date"]}


class _SqlQuestions(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Text-to-SQL questions with their gold SQL and schema prompt; one split per <split>.json.

    The database path is not stored: `load_sql` finds it again in the manual dir or a given database dir.
    """

    FORMAT = ""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=f"{self.FORMAT} questions over SQLite databases: gold SQL, knowledge, schema prompt.",
            features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(),
                "question": tfds.features.Text(),
                "db_id": tfds.features.Text(),
                "gold_sql": tfds.features.Text(),
                "knowledge": tfds.features.Text(),
                "schema": tfds.features.Text(),
            }),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        root = pathlib.Path(dl_manager.manual_dir) / self.builder_config.name
        splits = sorted(p.stem for p in root.glob("*.json") if not p.stem.endswith("tables"))
        if not splits:
            raise FileNotFoundError(f"no <split>.json in {root}. {self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
        return {split: self._generate_examples(root, split) for split in splits}

    def _generate_examples(self, root: pathlib.Path, split: str) -> Iterator[tuple[int, dict[str, Any]]]:
        for i, record in enumerate(retrieval_tasks.read_sql_task(root, split, self.FORMAT)):
            yield i, {key: value for key, value in record.items() if key != "db_path"}


class SpiderSql(_SqlQuestions):
    """Spider (Yu et al., 2018): the original <split>.json files and database/ folder."""

    FORMAT = "spider"
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="spider")]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Unzip Spider as <manual_dir>/<dataset>/ with <split>.json (e.g. train_spider.json, dev.json) and "
        "database/<db_id>/<db_id>.sqlite (schema.sql beside it when present).")


class BirdSql(_SqlQuestions):
    """BIRD (Li et al., 2023): the original <split>.json files and <split>_databases/ folder."""

    FORMAT = "bird"
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="bird")]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Unzip BIRD's split as <manual_dir>/<dataset>/ with <split>.json (e.g. dev.json) and "
        "<split>_databases/<db_id>/<db_id>.sqlite.")


SQL_BUILDERS = {"spider": SpiderSql, "bird": BirdSql}


def _path(path: str | pathlib.Path) -> str:
    return str(pathlib.Path(path).expanduser())


def _prepare(builder: tfds.core.DatasetBuilder, manual_dir: str | pathlib.Path | None):
    """Builds the dataset unless it already exists in data_dir."""
    manual = _path(manual_dir) if manual_dir else None
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual))
    return builder


def prepare_qa(name: str, data_dir: str | pathlib.Path,
               manual_dir: str | pathlib.Path | None = None) -> FlashragQa:
    """The built FlashragQa builder for `name` (built from manual_dir on first use)."""
    if name not in QA_DATASETS:
        raise ValueError(f"unknown QA dataset {name!r}; known: {QA_DATASETS}")
    builder = FlashragQa(config=name, data_dir=_path(data_dir), file_format=_FILE_FORMAT)
    return _prepare(builder, manual_dir)


def prepare_beir(name: str, data_dir: str | pathlib.Path,
                 manual_dir: str | pathlib.Path | None = None) -> BeirRetrieval:
    """The built BeirRetrieval builder for `name` (built from manual_dir on first use)."""
    config = name if name in BEIR_DATASETS else tfds.core.BuilderConfig(name=name)
    builder = BeirRetrieval(config=config, data_dir=_path(data_dir), file_format=_FILE_FORMAT)
    return _prepare(builder, manual_dir)


def prepare_literature(name: str, data_dir: str | pathlib.Path,
                       manual_dir: str | pathlib.Path | None = None) -> LiteratureSearch:
    """The built LiteratureSearch builder for `name` (built from manual_dir on first use)."""
    config = name if name in LITERATURE_DATASETS else tfds.core.BuilderConfig(name=name)
    builder = LiteratureSearch(config=config, data_dir=_path(data_dir), file_format=_FILE_FORMAT)
    return _prepare(builder, manual_dir)


def prepare_sql(format: str, name: str, data_dir: str | pathlib.Path,
                manual_dir: str | pathlib.Path | None = None) -> _SqlQuestions:
    """The built SpiderSql or BirdSql builder (`format` "spider" or "bird") for dataset `name`."""
    if format not in SQL_BUILDERS:
        raise ValueError(f"unknown SQL format {format!r}; known: {tuple(SQL_BUILDERS)}")
    config = name if name == format else tfds.core.BuilderConfig(name=name)
    builder = SQL_BUILDERS[format](config=config, data_dir=_path(data_dir), file_format=_FILE_FORMAT)
    return _prepare(builder, manual_dir)


def _text(value: bytes) -> str:
    return value.decode("utf-8")


def _read_all(source) -> list[dict[str, Any]]:
    """Every example of a data source, read in batched chunks (`__getitems__` is the batch read)."""
    return [ex for start in range(0, len(source), _READ_CHUNK)
            for ex in source.__getitems__(range(start, min(start + _READ_CHUNK, len(source))))]


def decode_qa(example: dict[str, Any]) -> flashrag.QARecord:
    """A stored FlashragQa example as a QA record."""
    return flashrag.QARecord(id=_text(example["id"]), question=_text(example["question"]),
                             golden_answers=[_text(a) for a in example["golden_answers"]],
                             metadata=json.loads(_text(example["metadata"])))


def decode_beir_doc(example: dict[str, Any]) -> beir.BeirDoc:
    """A stored corpus example as a passage."""
    return beir.BeirDoc(id=_text(example["id"]), title=_text(example["title"]), text=_text(example["text"]))


def decode_beir_query(example: dict[str, Any]) -> beir.BeirQuery:
    """A stored query example with its qrels."""
    qrels = example["qrels"]
    return beir.BeirQuery(id=_text(example["id"]), text=_text(example["text"]),
                          qrels={_text(d): int(s) for d, s in zip(qrels["corpus_id"], qrels["score"])})


def decode_literature(example: dict[str, Any]) -> retrieval_tasks.LiteratureRecord:
    """A stored LiteratureSearch example as a literature record."""
    return retrieval_tasks.LiteratureRecord(
        id=_text(example["id"]), question=_text(example["question"]),
        qrels={_text(doc): 1 for doc in example["relevant_ids"]}, max_date=_text(example["max_date"]))


def decode_sql(example: dict[str, Any], db_path: str) -> retrieval_tasks.SqlRecord:
    """A stored SQL example as a SQL record, with the path of its database."""
    return retrieval_tasks.SqlRecord(
        id=_text(example["id"]), question=_text(example["question"]), db_id=_text(example["db_id"]),
        db_path=db_path, gold_sql=_text(example["gold_sql"]), knowledge=_text(example["knowledge"]),
        schema=_text(example["schema"]))


def load_qa(name: str, split: str, data_dir: str | pathlib.Path,
            manual_dir: str | pathlib.Path | None = None) -> list[flashrag.QARecord]:
    """All records of one split of a QA dataset, in file order."""
    source = prepare_qa(name, data_dir, manual_dir).as_data_source(split=split)
    return [decode_qa(ex) for ex in _read_all(source)]


def load_beir(name: str, split: str, data_dir: str | pathlib.Path,
              manual_dir: str | pathlib.Path | None = None) -> list[beir.BeirDoc] | list[beir.BeirQuery]:
    """The passages (split "corpus") or the queries with qrels (any qrels split) of a BEIR dataset."""
    source = prepare_beir(name, data_dir, manual_dir).as_data_source(split=split)
    decode = decode_beir_doc if split == BEIR_CORPUS_SPLIT else decode_beir_query
    return [decode(ex) for ex in _read_all(source)]


def load_literature(name: str, split: str, data_dir: str | pathlib.Path,
                    manual_dir: str | pathlib.Path | None = None) -> list[retrieval_tasks.LiteratureRecord]:
    """All records of one split of a literature-search dataset, in file order."""
    source = prepare_literature(name, data_dir, manual_dir).as_data_source(split=split)
    return [decode_literature(ex) for ex in _read_all(source)]


def load_sql(format: str, name: str, split: str, data_dir: str | pathlib.Path,
             manual_dir: str | pathlib.Path | None = None,
             database_dir: str | pathlib.Path | None = None) -> list[retrieval_tasks.SqlRecord]:
    """All records of one split of a "spider" or "bird" dataset, in file order. Each db_path is
    database_dir/<db_id>/<db_id>.sqlite when database_dir is given, else found in manual_dir/<name>/ as the
    direct reader finds it (`retrieval_tasks.database_dirs`)."""
    if database_dir is None and manual_dir is None:
        raise ValueError("load_sql needs manual_dir or database_dir to find the databases")
    builder = prepare_sql(format, name, data_dir, manual_dir)
    dirs = ([pathlib.Path(_path(database_dir))] if database_dir is not None
            else retrieval_tasks.database_dirs(pathlib.Path(_path(manual_dir)) / name, split))
    records, db_paths = [], {}
    for i, ex in enumerate(_read_all(builder.as_data_source(split=split))):
        db_id = _text(ex["db_id"])
        if db_id not in db_paths:
            location = f"{builder.name}/{name}:{split}[{i}]"
            db_paths[db_id] = str(retrieval_tasks.find_database(dirs, db_id, location))
        records.append(decode_sql(ex, db_paths[db_id]))
    return records
