"""DeepRetrieval's query-rewriting env: prompts, answer parsing, rewards against hand-computed values
for every task family, one batched retrieval per batch, and the raw query scored next to the rewrite."""
from __future__ import annotations

import math
import sqlite3

import numpy as np
import pytest
import transformers
from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

from searchrl.episode import Action, Trajectory, Turn
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.types import Hit, QueryRefused, RetrievalError, RetrievalUnavailable
from searchrl.tasks.deepretrieval import env as qr
from searchrl.tasks.deepretrieval import rewards as dr
from searchrl.tasks.deepretrieval.engines import PubMed, SearchEngine
from searchrl.tasks.deepretrieval.env import prompts
from searchrl.text import chat
from tests.fakes.engines import FakeEngineServer


class CountingRetriever:
    """Fixed ranked hits per query; counts the calls and remembers what was asked."""

    def __init__(self, results: dict[str, list[Hit]]):
        self.results, self.calls = results, []

    def search(self, queries, k):
        self.calls.append((list(queries), k))
        return [self.results.get(q, [])[:k] for q in queries]


def trajectory(responses: list[str]) -> Trajectory:
    """A finished batch of one-turn rows holding `responses` (only the text matters to the env)."""
    b = len(responses)
    turns = [[Turn(0, 1, r, Action(qr.REWRITE, ""))] for r in responses]
    return Trajectory(tokens=np.zeros((b, 2), np.int32), attention_mask=np.ones((b, 2), bool),
                      loss_mask=np.ones((b, 2), np.float32), logprobs=np.zeros((b, 2), np.float32),
                      prompt_lengths=np.ones(b, np.int32), lengths=np.full(b, 2, np.int32), turns=turns,
                      finish_reasons=["done"] * b)


def answer(env: qr.QueryRewriteEnv, value: str, reasoning: str = "I rewrite.") -> str:
    return env.target_response(value, reasoning)


def test_paper_prompts_keep_the_public_texts():
    env = qr.QueryRewriteEnv(qr.Config(task="evidence"), CountingRetriever({}))
    text = env.prompt({"question": "who wrote hamlet"})
    assert text.startswith("You are a helpful assistant. You first thinks about the reasoning process")
    assert ("Here's the user query:\nwho wrote hamlet\n"
            "Assistant: Let me rewrite the query with reasoning. \n<think>\n") in text
    assert text.endswith("<think>\n")
    sql = qr.QueryRewriteEnv(qr.Config(task="sql", reasoning=False), None)
    bird = sql.prompt({"question": "How many?", "schema": "CREATE TABLE t (x INT)",
                       "knowledge": "x is a count"})
    assert ("Database Schema:\nCREATE TABLE t (x INT)\nExternal Knowledge: x is a count\n"
            "Note: Using valid SQLite") in bird
    spider = sql.prompt({"question": "How many?", "schema": "CREATE TABLE t (x INT)", "knowledge": ""})
    assert "External Knowledge:" not in spider.split("Note:")[0]
    assert spider.endswith("How many?\nAssistant: Let me write the SQL query. \n<answer>\n")


