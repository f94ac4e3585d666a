"""Fuzzing every parser of model output: arbitrary text never raises, and results are well typed; and the
envs' action parsers take linear time on 1 MB adversarial texts.

Texts are either arbitrary (surrogates included: a JSON escape can make one) or made of the protocol's
fragments, so that tags, end tokens, fences and JSON meet often.
"""
import json
import math
import sqlite3
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from searchrl.episode import Action
from searchrl.retrieval.types import Hit, QueryRefused
from searchrl.serving import server
from searchrl.tasks.autosearch import rewards as au
from searchrl.tasks.deepretrieval import engines
from searchrl.tasks.deepretrieval import env as qr
from searchrl.tasks.deepretrieval import rewards as dr
from searchrl.tasks.rpl import env as program
from searchrl.tasks.rpl.sdk import RetrievalSDK
from searchrl.tasks.search_r1 import env as search_env
from searchrl.tasks.search_r1 import rewards as search_r1_rewards
from searchrl.text import protocol, qa, tags

FRAGMENTS = [
    "<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<answer>",
    "</answer>", "<program>", "</program>", "<|im_start|>assistant", "<|im_end|>", "<|eot_id|>",
    "<|endoftext|>", "<", ">", "/", " ", "\n", "```", "```json\n", '{"query": "', '{"sql": "', '"', "}", "{",
    "[", "]", "\\u", "\\ud800", "1" * 5, "Paris", "the", "a", "SELECT ", " FROM item", "'", "\x00", "\u3000",
]
any_char = st.characters(exclude_categories=())
texts = st.one_of(st.text(any_char, max_size=200),
                  st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(any_char, max_size=3)),
                           max_size=40).map("".join))
golds = st.lists(st.text(max_size=10), min_size=1, max_size=3)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def is_check(check: protocol.FormatCheck) -> bool:
    return isinstance(check.ok, bool) and isinstance(check.reason, str) and check.ok == (check.reason == "")


def is_strings(values: object) -> bool:
    return isinstance(values, list) and all(isinstance(v, str) for v in values)


def is_unit(value: float) -> bool:
    return isinstance(value, float) and 0.0 <= value <= 1.0


@FUZZ
@given(texts)
def test_protocol(text):
    assert isinstance(protocol.response_part(text), str)
    assert is_check(protocol.check_sequence(text))
    assert is_check(protocol.check_turn(text, "search")) and is_check(protocol.check_turn(text, "answer"))
    assert protocol.extract_answer(text) is None or isinstance(protocol.extract_answer(text), str)
    assert is_strings(protocol.extract_queries(text)) and is_strings(protocol.information_blocks(text))


@FUZZ
@given(texts, st.sampled_from(["think", "search", "answer", "information"]))
def test_tags(text, tag):
    block = tags.first_block(text, tags.SEARCH, tags.ANSWER)
    assert block is None or (block[0] in (tags.SEARCH, tags.ANSWER) and isinstance(block[1], str))
    span = tags.find_block(text, tag)
    assert span is None or text[span.start:span.end] == tags.block(tag, text[span.inner_start:span.inner_end])
    assert is_strings(tags.blocks(text, tag))
    assert (tags.replace_blocks(text, tag, "") == text) == (span is None)
    assert isinstance(tags.until_close(text, tag), str)


@FUZZ
@given(texts, golds)
def test_qa_and_search_r1(text, answers):
    assert isinstance(qa.normalize_answer(text), str)
    assert all(is_unit(metric(text, answers)) for metric in (qa.exact_match, qa.cover_em, qa.f1))
    assert isinstance(qa.has_answer(text, answers), bool)
    assert search_r1_rewards.search_r1_em_reward(text, answers) in (0.0, 1.0)
    reward = search_r1_rewards.search_r1_reward(text, answers, search_r1_rewards.RewardConfig())
    assert any(math.isclose(reward, value) for value in (0.0, 0.1, 0.2, 0.3, 0.8, 1.0))
    assert isinstance(search_r1_rewards.retrieval_hit(text, answers), bool)


