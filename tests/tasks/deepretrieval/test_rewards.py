"""DeepRetrieval parsing, reward tables, NDCG and SQL execution match."""
import math
import sqlite3
import time

import pytest

from searchrl.retrieval import metrics
from searchrl.tasks.deepretrieval import rewards as dr
from searchrl.tasks.deepretrieval import sql_sandbox

MB = 1_000_000


def _response(answer: str, think: str = "<think>plan</think>") -> str:
    return f"<|im_start|>user\nexample <answer>{{\"query\": \"x\"}}</answer><|im_end|>\n" \
           f"<|im_start|>assistant\n{think}\n<answer>{answer}</answer><|im_end|>"


def test_parse_query_answer():
    parsed = dr.parse_query_answer(_response('{"query": " covid vaccine "}'), reasoning=True)
    assert parsed == dr.ParsedAnswer(value="covid vaccine", structure_ok=True, reason="")
    fenced = dr.parse_query_answer(_response('```json\n{"query": "q AND r"}\n```'), reasoning=True)
    assert fenced.value == "q AND r" and fenced.reason == ""
    assert dr.parse_sql_answer(_response('{"sql": "SELECT 1"}'), reasoning=True).value == "SELECT 1"


@pytest.mark.parametrize("text, inner", [
    ('```json\n{"query": "a"}\n```', '{"query": "a"}'),
    ('```{"query": "a"}```', '{"query": "a"}'),
    ('```json-5 {"query": "a"} ```', '{"query": "a"}'),
    ('{"query": "```a```"}', '{"query": "```a```"}'),
    ("``````", ""),
    ("````", "````"),
    ("```" + " " * 50_000 + "x", "```" + " " * 50_000 + "x"),  # no closing fence: the text as it is
])
def test_code_fences_are_unwrapped_in_linear_time(text, inner):
    assert dr._unfenced(text) == inner


def test_no_reasoning_answers_need_only_the_answer_tags():
    assert dr.parse_query_answer('<answer>{"query": "q"}</answer>', reasoning=False).structure_ok
    assert not dr.parse_query_answer('<answer>{"query": "q"}</answer>', reasoning=True).structure_ok
    out_of_order = dr.check_structure("</answer> x <answer>", reasoning=False)
    assert out_of_order.reason == "tags out of order, expected <answer>..</answer>"


@pytest.mark.parametrize("answer, reason", [
    ('{"query": "q"', "answer is not valid JSON"),
    ('["q"]', 'answer JSON has no "query" field'),
    ('{"q": "x"}', 'answer JSON has no "query" field'),
    ('{"query": 3}', '"query" must be a non-empty string, got 3'),
    ('{"query": "  "}', '"query" must be a non-empty string'),
    ("[" * 100_000, "answer is not valid JSON: maximum recursion depth exceeded"),
    ('{"query": ' + "1" * 5000 + "}", "answer is not valid JSON: Exceeds the limit (4300 digits)"),
    ('{"query": [' + "1, " * MB + "1]}", '"query" must be a non-empty string, got [1, 1, 1, 1, 1, 1, ...]'),
])
def test_parse_errors(answer, reason):
    parsed = dr.parse_query_answer(_response(answer), reasoning=True)
    assert parsed.value is None and parsed.structure_ok and parsed.reason.startswith(reason)


def test_parse_without_answer():
    parsed = dr.parse_query_answer("<|im_start|>assistant\n<think>hmm</think>", reasoning=True)
    assert parsed.value is None and not parsed.structure_ok
    assert parsed.reason == "<answer> appears 0 times, expected once"


@pytest.mark.parametrize("response, reason", [
    ("<think>a</think><think>b</think><answer>x</answer>", "<think> appears 2 times, expected once"),
    ("<answer>x</answer><think>a</think>", "tags out of order"),
    ("<answer>x</answer>", "<think> appears 0 times, expected once"),
])
def test_check_structure(response, reason):
    check = dr.check_structure(response, reasoning=True)
    assert not check.ok and check.reason.startswith(reason)
    # text outside tags is fine
    assert dr.check_structure("note <think>a</think> then <answer>x</answer>", reasoning=True).ok


@pytest.mark.parametrize("rank, score", [
    (1, 5.0), (5, 5.0), (6, 4.0), (20, 4.0), (21, 2.0), (50, 2.0), (51, 1.0), (100, 1.0),
    (101, 0.5), (1000, 0.5), (1001, 0.1), (3000, 0.1), (3001, -3.5), (None, -3.5),
])
def test_answer_rank_tiers(rank, score):
    assert dr.answer_rank_score(rank) == score


