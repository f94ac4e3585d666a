"""Recorded retrieval: an evaluation recorded against the search engines and replayed with the network off gives
the same tables; local indexes and the remote client replay their hits; a missing record names its query."""
import json
import socket

import pytest

from searchrl import run_config
from searchrl.eval import chat_api, report
from searchrl.retrieval import RetrievalConfig, make_retriever
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.retrieval.record import MissingRecord
from searchrl.retrieval.types import QueryRefused
from searchrl.tasks.deepretrieval import analysis, api_rewrites
from tests.tasks.deepretrieval.test_presets import deepretrieval
from tests.data.retrieval_helpers import write_jsonl
from tests.fakes.engines import FakeEngineServer
from tests.retrieval.test_client import OK, ScriptedServer

CORPUS = {"123": "aspirin asthma trial", "456": "inhaled corticosteroids asthma", "789": "asthma",
          "111": "statins after stroke"}
REWRITES = {"asthma": "asthma", "stroke": "statins stroke", "knee": "knee ((("}  # question word -> rewrite


def rewrite(prompts, stops):
    """An API model that rewrites each literature question by its topic word."""
    texts = []
    for prompt in prompts:
        word = next(w for w in REWRITES if w in prompt[-1]["content"].lower())
        texts.append(f'<answer>{json.dumps({"query": REWRITES[word]})}</answer>')
    return texts


def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network disabled in this test")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def evaluate(tmp_path, kind, **retrieval):
    config = deepretrieval.get_config("tiny_literature" if kind == "pubmed" else "tiny_literature_ctgov")
    config.data.update(dict(dir=str(tmp_path), eval=kind, eval_split="test"))
    config.retrieval.update(dict(options=dict(cache_path="", rate_per_s=1000.0), **retrieval))
    api = chat_api.ChatAPIConfig(base_url="http://fake", model="fake")
    return report.markdown(api_rewrites.evaluate_api(run_config.parse(config), rewrite, api), analysis.REPORT)


@pytest.mark.parametrize("kind", ["pubmed", "ctgov"])
def test_a_replayed_evaluation_gives_the_recorded_tables_with_the_network_off(tmp_path, monkeypatch, kind):
    ids = {i: (i if kind == "pubmed" else f"NCT{int(i):08d}") for i in CORPUS}
    corpus = {ids[i]: text for i, text in CORPUS.items()}
    rows = [{"id": "a", "question": "aspirin for asthma", "relevant_ids": [ids["123"], ids["789"]]},
            {"id": "b", "question": "statins after stroke", "relevant_ids": [ids["111"]]},
            {"id": "c", "question": "knee pain", "relevant_ids": [ids["123"]]}]
    if kind == "pubmed":
        rows[0]["max_date"] = "2019/05/01"  # a dated search: its window is part of what is recorded
    write_jsonl(tmp_path / kind / "test.jsonl", rows)
    record = tmp_path / "record.jsonl"
    with FakeEngineServer(corpus) as fake:
        recorded = evaluate(tmp_path, kind, url=fake.url, record=str(record))
        assert fake.request_count > 0
        fake.corpus.clear()  # the engine drifts: its results are gone
        fake.trials.clear()
        assert evaluate(tmp_path, kind, url=fake.url) != recorded
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert {line["engine"] for line in lines} == {kind}
    assert {"asthma", "statins stroke"} <= {line["query"] for line in lines}
    assert ({line["params"].get("maxdate") for line in lines} >= {"2019/05/01"}) == (kind == "pubmed")
    no_network(monkeypatch)
    assert evaluate(tmp_path, kind, url="http://127.0.0.1:9", replay=str(record)) == recorded
    # Rewrites find rows a and b whole, c nothing; of the raw questions only b's words are all in a document.
    assert f"| {kind} | recall@3000 | 0.333 | 0.667 | 0.333 |" in recorded

    REWRITES["knee"] = "knee surgery"  # a query the record lacks
    try:
        with pytest.raises(MissingRecord, match=rf"holds no {kind} search for query 'knee surgery' \(k=3000"):
            evaluate(tmp_path, kind, replay=str(record))
    finally:
        REWRITES["knee"] = "knee ((("


QUERIES = {"local": ["asthma", "stroke statins"], "remote": ["asthma"]}  # the scripted server answers one


def test_local_index_and_remote_client_replay_their_hits(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "corpus.jsonl", [{"id": i, "contents": f"{i}\n{text}"} for i, text in CORPUS.items()])
    BM25Retriever.build(tmp_path / "corpus.jsonl", tmp_path / "index")
    local = RetrievalConfig(kind="local", index_dir=str(tmp_path / "index"), record=str(tmp_path / "local.jsonl"))
    server = ScriptedServer(OK)
    try:
        remote = RetrievalConfig(kind="remote", url=server.url + "/retrieve", record=str(tmp_path / "remote.jsonl"))
        searched = {name: make_retriever(config).search(QUERIES[name], 2)
                    for name, config in (("local", local), ("remote", remote))}
    finally:
        server.close()
    assert [h.id for h in searched["local"][0]] == ["789", "456"] and searched["remote"][0][0].id == "7"
    no_network(monkeypatch)
    for name, config in (("local", local), ("remote", remote)):
        replay = RetrievalConfig(kind=config.kind, index_dir="/nowhere", url="http://127.0.0.1:9/retrieve",
                                 replay=config.record)
        assert make_retriever(replay).search(QUERIES[name], 2) == searched[name]
        with pytest.raises(MissingRecord, match=r"no .* search for query 'asthma' \(k=5\)"):
            make_retriever(replay).search(["asthma"], 5)
    with pytest.raises(ValueError, match="record=.* and replay=.*: give one"):
        make_retriever(RetrievalConfig(record="a", replay="b"))


def test_refusals_and_repeats_replay_in_order(tmp_path):
    class Drifting:
        """Answers "q" differently each time and refuses "bad" alone or in a batch."""
        calls = 0

        def search(self, queries, k):
            if "bad" in queries:
                raise QueryRefused("the engine refused 'bad'")
            Drifting.calls += 1
            return [[make_hit(f"{q}{Drifting.calls}")] for q in queries]

    from searchrl.retrieval.record import RecordingRetriever, ReplayRetriever
    from searchrl.retrieval.types import Hit, search_each

    def make_hit(i):
        return Hit(i, 1.0, "t", "x")

    recorder = RecordingRetriever(Drifting(), tmp_path / "r.jsonl", "local")
    seen = [search_each(recorder, ["q", "bad"], 1), search_each(recorder, ["q"], 1)]
    recorder.close()
    replay = ReplayRetriever(tmp_path / "r.jsonl", "local")
    again = [search_each(replay, ["q", "bad"], 1), search_each(replay, ["q"], 1), search_each(replay, ["q"], 1)]
    assert [[o if isinstance(o, list) else str(o) for o in row] for row in again[:2]] == \
        [[o if isinstance(o, list) else str(o) for o in row] for row in seen]
    assert again[2] == seen[1]  # past the recorded answers, the last one again
    (tmp_path / "bad.jsonl").write_text('{"engine": "local"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a retrieval record line"):
        ReplayRetriever(tmp_path / "bad.jsonl", "local")