def qwen_like_tokenizer() -> transformers.PreTrainedTokenizerFast:
    tok = Tokenizer(tok_models.WordLevel({"<unk>": 0, "<|im_end|>": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                               unk_token="<unk>")
    out.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return out


def test_chat_template_renders_system_user_and_continues_the_assistant_prefix():
    env = qr.QueryRewriteEnv(qr.Config(task="classic", chat_template=True), CountingRetriever({}))
    rendered = chat.render(qwen_like_tokenizer(), env.prompt({"question": "q?"}))
    template = prompts.PROMPTS["classic", True]
    user = prompts.user_message(template.user, {"question": "q?"})
    assert rendered == (f"<|im_start|>system\n{template.system}<|im_end|>\n"
                        f"<|im_start|>user\n{user}<|im_end|>\n"
                        f"<|im_start|>assistant\n{template.assistant}")
    assert rendered.endswith("Let me think step by step. \n<think>\n")  # the trailing newline is kept
    with pytest.raises(ValueError, match="no chat template"):
        chat.render(transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(tok_models.BPE())),
                    env.prompt({"question": "q?"}))


@pytest.mark.parametrize("task", qr.TASKS)
@pytest.mark.parametrize("reasoning", [True, False])
def test_target_responses_parse_back_under_every_paper_prompt(task, reasoning):
    env = qr.QueryRewriteEnv(qr.Config(task=task, reasoning=reasoning), None if task == "sql" else
                             CountingRetriever({}))
    value = 'SELECT "a" FROM t' if task == "sql" else '(heart OR cardiac) AND "attack"'
    response = env.target_response(value, "the user means a myocardial infarction")
    parsed = env.parse(response)
    assert parsed == dr.ParsedAnswer(value, True, "")
    assert env.parse_action(response, 0) == Action(qr.REWRITE, value, done=True)
    assert env.parse_action("no answer at all", 0).kind == qr.INVALID


def test_evidence_rewards_follow_the_answer_rank_tiers():
    passages = [Hit("a", 3.0, "Paris", "capital of France"),
                Hit("b", 2.0, "Hamlet", "written by Shakespeare")]
    retriever = CountingRetriever({"hamlet author": passages, "who wrote hamlet": passages[:1]})
    env = qr.QueryRewriteEnv(qr.Config(task="evidence"), retriever)
    examples = [{"id": str(i), "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}
                for i in range(4)]
    responses = [answer(env, "hamlet author"), "<answer>{}</answer>",
                 env.target_response("hamlet author").replace("{", "{{"), answer(env, "paris")]
    batch = trajectory(responses)
    rewards = env.rewards(batch, examples)
    # rank 2 -> tier 5 (rank <= 5) + format 1; bad tags -> -4; bad JSON -> 1 - 4; no passage -> 1 - 3.5
    assert rewards == [[6.0], [-4.0], [-3.0], [-2.5]]
    assert retriever.calls == [(["hamlet author", "paris"], 3000)]  # one batched call, deduplicated
    rows = env.metrics(batch, examples)
    assert len(retriever.calls) == 2 and retriever.calls[1] == (["who wrote hamlet"], 3000)  # the raw query
    assert [r["hit@1"] for r in rows] == [0.0, 0.0, 0.0, 0.0]
    assert [r["hit@5"] for r in rows] == [1.0, 0.0, 0.0, 0.0]
    assert rows[0]["raw_hit@20"] == 0.0 and rows[0]["reward"] == 6.0 and rows[0]["query"] == "hamlet author"
    assert rows[0]["query_words"] == 2 and rows[0]["reasoning_words"] == 2 and rows[1]["format_valid"] == 0.0
    env.metrics(batch, examples)
    assert len(retriever.calls) == 2  # the batch's results and the raw metrics are reused


def test_classic_rewards_are_gated_ndcg():
    ranked = [Hit("b", 3.0), Hit("x", 2.0), Hit("a", 1.0)]
    env = qr.QueryRewriteEnv(qr.Config(task="classic"),
                             CountingRetriever({"good": ranked, "bad": [Hit("x", 1)]}))
    examples = [{"id": str(i), "question": "q", "qrels": {"a": 2, "b": 1}} for i in range(3)]
    rewards = env.rewards(trajectory([answer(env, "good"), answer(env, "bad"), "nothing"]), examples)
    ideal = 2 + 1 / math.log2(3)
    ndcg = (1 + 2 / math.log2(4)) / ideal
    assert rewards[0][0] == pytest.approx(0.1 + ndcg, abs=1e-12)
    assert rewards[1:] == [[0.0], [-2.0]]  # well formed but nothing relevant; malformed
    row = env.metrics(trajectory([answer(env, "good")]), examples[:1])[0]
    assert row["ndcg@10"] == pytest.approx(ndcg, abs=1e-12)
    assert row["recall@10"] == 1.0 and row["raw_recall@10"] == 0.0


def test_literature_rewards_are_recall_tiers_and_respect_the_date_cut_off():
    retriever = CountingRetriever({"statins": [Hit("p1", 1), Hit("p2", 0.5), Hit("zz", 0.3)]})
    env = qr.QueryRewriteEnv(qr.Config(task="literature"), retriever)
    example = {"id": "r", "question": "P: adults", "qrels": {f"p{i}": 1 for i in range(1, 5)}, "max_date": ""}
    assert env.rewards(trajectory([answer(env, "statins")]), [example]) == [[5.0]]  # recall 0.5 -> 4, + 1
    dated = {**example, "max_date": "2019/05/01"}
    with pytest.raises(ValueError, match=r"max_date '2019/05/01', but the retriever \(CountingRetriever\) "
                                         "cannot filter by publication date"):
        env.rewards(trajectory([answer(env, "statins")]), [dated])


def test_the_literature_date_cut_off_is_request_parameters_not_query_text():
    """A quote in the rewrite once closed the date term glued onto it; the dates are now ESearch's own
    mindate / maxdate, and the query is sent as written."""
    with FakeEngineServer({"11": "aspirin trial", "12": "aspirin"}) as fake:
        defaults = RetrievalConfig()
        engine = SearchEngine(PubMed(), url=fake.url, rate_per_s=1e9, timeout_s=defaults.timeout_s,
                              retries=defaults.retries)
        env = qr.QueryRewriteEnv(qr.Config(task="literature", compare_raw=False), engine)
        example = {"id": "r", "question": "P: adults", "qrels": {"11": 1}, "max_date": "2019/05/01"}
        rows = env.results([answer(env, 'aspirin"'), answer(env, "aspirin")],
                           [example, {**example, "max_date": ""}])
        params = sorted((r.params["term"], r.params.get("mindate"), r.params.get("maxdate"),
                         r.params.get("datetype")) for r in fake.requests)
    assert params == [("aspirin", None, None, None), ('aspirin"', "1970/01/01", "2019/05/01", "pdat")]
    assert [row.metrics["recall@3000"] for row in rows] == [1.0, 1.0]


class TokenizingRetriever(CountingRetriever):
    """Fails the whole call on a lone surrogate, as a tokenizer does (not a RetrievalError)."""

    def search(self, queries, k):
        if any(not q.isascii() for q in queries):
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, ...]]")
        return super().search(queries, k)