@pytest.mark.parametrize("value, score", [
    (1.0, 5.0), (0.7, 5.0), (0.69, 4.0), (0.5, 4.0), (0.45, 3.0), (0.4, 3.0), (0.35, 1.0), (0.3, 1.0),
    (0.2, 0.5), (0.1, 0.5), (0.07, 0.1), (0.05, 0.1), (0.04, -3.5), (0.0, -3.5),
])
def test_recall_tiers(value, score):
    assert dr.recall_score(value) == score


def test_recall_tier_of_a_retrieval():
    # 2 of the 4 relevant ids retrieved: recall 0.5 -> tier 4, reward 1 + 4.
    qrels = dict.fromkeys(["a", "c", "d", "e"], 1)
    retrieved = ["a", "b", "c", "x"]
    value = metrics.recall_at_k(retrieved, qrels, len(retrieved))
    assert value == 0.5
    parsed = dr.parse_query_answer(_response('{"query": "q"}'), reasoning=True)
    assert dr.tiered_reward(parsed, dr.recall_score(value)) == 5.0


def test_gated_ndcg_hand_computed():
    # qrels d1: 2, d2: 1; ranking d3, d1, d2 at k = 3:
    # DCG = 0 / log2(2) + 2 / log2(3) + 1 / log2(4) = 1.76186; ideal = 2 / log2(2) + 1 / log2(3) = 2.63093.
    ndcg = metrics.ndcg_at_k(["d3", "d1", "d2"], {"d1": 2, "d2": 1, "d3": 0}, 3)
    expected = (2 / math.log2(3) + 0.5) / (2 + 1 / math.log2(3))
    assert ndcg == pytest.approx(expected, abs=1e-12)  # 0.66965
    ok = dr.parse_query_answer(_response('{"query": "q"}'), reasoning=True)
    assert dr.gated_reward(ok, ndcg) == pytest.approx(0.1 + expected, abs=1e-12)


def test_tiered_reward():
    ok = dr.parse_query_answer(_response('{"query": "q"}'), reasoning=True)
    bad_json = dr.parse_query_answer(_response("not json"), reasoning=True)
    bad_tags = dr.parse_query_answer(_response('{"query": "q"}', think=""), reasoning=True)
    assert dr.tiered_reward(ok, dr.answer_rank_score(3)) == 1.0 + 5.0
    assert dr.tiered_reward(ok, dr.recall_score(0.0)) == 1.0 - 3.5
    assert dr.tiered_reward(bad_json, None) == 1.0 - 4.0
    assert dr.tiered_reward(bad_tags, None) == -4.0
    with pytest.raises(ValueError, match="metric score"):
        dr.tiered_reward(ok, None)


def test_gated_reward():
    ok = dr.parse_query_answer(_response('{"query": "q"}'), reasoning=True)
    assert dr.gated_reward(ok, 0.5) == pytest.approx(0.6)
    assert dr.gated_reward(ok, 0.0) == 0.0
    assert dr.gated_reward(dr.parse_query_answer(_response("{}"), reasoning=True), None) == -2.0
    no_think = dr.parse_query_answer(_response('{"query": "q"}', think=""), reasoning=True)
    assert dr.gated_reward(no_think, None) == -2.0


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "shop.db"
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE item(id INTEGER, name TEXT, price REAL);"
                       "INSERT INTO item VALUES (1, 'pen', 1.5), (2, 'book', 12.0), (3, 'pen', 2.0);")
    conn.commit()
    conn.close()
    return path


def test_sql_match(db):
    gold = "SELECT name FROM item WHERE price < 5"
    assert dr.sql_execution_match(db, "SELECT DISTINCT name FROM item WHERE price < 3", gold) == (1.0, "")
    assert dr.sql_execution_match(db, "SELECT name FROM item", gold) == (0.0, "result rows differ")


@pytest.mark.parametrize("pred, reason", [
    ("SELEC name FROM item", "predicted SQL failed: near \"SELEC\": syntax error"),
    ("SELECT nope FROM item", "predicted SQL failed: no such column: nope"),
    ("DELETE FROM item", "predicted SQL failed: not authorized"),
    ("ATTACH DATABASE 'other.db' AS o", "predicted SQL failed: not authorized"),
    ("SELECT 1; DROP TABLE item", "predicted SQL failed: You can only execute one statement at a time."),
])
def test_sql_errors(db, pred, reason):
    assert dr.sql_execution_match(db, pred, "SELECT 1") == (0.0, reason)
    assert dr.run_sql(db, "SELECT count(*) FROM item", timeout_s=5, max_rows=10) == [(3,)]  # untouched


