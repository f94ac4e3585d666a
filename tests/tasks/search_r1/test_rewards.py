"""Search-R1 rewards: every row of the qa_em_format.py table."""
import time

import pytest

from searchrl.tasks.search_r1 import rewards as search_r1

GOLDS = ["Paris", "City of Paris"]
HIT = "<information>Doc 1(Title: Paris) Paris is the capital of France.</information>"
MISS = "<information>Doc 1(Title: Lyon) Lyon is a city.</information>"
# qa_em_format.py compute_score_em's own defaults (the v0.3 script sets retrieval_score=0: RewardConfig's).
TABLE = search_r1.RewardConfig(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)


def _valid(answer: str, info: str = MISS) -> str:
    return f"<think>a</think><search>q</search>{info}<think>b</think><answer>{answer}</answer>"


def _invalid(answer: str, info: str = MISS) -> str:
    # Text between tags breaks the grammar but keeps the answer extractable.
    return f"<think>a</think> oops <search>q</search>{info}<think>b</think><answer>{answer}</answer>"


@pytest.mark.parametrize("response, expected", [
    (_valid("paris"), 1.0),                 # correct, valid format
    (_invalid("paris"), 0.8),               # correct, invalid format: 1 - 0.2
    (_valid("Lyon", info=HIT), 0.3),        # wrong, valid, gold in retrieved info: 0.2 + 0.1
    (_valid("Lyon"), 0.2),                  # wrong, valid: structure_format_score
    (_invalid("Lyon", info=HIT), 0.1),      # wrong, invalid: final_format_score (no retrieval bonus)
    (_invalid("Lyon"), 0.1),
    ("<think>a</think> I give up", 0.0),    # no answer, invalid format
])
def test_format_aware_table(response, expected):
    assert search_r1.search_r1_reward(response, GOLDS, TABLE) == pytest.approx(expected, abs=1e-12)
    # A valid response always ends in an answer, so "no answer, valid format" cannot happen.


def test_prompt_example_is_not_an_answer():
    prompt = "<|im_start|>user\nFor example, <answer> Paris </answer>.<|im_end|>\n<|im_start|>assistant\n"
    assert search_r1.search_r1_reward(prompt + "<think>a</think> I give up", GOLDS, TABLE) == 0.0
    assert search_r1.search_r1_em_reward(prompt + "<think>a</think>", GOLDS) == 0.0
    assert search_r1.search_r1_reward(prompt + _valid("Paris"), GOLDS, TABLE) == 1.0


def test_custom_coefficients():
    config = search_r1.RewardConfig(structure_format_score=0.3, final_format_score=0.05, retrieval_score=0.2)
    assert search_r1.search_r1_reward(_invalid("paris"), GOLDS, config, score=2.0) == pytest.approx(1.7)
    assert search_r1.search_r1_reward(_valid("Lyon", info=HIT), GOLDS, config, score=2.0) == pytest.approx(0.5)
    assert search_r1.search_r1_reward(_invalid("Lyon"), GOLDS, config, score=2.0) == pytest.approx(0.05)


def test_em_reward():
    assert search_r1.search_r1_em_reward(_invalid("the city of Paris"), GOLDS) == 1.0
    assert search_r1.search_r1_em_reward(_valid("Lyon"), GOLDS) == 0.0
    assert search_r1.search_r1_em_reward(_valid("Lyon"), GOLDS, format_score=0.1) == 0.1
    assert search_r1.search_r1_em_reward("<think>a</think>", GOLDS, format_score=0.1) == 0.0


def test_retrieval_hit():
    assert search_r1.retrieval_hit(_valid("x", info=HIT), GOLDS)
    assert not search_r1.retrieval_hit(_valid("x"), GOLDS)


MB = 1_000_000


@pytest.mark.parametrize("response", [
    " " * (40_000) + "x",  # 21 s when end tokens were stripped with a searching pattern
    " " * MB + "x",
    "<|endoftext|>" * (MB // 13) + "x",
    "<information>" * (MB // 13),
    _valid("x" * MB, HIT * 1000),
    "<answer>" * (MB // 8) + "</answer>",
])
def test_rewards_take_linear_time(response):
    start = time.perf_counter()
    search_r1.search_r1_reward(response, GOLDS, TABLE)
    search_r1.search_r1_em_reward(response, GOLDS)
    assert time.perf_counter() - start < 1.0
