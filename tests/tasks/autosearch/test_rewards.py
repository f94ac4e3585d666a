"""AutoSearch turn rewards on hand-worked trajectories."""
import dataclasses
import math
import statistics

import numpy as np
import pytest

from searchrl.benchmarks import interleave
from searchrl.tasks.autosearch import rewards as au

GOLDS = ["Paris"]


def search(query, ok=True):
    return au.SearchTurn(text=f"<think>t</think><search>{query}</search>", query=query, format_ok=ok)


def answer(text, ok=True):
    return au.AnswerTurn(text=f"<think>t</think><answer>{text}</answer>", format_ok=ok)


def _rewards(searches, final, intermediate, golds=GOLDS, **overrides):
    cfg = dataclasses.replace(au.RewardConfig(), **overrides)
    out = au.autosearch_rewards(au.AutoSearchRecord(searches, final, intermediate, golds), cfg)
    for t, total in enumerate(out.total):  # the components always add up to the total
        assert total == pytest.approx(out.base[t] + out.quality[t] + out.efficiency[t], abs=1e-12)
    return out


def test_tfidf_cosine_hand_computed():
    # n = 2 docs; "apple" df 2 -> idf ln(3/3) + 1 = 1; "banana", "cherry" df 1 -> idf ln(3/2) + 1.
    # doc0 = [1, w, 0], doc1 = [1, 0, w] with w = ln 1.5 + 1: cosine = 1 / (1 + w^2) = 0.33610.
    v = au.tfidf_vectors(["apple banana", "Apple cherry"])
    w = math.log(1.5) + 1
    assert float(v[0] @ v[1]) == pytest.approx(1 / (1 + w * w), abs=1e-12)
    assert np.linalg.norm(v, axis=1) == pytest.approx([1.0, 1.0], abs=1e-12)


def test_tfidf_matches_scikit_learn():
    sklearn_text = pytest.importorskip("sklearn.feature_extraction.text")
    docs = ["who wrote the play hamlet", "hamlet author", "play play written by shakespeare", "a b c hamlet"]
    expected = sklearn_text.TfidfVectorizer().fit_transform(docs).toarray()
    np.testing.assert_allclose(au.tfidf_vectors(docs), expected, rtol=0, atol=1e-12)


def test_is_redundant():
    assert au.is_redundant("Who wrote Hamlet?", ["who wrote hamlet"], 0.8)  # cosine 1
    assert au.is_redundant("", [], 0.8)
    assert au.is_redundant(None, [], 0.8)
    assert au.is_redundant("a b", [], 0.8)  # no word of two or more characters
    assert not au.is_redundant("who wrote hamlet", [], 0.8)
    assert not au.is_redundant("who wrote hamlet", [None, ""], 0.8)
    # cosine 0.336 (see above): new at threshold 0.8, redundant at 0.3.
    assert not au.is_redundant("apple banana", ["apple cherry"], 0.8)
    assert au.is_redundant("apple banana", ["apple cherry"], 0.3)


def test_early_stop_correct_answer():
    searches = [search("eiffel tower location"), search("paris population"), search("louvre museum")]
    out = _rewards(searches, answer("Paris"), ["Lyon", "Paris", "Paris"])
    assert out.minimal_depth == 2 and out.final_correct
    assert out.base == pytest.approx([0.025, 0.025, 0.025, 0.1 + 1.0])
    assert out.quality == pytest.approx([0.0, 1.0, 0.0, 0.0])  # F1 0 -> 1 -> 1
    # needed steps 1..2 earn 0.2 / 2 - 0.025 = 0.075; step 3 and the answer turn pay 0.05.
    assert out.efficiency == pytest.approx([0.075, 0.075, -0.05, -0.05])
    assert out.total == pytest.approx([0.1, 1.1, -0.025, 1.05])


def test_early_stop_overwrite_as_coded():
    searches = [search("eiffel tower location"), search("paris population"), search("louvre museum")]
    out = _rewards(searches, answer("Paris"), ["Lyon", "Paris", "Paris"],
                   public_code=True)
    assert out.total == pytest.approx([0.1, 1.1, -0.05, -0.05])  # the answer turn's +1.1 is erased