def test_sql_limits(db):
    cfg = dr.RewardConfig(sql_timeout_s=0.2, sql_max_rows=2)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    assert dr.sql_execution_match(db, endless, "SELECT 1", cfg) == (0.0, "predicted SQL failed: interrupted")
    assert dr.sql_execution_match(db, "SELECT id FROM item", "SELECT 1", cfg) == (
        0.0, "predicted SQL failed: query returned more than 2 rows")
    assert dr.sql_execution_match(db, "SELECT 1", "SELECT bad", cfg)[1].startswith("gold SQL failed")
    with pytest.raises(FileNotFoundError, match="SQL database not found"):
        dr.sql_execution_match(db.parent / "missing.db", "SELECT 1", "SELECT 1")


@pytest.mark.parametrize("answer", [
    "[" * MB,
    '{"query": "' + "a" * MB + '"}',
    "```" + "-" * MB,
    "```" + "-" * MB + "```",
    "```json\n" + " " * MB + "```",
    '"' + "\\u0041" * (MB // 6) + '"',
    "1." + "1" * MB,
    "<answer>" * (MB // 8),
    "</answer><think>" * (MB // 16),
])
def test_parsing_takes_linear_time(answer):
    start = time.perf_counter()
    for reasoning in (True, False):
        dr.parse_sql_answer(f"<think>x</think><answer>{answer}</answer>", reasoning)
        dr.check_structure(answer, reasoning)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("pred, reason", [
    ("SELECT '\ud800'",
     "'utf-8' codec can't encode character '\\ud800' in position 8: surrogates not allowed"),
    ("SELECT fts3_tokenizer('simple')", "not authorized to use function: fts3_tokenizer"),
    ("SELECT load_extension('evil.so')", "not authorized to use function: load_extension"),
    ("SELECT zeroblob(500000000) FROM item", "not authorized to use function: zeroblob"),
    ("SELECT randomblob(9000000) FROM item", "not authorized to use function: randomblob"),
    ("SELECT sqlite_version()", "not authorized to use function: sqlite_version"),
    ("SELECT length(printf('%.*c', 5000000, 'x') || printf('%.*c', 5000001, 'x'))", "string or blob too big"),
    ("SELECT 1\x00", "the query contains a null character"),
])
def test_model_sql_never_raises(db, pred, reason):
    assert dr.sql_execution_match(db, pred, "SELECT 1") == (0.0, f"predicted SQL failed: {reason}")


def test_gold_style_functions_run(db):
    gold = ("SELECT name, count(*), avg(price), sum(price), total(price), max(price), min(price), "
            "group_concat(id), length(name), upper(substr(name, 1, 1)) || lower(substring(name, 2)), "
            "instr(name, 'e'), replace(name, 'e', 'a'), trim(' ' || name || ' '), round(avg(price), 1), "
            "coalesce(NULL, name), ifnull(NULL, 1), nullif(1, 1), iif(count(*) > 1, 'many', 'one'), "
            "CAST(sum(price) AS INTEGER), abs(-1), typeof(price), printf('%.2f', sum(price)), "
            "strftime('%Y', '2024-03-01'), date('2024-03-01', '+1 day'), julianday('2024-03-01') > 0, "
            "name LIKE 'p%', name GLOB 'b*', rank() OVER (ORDER BY sum(price) DESC), "
            "CASE WHEN max(price) > 5 THEN 'dear' ELSE 'cheap' END "
            "FROM item GROUP BY name ORDER BY name")
    assert dr.sql_execution_match(db, gold, gold) == (1.0, "")


def test_sql_results_are_capped_in_bytes(db):
    cfg = dr.RewardConfig(sql_max_result_bytes=1_000_000)
    big = "SELECT printf('%.*c', 400000 + id, 'x') FROM item"
    assert dr.sql_execution_match(db, big, "SELECT 1", cfg) == (
        0.0, "predicted SQL failed: the result holds more than 1000000 bytes")


@pytest.fixture
def quick_kill(monkeypatch):
    worker = sql_sandbox.Worker(kill_grace_s=0.3)
    monkeypatch.setattr(sql_sandbox, "WORKER", worker)
    yield
    worker.close()


@pytest.mark.parametrize("pred", [
    # 20 rows of a call that loops 10**8 times: 14 s against this deadline, checked every 1,000 VM steps.
    "WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n LIMIT 20) "
    "SELECT printf('%.*c', 100000000 + k, 'x') FROM n",
    # One quadratic call: minutes.
    "SELECT instr(printf('%.*c', 3000000, 'a'), printf('%.*c', 1500000, 'a') || 'b')",
])
def test_slow_sql_stops_near_its_deadline(db, quick_kill, pred):
    cfg = dr.RewardConfig(sql_timeout_s=0.5)
    start = time.perf_counter()
    score, reason = dr.sql_execution_match(db, pred, "SELECT 1", cfg)
    assert time.perf_counter() - start < 2.0
    assert score == 0.0 and reason.startswith("predicted SQL failed: ")
    assert dr.sql_execution_match(db, "SELECT 1", "SELECT 1", cfg) == (1.0, "")
