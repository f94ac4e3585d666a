"""The Search-R1 / AutoSearch environment: action parsing, batched observations, rewards and metrics."""
from __future__ import annotations

import numpy as np
import pytest

from searchrl.envs.base import Action
from searchrl.envs.search_qa import INVALID_ACTION, SearchQAEnv, autosearch_record
from searchrl.retrieval.types import Hit
from searchrl.rewards import autosearch
from searchrl.rollout.trajectory import Trajectory, Turn


class CountingRetriever:
    def __init__(self):
        self.calls = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [[Hit(f"{q}-{i}", 1.0 / (i + 1), f"T{i}", f"text about {q}") for i in range(k)] for q in queries]


def test_parse_action_takes_the_first_block_and_disables_search_in_the_final_turn():
    env = SearchQAEnv(CountingRetriever())
    assert env.parse_action("<think>x</think><search> capital of France </search>", True) == \
        Action("search", "capital of France")
    assert env.parse_action("<answer> Paris </answer><search>q</search>", True) == Action("answer", "Paris")
    assert env.parse_action("<search>q</search>", False).kind == "invalid"
    assert env.parse_action("I think Paris", True).kind == "invalid"


def test_observe_batches_every_search_into_one_call():
    retriever = CountingRetriever()
    env = SearchQAEnv(retriever, topk=2)
    actions = [Action("search", "a"), Action("invalid", "x"), Action("search", "b")]
    obs = env.observe(actions)
    assert retriever.calls == [["a", "b"]]
    assert obs[0].text == ("\n\n<information>Doc 1(Title: T0) text about a\nDoc 2(Title: T1) text about a"
                           "</information>\n\n")
    assert obs[0].doc_ids == ("a-0", "a-1")
    assert obs[1].text == INVALID_ACTION and obs[1].doc_ids == ()
    assert obs[2].doc_ids == ("b-0", "b-1")


def _trajectory(turns: list[list[Turn]], intermediate: list[list[str]]) -> Trajectory:
    rows = len(turns)
    zeros = np.zeros((rows, 4), np.float32)
    return Trajectory(tokens=zeros.astype(np.int32), attention_mask=zeros > 0, loss_mask=zeros, logprobs=zeros,
                      prompt_lengths=np.zeros(rows, np.int32), lengths=np.zeros(rows, np.int32), turns=turns,
                      finish_reasons=["answer"] * rows, intermediate_answers=intermediate)


SEARCH = "<think>need</think><search>capital of France</search>"
OBS = "\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\n\n"
ANSWER = "<think>found</think><answer>Paris</answer>"


def _rows():
    good = [Turn(0, 1, SEARCH, Action("search", "capital of France"), OBS),
            Turn(1, 2, ANSWER, Action("answer", "Paris"))]
    wrong = [Turn(0, 1, "<answer>Lyon</answer>", Action("answer", "Lyon"))]
    return [good, wrong], [["Paris"], []]


def test_outcome_rewards_sit_on_the_last_turn():
    turns, intermediate = _rows()
    traj = _trajectory(turns, intermediate)
    examples = [{"golden_answers": ["Paris"]}, {"golden_answers": ["Paris"]}]
    em = SearchQAEnv(CountingRetriever(), reward="em").rewards(traj, examples)
    assert em == [[0.0, 1.0], [0.0]]
    # Search-R1's table: correct + valid format 1; wrong answer with an invalid format (no <think>) 0.1.
    r1 = SearchQAEnv(CountingRetriever(), reward="search_r1").rewards(traj, examples)
    assert r1 == [[0.0, 1.0], [0.1]]


def test_autosearch_rewards_follow_the_record():
    turns, intermediate = _rows()
    traj = _trajectory(turns, intermediate)
    examples = [{"golden_answers": ["Paris"]}, {"golden_answers": ["Paris"]}]
    env = SearchQAEnv(CountingRetriever(), reward="autosearch", answer_prompt="\n<answer>")
    rewards = env.rewards(traj, examples)
    expected = autosearch.autosearch_rewards(autosearch_record(turns[0], ["Paris"], ["Paris"])).total
    assert rewards[0] == expected and len(rewards[0]) == 2
    assert rewards[0][1] > 1.0  # the correct final answer's +1 survives
    assert len(rewards[1]) == 1


def test_autosearch_record_maps_invalid_turns_to_failed_steps():
    turns = [Turn(0, 1, "blah", Action("invalid", "no block"), "msg"),
             Turn(1, 2, SEARCH, Action("search", "capital of France"), OBS),
             Turn(2, 3, ANSWER, Action("answer", "Paris"))]
    record = autosearch_record(turns, ["Paris"], ["Paris"])
    assert [s.query for s in record.search_turns] == [None, "capital of France"]
    assert [s.format_ok for s in record.search_turns] == [False, True]
    assert record.intermediate_answers == [None, "Paris"]
    assert record.answer_turn.format_ok


def test_metrics_and_config_errors():
    turns, intermediate = _rows()
    traj = _trajectory(turns, intermediate)
    examples = [{"golden_answers": ["Paris"]}, {"golden_answers": ["Paris"]}]
    metrics = SearchQAEnv(CountingRetriever()).metrics(traj, examples)
    assert metrics["em"] == 0.5 and metrics["searches"] == 0.5 and metrics["format_valid"] == 0.5
    with pytest.raises(ValueError, match="reward 'f2'"):
        SearchQAEnv(CountingRetriever(), reward="f2")
    with pytest.raises(ValueError, match="answer_prompt"):
        SearchQAEnv(CountingRetriever(), reward="autosearch")
