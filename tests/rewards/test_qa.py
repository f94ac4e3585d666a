"""QA metrics on hand-computed cases."""
import time

import pytest

from searchrl.text import qa


@pytest.mark.parametrize("text, expected", [
    ("The  Quick, brown FOX!", "quick brown fox"),
    ("An apple a day", "apple day"),
    ("theater", "theater"),  # articles only on word boundaries
    ("U.S.A.", "usa"),
    ("  \n ", ""),
])
def test_normalize_answer(text, expected):
    assert qa.normalize_answer(text) == expected


def test_exact_match():
    assert qa.exact_match("the Beijing.", "beijing") == 1.0
    assert qa.exact_match("Paris", ["London", "paris"]) == 1.0
    assert qa.exact_match("Paris city", "Paris") == 0.0
    assert qa.exact_match("Paris", []) == 0.0


def test_cover_em():
    assert qa.cover_em("It is Paris, France.", "paris") == 1.0
    assert qa.cover_em("Parisian food", "Paris") == 1.0  # plain substring, as FlashRAG's acc
    assert qa.cover_em("London", ["Paris", "Rome"]) == 0.0
    assert qa.cover_em("anything", ["the", "a"]) == 0.0  # golds that normalise to "" never cover


def test_has_answer_uses_word_boundaries():
    assert not qa.has_answer("The party was fun.", "art")
    assert qa.has_answer("A modern art museum.", "Art")
    assert qa.has_answer("born in New York City", ["Boston", "new york"])


def test_f1_partial_overlap():
    # pred "cat sat on mat" (4 tokens), gold "cat on mat" (3): common 3, P = 3/4, R = 1,
    # F1 = 2 * 0.75 * 1 / 1.75 = 6/7.
    assert qa.f1("The cat sat on the mat", "cat on mat") == pytest.approx(6 / 7, abs=1e-12)


def test_f1_best_over_golds():
    # vs "york": P = 1/3, R = 1, F1 = 0.5; vs "new york city council": P = 1, R = 3/4, F1 = 6/7.
    assert qa.f1("new york city", ["york", "new york city council"]) == pytest.approx(6 / 7, abs=1e-12)


def test_f1_counts_repeated_tokens_once_per_match():
    # pred {x: 2, y: 1}, gold {x: 1, y: 2}: common 2, P = R = 2/3, F1 = 2/3.
    assert qa.f1("x x y", "x y y") == pytest.approx(2 / 3, abs=1e-12)


def test_f1_yes_no_rule():
    assert qa.f1("yes", "Yes.") == 1.0
    assert qa.f1("yes", "yes sir") == 0.0  # special prediction must match exactly
    # "no way" vs "no" would be P = 1/2, R = 1, F1 = 2/3 without the rule; the gold is special -> 0.
    assert qa.f1("no way", "no") == 0.0
    assert qa.f1("noanswer", "no answer") == 0.0


def test_f1_empty_and_bad_golds():
    assert qa.f1("", "x") == 0.0
    assert qa.f1("x", []) == 0.0
    with pytest.raises(TypeError, match="strings"):
        qa.f1("x", [1])


MB = 1_000_000


@pytest.mark.parametrize("metric", [qa.exact_match, qa.cover_em, qa.has_answer, qa.f1])
@pytest.mark.parametrize("text", ["a " * (MB // 2), "the " * (MB // 4), "a" * MB, "!" * MB,
                                  "ab " * (MB // 3)])
def test_metrics_take_linear_time(metric, text):
    start = time.perf_counter()
    metric(text, ["a b", text[:100]])
    assert time.perf_counter() - start < 1.0
