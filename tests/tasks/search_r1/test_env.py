"""The Search-R1 env: action parsing, batched observations, retrieval failures, rewards and metrics."""
from __future__ import annotations

import re

import numpy as np
import pytest

from searchrl.episode import Action, Trajectory, Turn
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.remote import RemoteRetriever
from searchrl.retrieval.types import Hit, QueryRefused, RetrievalError, RetrievalUnavailable
from searchrl.serving.server import Limits, RetrievalServer
from searchrl.tasks.search_r1 import env as search_env
from searchrl.tasks.search_r1.env import INVALID_ACTION, Config, SearchEnv


class CountingRetriever:
    def __init__(self):
        self.calls = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [[Hit(f"{q}-{i}", 1.0 / (i + 1), f"T{i}", f"text about {q}") for i in range(k)] for q in queries]


def test_parse_action_takes_the_first_block_and_disables_search_in_the_final_turn():
    env = SearchEnv(CountingRetriever(), Config(max_turns=2))
    assert env.parse_action("<think>x</think><search> capital of France </search>", 1) == \
        Action("search", "capital of France")
    assert env.parse_action("<answer> Paris </answer><search>q</search>", 0) == \
        Action("answer", "Paris", done=True)
    assert env.parse_action("<search>q</search>", 2) == \
        Action("invalid", "search is disabled in the final turn", done=True)
    assert env.parse_action("I think Paris", 1) == Action("invalid", "no <search> or <answer> block")
    assert env.parse_action("I think Paris", 2).done


def test_observe_batches_every_search_into_one_call():
    retriever = CountingRetriever()
    env = SearchEnv(retriever, Config(topk=2))
    actions = [Action("search", "a"), Action("invalid", "x"), Action("search", "b")]
    obs = env.observe(actions)
    assert retriever.calls == [["a", "b"]]
    assert obs[0].text == ("\n\n<information>Doc 1(Title: T0) text about a\nDoc 2(Title: T1) text about a"
                           "</information>\n\n")
    assert obs[0].info == {"doc_ids": ("a-0", "a-1"), "error": None}
    assert obs[1].text == INVALID_ACTION and obs[1].info == {}
    assert obs[2].info == {"doc_ids": ("b-0", "b-1"), "error": None}


def information(text):
    return f"\n\n<information>{text}</information>\n\n"


def test_empty_blank_and_overlong_queries_are_answered_without_searching():
    retriever = CountingRetriever()
    env = SearchEnv(retriever, Config(topk=1, max_query_chars=10))
    obs = env.observe([Action("search", ""), Action("search", " \n\t"), Action("search", "x" * 11),
                       Action("search", "ok"), Action("invalid", "x"), Action("search", "a \ud800")])
    assert retriever.calls == [["ok"]]
    assert obs[5].info["error"] == "The search query is not valid text (character 3 is a lone surrogate)."
    empty = "The search query is empty."
    long = "The search query has 11 characters, more than 10: use a shorter one."
    assert [o.text for o in obs[:3]] == [information(empty), information(empty), information(long)]
    assert [o.info for o in obs[:3]] == [{"doc_ids": (), "error": empty}, {"doc_ids": (), "error": empty},
                                         {"doc_ids": (), "error": long}]
    assert obs[3].info == {"doc_ids": ("ok-0",), "error": None} and obs[4].text == INVALID_ACTION
    assert SearchEnv(retriever).observe([Action("search", " ")])[0].text == information(empty)
    assert retriever.calls == [["ok"]]


class FailingRetriever(CountingRetriever):
    """Raises `error` for any batch holding a query that starts with "bad"; `error` None: raises for all."""

    def __init__(self, error=QueryRefused("HTTP 400: rejected")):
        super().__init__()
        self.error = error

    def search(self, queries, k):
        hits = super().search(queries, k)
        if any(q.startswith("bad") for q in queries):
            raise self.error
        return hits


def test_a_failing_query_is_retried_alone_and_told_why():
    retriever = FailingRetriever()
    obs = SearchEnv(retriever, Config(topk=1)).observe(
        [Action("search", "a"), Action("search", "bad one"), Action("invalid", "x"), Action("search", "b")])
    assert retriever.calls == [["a", "bad one", "b"], ["a"], ["bad one"], ["b"]]
    assert obs[0].info == {"doc_ids": ("a-0",), "error": None} and obs[3].info == {"doc_ids": ("b-0",),
                                                                                  "error": None}
    failed = "The search failed: HTTP 400: rejected"
    assert obs[1].text == information(failed) and obs[1].info == {"doc_ids": (), "error": failed}


@pytest.mark.parametrize("error, queries, calls", [
    (RetrievalUnavailable("down"), ["a", "bad"], [["a", "bad"]]),  # no query-by-query hammering
    (RetrievalError("HTTP 404"), ["bad1", "bad2"], [["bad1", "bad2"]]),  # not the queries' doing
    (RetrievalError("HTTP 413: the response exceeds 67108864 bytes"), ["bad"], [["bad"]]),
    (RuntimeError("a bug"), ["a", "bad"], [["a", "bad"]]),  # not a retrieval error: not caught
])
def test_a_retriever_that_is_down_stops_the_run(error, queries, calls):
    retriever = FailingRetriever(error)
    with pytest.raises(type(error), match=str(error)):
        SearchEnv(retriever).observe([Action("search", q) for q in queries])
    assert retriever.calls == calls