def test_every_search_needed():
    # The last step's intermediate answer never sets d (nothing comes after it): all steps were needed.
    out = _rewards([search("eiffel tower"), search("paris population")], answer("paris"), ["Lyon", "Paris"])
    assert out.minimal_depth is None
    # every valid turn, the answer turn too, earns 0.2 / 2 - 0.025 = 0.075.
    assert out.efficiency == pytest.approx([0.075, 0.075, 0.075])
    assert out.total == pytest.approx([0.1, 1.1, 1.175])
    flagged = _rewards([search("eiffel tower"), search("paris population")], answer("paris"),
                       ["Lyon", "Paris"], public_code=True)
    assert flagged.total == pytest.approx(out.total)


def test_wrong_answer_with_redundant_query():
    searches = [search("paris population"), search("Paris population?"), search("louvre museum")]
    out = _rewards(searches, answer("Lyon"), ["Paris", "Lyon", "Lyon"])
    assert out.minimal_depth == 1 and not out.final_correct
    assert out.base == pytest.approx([0.025, -0.025, 0.025, 0.1])
    assert out.quality == pytest.approx([1.0, 0.0, 0.0, 0.0])
    # wrong final answer: 0.0125 on each valid turn; the redundant turn gets nothing.
    assert out.efficiency == pytest.approx([0.0125, 0.0, 0.0125, 0.0125])
    assert out.total == pytest.approx([1.0375, -0.025, 0.0375, 0.1125])
    flagged = _rewards(searches, answer("Lyon"), ["Paris", "Lyon", "Lyon"],
                       public_code=True)
    assert flagged.total == pytest.approx([1.0375, -0.05, -0.05, -0.05])


def test_no_search():
    assert _rewards([], answer("Paris"), []).total == pytest.approx([0.1 + 1.0 + 0.2])
    # malformed answer turn: -0.5 + 1, and no efficiency bonus.
    assert _rewards([], answer("Paris", ok=False), []).total == pytest.approx([0.5])


def test_bad_search_turns():
    out = _rewards([search("good query", ok=False), search(None)], answer("Rome"), [None, None])
    assert out.base == pytest.approx([-0.025, -0.025, 0.1])
    assert out.efficiency == pytest.approx([0.0, 0.0, 0.0125])


def test_missing_answer_turn_folds_onto_last_turn():
    out = _rewards([search("first query"), search("second query")], None, [None, "Paris"])
    assert not out.final_correct and len(out.total) == 2
    # slots [0.025, 0.025, -0.5] fold to [0.025, -0.475]; quality [0, 1]; efficiency 0.0125 on valid slots.
    assert out.total == pytest.approx([0.025 + 0.0125, -0.475 + 1.0 + 0.0125])


def test_validity_does_not_depend_on_the_coefficients():
    # The no-base ablation zeroes every base coefficient; a malformed search still earns no efficiency reward.
    no_base = dict(search_format_reward=0.0, answer_format_reward=0.0, answer_format_penalty=0.0,
                   correct_answer_reward=0.0)
    out = _rewards([search("good query", ok=False), search("second query")], answer("Rome"), [None, None],
                   **no_base)
    assert out.base == [0.0, 0.0, 0.0]
    assert out.efficiency == pytest.approx([0.0, 0.0125, 0.0125])


# The public code (public_code=True): main_ppo_format_turn_new78.py's RewardManager, worked by hand.

def test_public_code_scores_f1_and_depth_against_the_first_gold():
    searches = [search("capital of france"), search("paris population"), search("louvre museum")]
    golds = ["Paris France", "Paris"]
    out = _rewards(searches, answer("Paris"), ["Paris", "Paris France", "Paris"], golds, public_code=True)
    assert out.final_correct  # the final answer's EM uses every gold
    # F1 against "Paris France": "Paris" 2/3 -> 0.6667 (rounded), then 1.0; "Paris France" is d = 2.
    assert out.minimal_depth == 2
    assert out.quality == pytest.approx([0.6667, 0.3333, 0.0, 0.0])
    # steps 1..2 earn 0.5 * (0.4 / 2 - 0.05) = 0.075; turns 3 and 4 are overwritten with -0.05 (the +1 too).
    assert out.total == pytest.approx([0.025 + 0.6667 + 0.075, 0.025 + 0.3333 + 0.075, -0.05, -0.05])
    # The project's default: every gold, so "Paris" is right at step 1; the penalty is added, not overwritten.
    paper = _rewards(searches, answer("Paris"), ["Paris", "Paris France", "Paris"], golds)
    assert paper.minimal_depth == 1
    assert paper.total == pytest.approx([0.025 + 1.0 + 0.175, 0.025 - 0.05, 0.025 - 0.05, 1.1 - 0.05])