@FUZZ
@given(st.lists(texts, min_size=1, max_size=4), texts, golds)
def test_autosearch(turn_texts, answer_text, answers):
    vectors = au.tfidf_vectors(turn_texts)
    assert vectors.shape[0] == len(turn_texts) and np.isfinite(vectors).all()
    assert isinstance(au.is_redundant(turn_texts[0], turn_texts[1:], 0.8), bool)
    steps = [au.SearchTurn(t, protocol.extract_answer(t), protocol.check_turn(t, "search").ok)
             for t in turn_texts]
    answer = au.AnswerTurn(answer_text, protocol.check_turn(answer_text, "answer").ok)
    record = au.AutoSearchRecord(steps, answer, [protocol.extract_answer(t) for t in turn_texts], answers)
    rewards = au.autosearch_rewards(record)
    assert len(rewards.total) == len(turn_texts) + 1 and all(math.isfinite(r) for r in rewards.total)
    assert np.allclose(rewards.total, np.add(np.add(rewards.base, rewards.quality), rewards.efficiency))


@FUZZ
@given(texts, st.sampled_from(["query", "sql"]), st.booleans())
def test_deepretrieval_parsing(text, key, reasoning):
    assert is_check(dr.check_structure(text, reasoning))
    parsed = dr.parse_json_answer(text, key, reasoning)
    assert isinstance(parsed.structure_ok, bool) and isinstance(parsed.reason, str)
    assert parsed.value is None or (parsed.value == parsed.value.strip() != "")
    assert (parsed.reason == "") == (parsed.structure_ok and parsed.value is not None)
    metric = None if parsed.value is None else 1.0
    assert all(isinstance(reward(parsed, metric), float) for reward in (dr.tiered_reward, dr.gated_reward))


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "shop.db"
    with sqlite3.connect(path) as conn:
        conn.executescript("CREATE TABLE item(id INTEGER, name TEXT, price REAL);"
                           "INSERT INTO item VALUES (1, 'pen', 1.5), (2, 'book', 12.0);")
    conn.close()
    return path


SQL_FRAGMENTS = ["SELECT ", "name", "count(*)", " FROM item", " WHERE ", "price > 1", "(", ")", ",", "'", "%",
                 "fts3_tokenizer('simple')", "zeroblob(10)", "printf('%.*c', 1000, 'x')", "\ud800", "\x00",
                 ";", " UNION SELECT 1", " ORDER BY 1", "PRAGMA ", "ATTACH 'x' AS y", "json('[]')", "--"]


@settings(max_examples=100, deadline=None)
@given(st.one_of(texts, st.lists(st.sampled_from(SQL_FRAGMENTS), max_size=12).map("".join)))
def test_sql_execution_match(db, sql):
    cfg = dr.RewardConfig(sql_timeout_s=2.0)
    score, reason = dr.sql_execution_match(db, sql, "SELECT name FROM item", cfg)
    assert score in (0.0, 1.0) and isinstance(reason, str) and (score == 1.0) == (reason == "")


SEARCH_ENV = search_env.SearchEnv(None, search_env.Config(max_turns=2))
QUERY_REWRITE = [qr.QueryRewriteEnv(qr.Config(task="sql"), None),
                 qr.QueryRewriteEnv(qr.Config(task="evidence", reasoning=False), object())]
PROGRAM = program.ProgramEnv(program.Config(), RetrievalSDK())


def is_action(action: Action, kinds: tuple[str, ...]) -> bool:
    return action.kind in kinds and isinstance(action.content, str) and isinstance(action.done, bool)


@FUZZ
@given(texts, st.integers(0, 3))
def test_env_actions(text, turn):
    assert is_action(SEARCH_ENV.parse_action(text, turn), ("search", "answer", "invalid"))
    assert all(is_action(env.parse_action(text, turn), ("rewrite", "invalid")) for env in QUERY_REWRITE)
    assert is_action(PROGRAM.parse_action(text, turn), ("program", "answer", "invalid"))
    assert isinstance(program.program_source(text), str) and is_strings(program.parse_ids(text))


MB = 1_000_000