def test_queries_all_refused_for_their_text_are_each_told_why():
    retriever = FailingRetriever()
    obs = SearchEnv(retriever).observe([Action("search", "bad1"), Action("search", "bad2")])
    assert [o.info["error"] for o in obs] == ["The search failed: HTTP 400: rejected"] * 2
    assert retriever.calls == [["bad1", "bad2"], ["bad1"], ["bad2"]]


def test_remote_retrieval_failures_become_observations():
    """The issue's case: a bad <search> against a remote server used to raise out of observe."""
    local = SearchEnv(CountingRetriever(), Config(topk=1))
    limits = Limits(max_query_chars=20)
    with RetrievalServer(CountingRetriever(), "127.0.0.1", 0, limits=limits).start() as server:
        remote = SearchEnv(RemoteRetriever(RetrievalConfig(url=server.url, retries=0)), Config(topk=1))
        actions = [Action("search", ""), Action("search", "q" * 21), Action("search", "fine")]
        obs = remote.observe(actions)
    assert obs[0] == local.observe(actions[:1])[0]  # the same for every retriever
    assert obs[1].info["doc_ids"] == () and re.fullmatch(
        r'The search failed: http://\S+/retrieve: HTTP 400: "queries"\[0\] has 21 characters, more than 20',
        obs[1].info["error"])
    assert obs[2] == local.observe(actions[2:])[0]


def _trajectory(turns: list[list[Turn]], side_branch: str | None = None) -> Trajectory:
    rows = len(turns)
    zeros = np.zeros((rows, 4), np.float32)
    return Trajectory(tokens=zeros.astype(np.int32), attention_mask=zeros > 0, loss_mask=zeros, logprobs=zeros,
                      prompt_lengths=np.zeros(rows, np.int32), lengths=np.zeros(rows, np.int32), turns=turns,
                      finish_reasons=["done"] * rows, side_branch=side_branch)


SEARCH = "<think>need</think><search>capital of France</search>"
OBS = "\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\n\n"
ANSWER = "<think>found</think><answer>Paris</answer>"


def _rows():
    good = [Turn(0, 1, SEARCH, Action("search", "capital of France"), OBS),
            Turn(1, 2, ANSWER, Action("answer", "Paris", done=True))]
    wrong = [Turn(0, 1, "<answer>Lyon</answer>", Action("answer", "Lyon", done=True))]
    return [good, wrong]


EXAMPLES = [{"question": "Capital of France?", "golden_answers": ["Paris"]},
            {"question": "Capital of France?", "golden_answers": ["Paris"]}]


def test_outcome_rewards_sit_on_the_last_turn():
    traj = _trajectory(_rows())
    em = SearchEnv(CountingRetriever(), Config(reward="em")).rewards(traj, EXAMPLES)
    assert em == [[0.0, 1.0], [0.0]]
    # Search-R1's table: correct + valid format 1; wrong answer with an invalid format (no <think>) 0.1.
    r1 = SearchEnv(CountingRetriever(), Config(reward="search_r1")).rewards(traj, EXAMPLES)
    assert r1 == [[0.0, 1.0], [0.1]]


def test_search_r1_reward_scores_come_from_the_config():
    # A valid response with a wrong answer whose retrieved passage holds the gold: Search-R1's v0.3 script
    # sets reward_model.retrieval_score=0 (0.2 for the structure); a retrieval score of 0.1 makes it 0.3.
    hit = [[Turn(0, 1, SEARCH, Action("search", "capital of France"), OBS),
            Turn(1, 2, "<think>found</think><answer>Lyon</answer>", Action("answer", "Lyon", done=True))]]
    example = EXAMPLES[:1]
    assert SearchEnv(CountingRetriever()).rewards(_trajectory(hit), example) == [[0.0, 0.2]]
    scores = search_env.rewards.RewardConfig(retrieval_score=0.1)
    env = SearchEnv(CountingRetriever(), Config(search_r1=scores))
    assert env.rewards(_trajectory(hit), example)[0] == [0.0, pytest.approx(0.3)]


def test_metrics_per_row_and_config_errors():
    rows = SearchEnv(CountingRetriever()).metrics(_trajectory(_rows()), EXAMPLES)
    assert [(r["answer"], r["em"], r["searches"], r["format_valid"]) for r in rows] == [
        ("Paris", 1.0, 1, 1.0), ("Lyon", 0.0, 0, 0.0)]
    assert "depth" not in rows[0]
    with pytest.raises(ValueError, match="reward='f2' is not a known search reward"):
        SearchEnv(CountingRetriever(), Config(reward="f2"))


def test_no_side_branch():
    assert SearchEnv(CountingRetriever()).side_branch is None