def test_public_code_stops_paying_at_the_first_invalid_step():
    searches = [search("eiffel tower"), search("bad format", ok=False), search("paris population"),
                search("louvre museum")]
    intermediate = ["Lyon", None, "Paris", "Paris"]
    out = _rewards(searches, answer("Paris"), intermediate, public_code=True)
    assert out.minimal_depth == 3
    # 0.5 * (0.4 / 3 - 0.05) = 0.041667 on step 1 only: step 2 is invalid and the public loop breaks there.
    step = 0.2 / 3 - 0.025
    assert out.total == pytest.approx([0.025 + step, -0.025, 0.025 + 1.0, -0.05, -0.05])
    paper = _rewards(searches, answer("Paris"), intermediate)  # skips the invalid step instead
    assert paper.total == pytest.approx([0.025 + step, -0.025, 0.025 + 1.0 + step, -0.025, 1.05])


def test_public_code_pays_no_efficiency_without_an_observation():
    assert _rewards([], answer("Paris"), [], public_code=True).total == pytest.approx([1.1])
    assert _rewards([], answer("Lyon"), [], public_code=True).total == pytest.approx([0.1])
    assert _rewards([], answer("Lyon"), []).total == pytest.approx([0.1125])


def test_public_code_scores_the_last_turn_as_the_answer_turn():
    # No answer turn: the last search turn is the answer slot (-0.5), with no intermediate answer of its own.
    out = _rewards([search("first query"), search("second query")], None, [None, "Paris"], public_code=True)
    assert out.total == pytest.approx([0.025 + 0.0125, -0.5])


def test_public_is_redundant():
    assert not au.public_is_redundant("", [], 0.8)  # the first query is never a repeat
    assert au.public_is_redundant(None, ["q"], 0.8)  # empty after normalisation
    assert au.public_is_redundant("none", [None], 0.8)  # an empty earlier query is fitted as "None"
    assert not au.public_is_redundant("x y", ["paris"], 0.8)  # no word of 2+ characters: a zero vector
    assert au.public_is_redundant("x y", ["c d"], 0.8)  # none anywhere: scikit-learn's error, a repeat
    assert au.public_is_redundant("Who wrote Hamlet?", ["who wrote hamlet"], 0.8)
    assert not au.public_is_redundant("apple banana", ["apple cherry"], 0.8)  # cosine 0.336


def test_public_f1():
    assert au.public_f1("Paris France", "paris") == 0.6667  # 2/3, rounded to 4 places
    assert au.public_f1("yes sir", "yes") == 0.6667  # no yes/no rule (the project's F1 gives 0)
    assert au.qa.f1("yes sir", ["yes"]) == 0.0
    assert au.public_f1("Lyon", "Paris") == 0.0 and au.public_f1(None, "Paris") == 0.0


def test_record_validation():
    with pytest.raises(ValueError, match="intermediate_answers has 0 entries for 1 search turns"):
        au.AutoSearchRecord([search("q")], answer("x"), [], GOLDS)
    with pytest.raises(ValueError, match="at least one turn"):
        au.AutoSearchRecord([], None, [], GOLDS)


MB = 1_000_000


# Texts of about n characters that stress the rewards' text handling.
TEXTS = {"one_char": lambda n: "a" * n, "short_words": lambda n: "ab " * (n // 3),
         "numbered_words": lambda n: " ".join(f"w{i}" for i in range(n // 8)),
         "tags": lambda n: "<answer>" * (n // 8)}


def compute_rewards(text: str) -> None:
    au.is_redundant(text, [text[:1000], "paris"], 0.8)
    record = au.AutoSearchRecord([au.SearchTurn(text, text[:1000], True)], au.AnswerTurn(text, True), [text],
                                 GOLDS)
    au.autosearch_rewards(record)


@pytest.mark.parametrize("make_text", TEXTS.values(), ids=TEXTS)
def test_rewards_take_linear_time(make_text):
    """8 times the text takes about 8 times as long, not 64 (a quadratic step): the median ratio of rounds
    that time both sizes in turns (`interleave.compare`), so that a loaded machine slows both alike."""
    small, large = make_text(MB // 8), make_text(MB)
    timed = interleave.compare(lambda: compute_rewards(small), lambda: compute_rewards(large), rounds=3,
                               warmup=0)
    ratio = statistics.median(timed.ratios)  # per round: the large text's seconds / the small one's
    assert ratio < 24, f"8x the text took {ratio:.1f}x the time"