def test_unencodable_blank_and_overlong_rewrites_are_failed_searches_never_errors():
    env = qr.QueryRewriteEnv(qr.Config(task="classic", max_query_chars=20),
                             TokenizingRetriever({"good": [Hit("a", 1.0)]}))
    examples = [{"id": str(i), "question": "q", "qrels": {"a": 1}} for i in range(3)]
    responses = [answer(env, "good"), answer(env, "aspirin \ud800"), answer(env, "x" * 21)]
    assert '{"query": "aspirin \\ud800"}' in responses[1]  # a JSON escape that decodes to a lone surrogate
    assert env.rewards(trajectory(responses), examples) == [[pytest.approx(1.1)], [0.0], [0.0]]
    assert env.retriever.calls == [(["good"], 3000)]
    with FakeEngineServer({"11": "aspirin"}) as fake:
        literature = qr.QueryRewriteEnv(qr.Config(task="literature", compare_raw=False),
                                        SearchEngine(PubMed(), url=fake.url, rate_per_s=1e9,
                                                     timeout_s=RetrievalConfig().timeout_s,
                                                     retries=RetrievalConfig().retries))
        example = {"id": "r", "question": "P: adults", "qrels": {"11": 1}, "max_date": "2019/05/01"}
        rows = literature.results([answer(literature, "aspirin \ud800")], [example])
        assert fake.request_count == 0
    assert rows[0].metrics == {"recall@3000": 0.0}


@pytest.fixture
def database(tmp_path):
    path = tmp_path / "shop.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE item (name TEXT, price INT)")
    conn.executemany("INSERT INTO item VALUES (?, ?)", [("pen", 2), ("book", 12), ("lamp", 30)])
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("executes_score", [0.0, 0.3])
def test_sql_rewards_are_execution_match(database, executes_score):
    env = qr.QueryRewriteEnv(qr.Config(task="sql", reward=dr.RewardConfig(sql_executes_score=executes_score)),
                             None)
    example = {"id": "0", "question": "expensive items", "db_path": str(database),
               "gold_sql": "SELECT name FROM item WHERE price > 10"}
    responses = [answer(env, "SELECT name FROM item WHERE price >= 12"), answer(env, "SELECT name FROM item"),
                 answer(env, "SELECT nope FROM item"), answer(env, "DELETE FROM item")]
    rewards = env.rewards(trajectory(responses), [example] * 4)
    wrong_rows = 0.1 + executes_score if executes_score else 0.0
    assert rewards == [[1.1], [pytest.approx(wrong_rows)], [0.0], [0.0]]
    rows = env.metrics(trajectory(responses), [example] * 4)
    assert [r["execution_accuracy"] for r in rows] == [1.0, 0.0, 0.0, 0.0]
    assert "raw_execution_accuracy" not in rows[0]
    with sqlite3.connect(database) as conn:  # the DELETE was refused
        assert conn.execute("SELECT COUNT(*) FROM item").fetchone() == (3,)


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match="config.env.task 'web'"):
        qr.QueryRewriteEnv(qr.Config(task="web"), CountingRetriever({}))
    with pytest.raises(ValueError, match="needs a retriever"):
        qr.QueryRewriteEnv(qr.Config(task="classic"), None)
    with pytest.raises(RuntimeError, match="one turn long"):
        qr.QueryRewriteEnv(qr.Config(), CountingRetriever({})).observe([])


class RefusingRetriever(CountingRetriever):
    """Refuses any batch holding a query with "((" (as a search engine refuses a query it cannot parse), or
    fails every search with `failure`."""

    def __init__(self, results, failure=None):
        super().__init__(results)
        self.failure = failure

    def search(self, queries, k):
        if self.failure is not None:
            raise self.failure
        if any("((" in q for q in queries):
            raise QueryRefused("cannot parse the query")
        return super().search(queries, k)


def test_a_refused_query_retrieves_nothing_and_a_down_retriever_stops_the_run():
    env = qr.QueryRewriteEnv(qr.Config(task="classic"), RefusingRetriever({"good": [Hit("a", 1.0)]}))
    examples = [{"id": str(i), "question": "q", "qrels": {"a": 1}} for i in range(2)]
    rewards = env.rewards(trajectory([answer(env, "good"), answer(env, "((bad")]), examples)
    assert rewards == [[pytest.approx(1.1)], [0.0]]  # NDCG 1 + format 0.1; nothing retrieved
    every = env.rewards(trajectory([answer(env, "((bad"), answer(env, "((worse"), answer(env, "((bad")]),
                        examples[:1] * 3)
    assert every == [[0.0]] * 3  # every distinct rewrite refused for its text: the policy's doing
    for failure in (RetrievalUnavailable("the engine is down"),
                    RetrievalError("HTTP 413: the response exceeds 67108864 bytes")):  # issue 67 cause 5
        failing = qr.QueryRewriteEnv(qr.Config(task="classic"), RefusingRetriever({}, failure))
        with pytest.raises(type(failure), match=str(failure)):  # never a reward of 0
            failing.rewards(trajectory([answer(failing, "good")]), examples[:1])
