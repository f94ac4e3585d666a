"""The step-penalty baseline of the AutoSearch reward (`RewardConfig.search_step_penalty`) on hand-worked
trajectories: a fixed cost on every search turn, whatever the depth and the answer."""
import dataclasses

import pytest

from searchrl.tasks.autosearch import rewards as au

GOLDS = ["Paris"]
STEP_PENALTY = dict(au.EFFICIENCY_OFF, search_step_penalty=0.25)


def search(query, ok=True):
    return au.SearchTurn(text=f"<think>t</think><search>{query}</search>", query=query, format_ok=ok)


def answer(text):
    return au.AnswerTurn(text=f"<think>t</think><answer>{text}</answer>", format_ok=True)


def _rewards(searches, final, intermediate, **overrides):
    cfg = dataclasses.replace(au.RewardConfig(), **overrides)
    out = au.autosearch_rewards(au.AutoSearchRecord(searches, final, intermediate, GOLDS), cfg)
    for t, total in enumerate(out.total):
        assert total == pytest.approx(out.base[t] + out.quality[t] + out.efficiency[t], abs=1e-12)
    return out


def test_every_search_pays_the_same_cost_needed_or_not():
    # d = 2: search 3 is unneeded, yet it costs what the needed searches 1 and 2 cost; the answer turn pays
    # nothing. base [0.025] * 3 + [0.1 + 1]; quality F1 0 -> 1 -> 1.
    searches = [search("eiffel tower location"), search("paris population"), search("louvre museum")]
    out = _rewards(searches, answer("Paris"), ["Lyon", "Paris", "Paris"], **STEP_PENALTY)
    assert out.efficiency == pytest.approx([-0.25, -0.25, -0.25, 0.0])
    assert out.total == pytest.approx([0.025 - 0.25, 0.025 + 1.0 - 0.25, 0.025 - 0.25, 1.1])


def test_invalid_and_wrong_searches_pay_it_too():
    # a malformed search and a wrong final answer: the cost is per search turn, not per valid one.
    out = _rewards([search("good query", ok=False), search("other query")], answer("Rome"), [None, "Rome"],
                   **STEP_PENALTY)
    assert out.efficiency == pytest.approx([-0.25, -0.25, 0.0])
    assert out.total == pytest.approx([-0.025 - 0.25, 0.025 - 0.25, 0.1])


def test_no_search_pays_nothing():
    assert _rewards([], answer("Paris"), [], **STEP_PENALTY).total == pytest.approx([1.1])


def test_missing_answer_turn_folds_onto_last_turn():
    # slots: base [0.025, 0.025, -0.5], quality [0, 1, 0], efficiency [-0.25, -0.25, 0] -> two turns.
    out = _rewards([search("first query"), search("second query")], None, [None, "Paris"], **STEP_PENALTY)
    assert out.total == pytest.approx([0.025 - 0.25, 0.025 - 0.5 + 1.0 - 0.25])


def test_adds_to_the_depth_terms_when_they_are_on():
    # test_autosearch.py's early stop: efficiency [0.075, 0.075, -0.05, -0.05] before the cost of 0.1.
    searches = [search("eiffel tower location"), search("paris population"), search("louvre museum")]
    out = _rewards(searches, answer("Paris"), ["Lyon", "Paris", "Paris"], search_step_penalty=0.1)
    assert out.efficiency == pytest.approx([-0.025, -0.025, -0.15, -0.05])


def test_efficiency_off_zeroes_every_depth_term():
    searches = [search("eiffel tower location"), search("paris population"), search("louvre museum")]
    out = _rewards(searches, answer("Paris"), ["Lyon", "Paris", "Paris"], **au.EFFICIENCY_OFF)
    assert out.efficiency == [0.0, 0.0, 0.0, 0.0]


def test_public_code_refuses_it():
    with pytest.raises(ValueError, match="search_step_penalty=0.25.*public_code"):
        au.RewardConfig(public_code=True, search_step_penalty=0.25)
