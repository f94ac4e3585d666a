"""A local index kind added by one registration (here, inside the test: a case-sensitive exact-match index
with a build flag of its own) is built, opened and searched through the usual entry points: the index CLI,
`load_retriever`, `make_retriever`, the search CLI and RPL's program runner."""
import json
import os
from pathlib import Path
from typing import Sequence

import pytest
from absl import flags

from searchrl.registry import Registry
from searchrl.retrieval import (Hit, RetrievalConfig, index, index_kind, is_dense, load_retriever,
                                make_retriever, read_manifest, search, write_manifest)
from searchrl.retrieval.corpus import CorpusScan, building
from searchrl.retrieval.kinds import INDEX_KINDS, BuildFlag, IndexKind
from searchrl.tasks.rpl import run

CORPUS = [
    {"_id": "curie", "title": "Marie Curie", "text": "Curie discovered polonium and radium."},
    {"_id": "darwin", "title": "Charles Darwin", "text": "Darwin proposed evolution by natural selection."},
    {"_id": "radium", "title": "Radium", "text": "Radium glows; radium is radioactive."},
]


class ExactRetriever:
    """Passages holding the query as written (or in any case), scored by how often they hold it."""

    def __init__(self, index_dir: str | os.PathLike):
        self.case_sensitive = read_manifest(index_dir)["case_sensitive"]
        self.passages = [Hit(**row) for row in json.loads((Path(index_dir) / "passages.json").read_text())]

    @staticmethod
    def build(corpus: str | os.PathLike, out_dir: str | os.PathLike, *, skip_malformed: bool,
              case_sensitive: bool) -> "ExactRetriever":
        with building(out_dir) as out:
            scan = CorpusScan(corpus, skip_malformed)
            rows = [{"id": doc_id, "score": 0.0, "title": title, "text": text}
                    for _, doc_id, title, text in scan]
            (out / "passages.json").write_text(json.dumps(rows))
            write_manifest(out, "exact", scan.path, count=len(rows), case_sensitive=case_sensitive)
        return ExactRetriever(out_dir)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        fold = (lambda s: s) if self.case_sensitive else str.lower
        scored = [[Hit(p.id, float(fold(p.contents).count(fold(q))), p.title, p.text) for p in self.passages]
                  for q in queries]
        return [sorted((h for h in hits if h.score), key=lambda h: -h.score)[:k] for hits in scored]


INDEX_KINDS.register("exact")(IndexKind(ExactRetriever.build, ExactRetriever, flags=(
    BuildFlag("case_sensitive", flags.DEFINE_boolean, False, "match the query's case"),)))


@pytest.fixture(scope="module")
def exact_index(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exact")
    (tmp / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    index.main(["--kind", "exact", "--corpus", str(tmp / "corpus.jsonl"), "--out", str(tmp / "index"),
                "--case_sensitive"])
    return tmp / "index"


def test_the_index_cli_builds_it_with_its_own_flag(exact_index, capsys):
    assert read_manifest(exact_index)["case_sensitive"] is True and read_manifest(exact_index)["count"] == 3
    assert index_kind(exact_index) == "exact" and not is_dense(exact_index)
    with pytest.raises(SystemExit):
        index.main(["--help"])
    assert "--[no]case_sensitive: match the query's case (exact)" in capsys.readouterr().out


def test_load_and_make_retriever_open_it(exact_index):
    config = RetrievalConfig(kind="local", index_dir=str(exact_index))
    for retriever in (load_retriever(exact_index), make_retriever(config)):
        hits = retriever.search(["radium", "Radium", "Galapagos"], 2)
        assert [[(h.id, h.score) for h in row] for row in hits] == [  # case-sensitive, as built
            [("curie", 1.0), ("radium", 1.0)], [("radium", 2.0)], []]


def test_search_cli_and_program_runner_search_it(exact_index, tmp_path, capsys):
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"_id": "q1", "text": "natural selection"}) + "\n")
    search.main(["--index", str(exact_index), "--queries", str(queries), "-k", "1"])
    assert json.loads(capsys.readouterr().out)["hits"] == [{"id": "darwin", "score": 1.0}]
    program = tmp_path / "program.py"
    program.write_text("show(sparse_retrieval('polonium', top_k=3))\n")
    run.main(["--index", str(exact_index), str(program)])
    out = json.loads(capsys.readouterr().out)
    assert out["error"] is None and [hit["id"] for hit in out["shown"]] == ["curie"]


def test_kinds_declaring_one_flag_differently_are_an_error(monkeypatch):
    kinds = Registry("index kind", "--kind")
    for name, default in (("a", 1), ("b", 2)):
        kinds.register(name)(IndexKind(ExactRetriever.build, ExactRetriever,
                                       flags=(BuildFlag("depth", flags.DEFINE_integer, default, "depth"),)))
    monkeypatch.setattr(index, "INDEX_KINDS", kinds)
    with pytest.raises(ValueError, match="index kinds 'a' and 'b' declare flag --depth differently"):
        index.define_build_flags(flags.FlagValues())
