"""Scripted cold-start trajectories: plan searches, the extra verification search, and two-turn prefixes."""
import types

import pytest

from searchrl.tasks.autosearch import scripted

ANSWER_PROMPT = scripted.ANSWER_THOUGHT + "<answer>"


class _EchoEnv:
    """The environment's two calls the script makes: a prompt, and one observation per search."""

    def prompt(self, example):
        return f"Q: {example['question']}\n"

    def observe(self, actions):
        return [types.SimpleNamespace(text=f"<information>{a.content}</information>") for a in actions]


def _example(plan, answer):
    return {"question": "q?", "golden_answers": [answer], "metadata": {"plan": plan, "hop_answers": [answer]}}


def test_trajectories_search_the_plan_then_answer():
    examples = [_example(["a x", "b y"], "c"), _example(["d z"], "e")]
    never, always = (scripted.scripted_trajectories(examples, _EchoEnv(), fraction, seed=0) for fraction in (0, 1))
    assert never[1] == [("Q: q?\n", False), (scripted.search_turn("d z"), True),
                        ("<information>d z</information>", False), (scripted.answer_turn("e"), True)]
    assert [text for text, _ in never[0][1::2]] == [scripted.search_turn("a x"), scripted.search_turn("b y"),
                                                   scripted.answer_turn("c")]
    # The extra search looks up the answer itself, just before answering.
    assert always[1][-3:] == [(scripted.search_turn("e"), True), ("<information>e</information>", False),
                              (scripted.answer_turn("e"), True)]


def test_early_answers_branch_off_before_the_extra_search():
    examples = [_example(["a x", "b y"], "c"), _example(["d z"], "e")]
    never, always = (scripted.scripted_trajectories(examples, _EchoEnv(), f, seed=0) for f in (0, 1))
    assert scripted.early_answers(examples, never, 1.0, 0, ANSWER_PROMPT) == []
    assert scripted.early_answers(examples, always, 0.0, 0, ANSWER_PROMPT) == []
    branches = scripted.early_answers(examples, always, 1.0, 0, ANSWER_PROMPT)
    assert branches == [always[0][:5] + [(ANSWER_PROMPT, False), (" c </answer>", True)],
                        always[1][:3] + [(ANSWER_PROMPT, False), (" e </answer>", True)]]
    # The elicited answer reads exactly like the answer turn the policy writes itself.
    assert "".join(text for text, _ in branches[1][-2:]) == scripted.answer_turn("e")
    many = examples * 200
    some = scripted.early_answers(many, always * 200, 0.3, 0, ANSWER_PROMPT)
    assert 0.25 < len(some) / len(many) < 0.35
    # deterministic for a seed
    assert some == scripted.early_answers(many, always * 200, 0.3, 0, ANSWER_PROMPT)
    with pytest.raises(ValueError, match="does not open the scripted answer turn"):
        scripted.early_answers(examples, always, 1.0, 0, "\n<answer>")


def test_turn_prefixes_cut_after_the_policy_turn():
    long = [("p", False), ("t1", True), ("o1", False), ("t2", True), ("o2", False), ("t3", True)]
    short = [("p", False), ("t1", True)]
    assert scripted.turn_prefixes([long, short], 2) == [long[:4], short]
    assert scripted.turn_prefixes([long], 1) == [long[:2]]
    assert scripted.turn_prefixes([long], 5) == [long]
    with pytest.raises(ValueError, match="policy_turns"):
        scripted.turn_prefixes([long], 0)
