"""The command line: one program against a real BM25 index, printed as JSON."""
import json

import pytest

from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.tasks.rpl import run

CORPUS = [
    {"_id": "turing", "title": "Alan Turing", "text": "Turing formalised computation with his machine."},
    {"_id": "lovelace", "title": "Ada Lovelace", "text": "Lovelace wrote the first published program."},
    {"_id": "curie", "title": "Marie Curie", "text": "Curie discovered polonium and radium."},
    {"_id": "darwin", "title": "Charles Darwin", "text": "Darwin proposed evolution by natural selection."},
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("programs")
    (tmp / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    BM25Retriever.build(tmp / "corpus.jsonl", tmp / "index", show_progress=False)
    return tmp / "index"


def run_cli(index_dir, tmp_path, capsys, source):
    program = tmp_path / "program.py"
    program.write_text(source)
    run.main(["--index", str(index_dir), str(program)])
    return json.loads(capsys.readouterr().out)


def test_runs_a_program_against_an_index(index_dir, tmp_path, capsys):
    source = ("queries = ['who discovered radium', 'natural selection']\n"
              "runs = [sparse_retrieval(q, top_k=2) for q in queries]\n"
              "show(dedup(fuse(*runs, top_k=2)))\n")
    out = run_cli(index_dir, tmp_path, capsys, source)
    assert out["error"] is None
    assert [hit["id"] for hit in out["shown"]] == ["curie", "darwin"]
    assert out["shown"][0]["title"] == "Marie Curie"
    assert out["shown"][0]["text"] == "Curie discovered polonium and radium."
    assert (out["retrieval_calls"], out["docs_retrieved"]) == (2, 2)
    assert out["primitives"] == ["dedup", "fuse", "sparse_retrieval"] and out["steps"] > 0


def test_prints_program_errors(index_dir, tmp_path, capsys):
    source = "show(sparse_retrieval('radium', 1))\nx = dense_retrieval('radium')"
    out = run_cli(index_dir, tmp_path, capsys, source)
    assert [hit["id"] for hit in out["shown"]] == ["curie"]
    assert out["error"] == "sdk error: dense_retrieval: no dense retriever is configured (line 2, column 5)"
    out = run_cli(index_dir, tmp_path, capsys, "import os")
    assert out["error"] == "forbidden syntax: imports (line 1, column 1)" and out["shown"] == []


def test_needs_one_program_file(index_dir, capsys):
    with pytest.raises(SystemExit) as exit_:
        run.main(["--index", str(index_dir)])
    assert exit_.value.code == 1 and "expected one PROGRAM_FILE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        run.main(["--help"])
    assert exit_.value.code == 0 and "--index DIR PROGRAM_FILE" in capsys.readouterr().out