@pytest.mark.parametrize("text", [
    "<search>" * (MB // 8),
    "<answer><program>" * (MB // 17) + "</answer>",
    "<think>" * (MB // 14) + "<answer>" * (MB // 16),
    " " * MB + "x",
    "<|im_end|>" * (MB // 10) + "x",
    "<answer>```" + "-" * MB,
    "<think>x</think><answer>" + "[" * MB + "</answer>",
])
def test_env_actions_take_linear_time(text):
    start = time.perf_counter()
    SEARCH_ENV.parse_action(text, 0)
    for env in QUERY_REWRITE:
        env.parse_action(text, 0)
    PROGRAM.parse_action(text, 0)
    assert time.perf_counter() - start < 1.0


class EncodingRetriever:
    """A backend that, like a tokenizer, a URL or an HTTP body, fails the whole call on text it cannot
    encode, and refuses a query holding "((" as a search engine refuses a bad Boolean query."""

    def search(self, queries, k):
        for q in queries:
            q.encode("utf-8")
            if "((" in q:
                raise QueryRefused("cannot parse the query")
        return [[Hit(f"{q[:3]}-{i}", 1.0 / (i + 1)) for i in range(k)] for q in queries]


SEARCHING = search_env.SearchEnv(EncodingRetriever(), search_env.Config(topk=2))
SEARCH_SPACE = program.ProgramEnv(program.Config(action_space="search"),
                                  RetrievalSDK(sparse=EncodingRetriever()))
PROGRAMS = program.ProgramEnv(program.Config(),
                              RetrievalSDK(sparse=EncodingRetriever(), dense=EncodingRetriever()))
REWRITING = qr.QueryRewriteEnv(qr.Config(task="classic", reasoning=False, depth=3, compare_raw=False),
                               EncodingRetriever())
query_texts = st.one_of(texts, st.text(st.sampled_from(["\ud800", "\udfff", " ", "a", "(", "\x00"]),
                                       max_size=8))


@FUZZ
@given(st.lists(query_texts, min_size=1, max_size=3))
def test_any_model_text_sent_to_a_backend_is_an_observation_or_a_reward(queries):
    """Lone surrogates, blanks and refused queries, alone or with good neighbours, never raise."""
    searches = [Action("search", q) for q in queries + ["good"]]
    for env in (SEARCHING, SEARCH_SPACE):
        observations = env.observe(searches)
        assert observations[-1].info["doc_ids"] and all(isinstance(o.text, str) for o in observations)
    for q in queries:
        for function in ("sparse_retrieval", "dense_retrieval"):
            [observation] = PROGRAMS.observe([Action("program", f"show({function}({q!r}, 2))")])
            assert isinstance(observation.text, str)
    responses = [f"{json.dumps({'query': q})}\n</answer>" for q in queries + ["ok"]]  # after "<answer>\n"
    examples = [{"id": str(i), "question": "q", "qrels": {"ok-0": 1}} for i in range(len(responses))]
    rows = REWRITING.results(responses, examples)
    assert rows[-1].metrics["recall@10"] == 1.0


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), query_texts,
              st.sampled_from(["1", "\u00b2", "1_0", "\u0663", "9" * 30, "NCT0001", "tok"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["esearchresult", "count", "idlist", "ERROR", "error", "studies", "protocolSection",
                         "identificationModule", "nctId", "nextPageToken", "queries", "topk"]), inner,
        max_size=4), max_leaves=12)


@FUZZ
@given(json_values, query_texts)
def test_engine_responses_cache_lines_and_server_requests(body, header):
    """What a search engine or a client sends is parsed into ids or a documented error, never a crash."""
    for parse in (lambda: engines.parse_esearch(body, 0), lambda: engines.parse_studies(body)):
        try:
            ids, _ = parse()
        except (engines.Malformed, engines.Refused):
            continue
        assert all(engines.is_id(i) for i in ids)
    wait = engines.retry_after_s(header)
    assert wait is None or 0.0 <= wait <= engines.MAX_RETRY_AFTER_S
    line = json.dumps({"engine": "pubmed", "query": header, "k": 3, "ids": body}).encode() + b"\n"
    record = engines._decode(line)
    assert record is None or all(engines.is_id(i) for i in record["ids"])
    try:
        queries, _, _ = server.parse_request(body, server.Limits())
    except server.RequestError:
        return
    assert all(q.strip() and q.encode("utf-8") for q in queries)
