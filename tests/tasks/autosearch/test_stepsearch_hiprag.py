"""StepSearch and HiPRAG rewards on hand-built trajectories, with hand-computed expected rewards; StepSearch's
information gain against a copy of its public code (github.com/Zillwang/StepSearch, qa_step.py)."""
from __future__ import annotations

import math
import pathlib
import re
import string

import numpy as np
import pytest

from searchrl import configlib, run_config
from searchrl.episode import Action, Trajectory, Turn
from searchrl.retrieval.types import Hit
from searchrl.tasks.autosearch import baseline_rewards as br
from searchrl.tasks.autosearch import env as autosearch_env
from searchrl.tasks.autosearch import rewards as au
from searchrl.tasks.autosearch.env import INTERMEDIATE_ANSWER, AutoSearchEnv
from searchrl.tasks.search_r1.env import INVALID_ACTION, format_passages, search_observation

GOLDS = ["Paris"]
CONFIGS = pathlib.Path(__file__).resolve().parents[3] / "configs"
W = math.log(1.5) + 1  # idf of a word in one of two documents (scikit-learn's smooth idf)
# TF-IDF cosine of "apple banana" and "apple cherry" (tests/tasks/autosearch/test_rewards.py)
COS = 1 / (1 + W * W)


class NoRetriever:
    def search(self, queries, k):
        raise AssertionError("rewards never search")


def search_turn(query: str, hits: list[Hit], intermediate: str | None = None) -> Turn:
    obs = search_observation(hits)
    info = dict(obs.info) | ({INTERMEDIATE_ANSWER: intermediate} if intermediate is not None else {})
    return Turn(0, 1, f"<think>need</think><search>{query}</search>", Action("search", query), obs.text, info)


def answer_turn(answer: str, think: bool = True) -> Turn:
    text = ("<think>found</think>" if think else "") + f"<answer>{answer}</answer>"
    return Turn(0, 1, text, Action("answer", answer, done=True))


def hits(*ids: str, texts: dict[str, str] | None = None) -> list[Hit]:
    return [Hit(i, 1.0, f"T{i}", (texts or {}).get(i, f"text of {i}")) for i in ids]


def trajectory(rows: list[list[Turn]]) -> Trajectory:
    zeros = np.zeros((len(rows), 4), np.float32)
    return Trajectory(tokens=zeros.astype(np.int32), attention_mask=zeros > 0, loss_mask=zeros,
                      logprobs=zeros,
                      prompt_lengths=np.zeros(len(rows), np.int32), lengths=np.zeros(len(rows), np.int32),
                      turns=rows, finish_reasons=["done"] * len(rows), side_branch=INTERMEDIATE_ANSWER)


def example(**metadata) -> dict:
    return {"id": "q1", "question": "Capital of France?", "golden_answers": GOLDS, "metadata": metadata}


def env_rewards(reward: str, rows: list[list[Turn]], examples: list[dict], **config) -> list[list[float]]:
    env = AutoSearchEnv(NoRetriever(), autosearch_env.Config(reward=reward, **config))
    return env.rewards(trajectory(rows), examples)


# ---- StepSearch ----

KEYS = [["capital of france"], ["eiffel tower city", "eiffel tower location"]]


def test_stepsearch_by_hand_with_gold_ids_and_search_keys():
    rows = [[search_turn("capital of france", hits("d1", "d3")),
             search_turn("eiffel tower", hits("d1", "d2")),
             search_turn("eiffel tower", hits("d2", "d4")), answer_turn("Paris city")]]
    ex = example(supporting_ids=["d1", "d2"], search_keys=KEYS)
    # Best matches per step [1, 0], [1, 1], [0, 1]: gains 0.5, 0.5, 0. Repeats: none, d1, d2: 0, 0.5, 0.5.
    # Keys: q1 = group 0 exactly (1); "eiffel tower" vs "eiffel tower city": P 1, R 2/3, F1 0.8 -> K 0.9.
    # Answer F1 of "Paris city": P 1/2, R 1 -> 0.6667 (rounded as the public code).
    out = br.stepsearch_rewards(br.stepsearch_record(rows[0], ex, br.StepSearchConfig()))
    assert out.information_gains == pytest.approx([0.5, 0.5, 0.0], abs=1e-12)
    assert out.redundancy == pytest.approx([0.0, 0.5, 0.5], abs=1e-12)
    assert (out.answer_f1, out.search_key_score) == (0.6667, pytest.approx(0.9, abs=1e-12))
    expected = [0.6 * 0.5, 0.6 * (0.5 - 0.5), 0.6 * -0.5, 0.6667 + 0.618 * 0.9]
    assert out.total == pytest.approx(expected, abs=1e-12)
    assert env_rewards("stepsearch", rows, [ex]) == [pytest.approx(expected, abs=1e-12)]
    # The coefficients come from config.env.stepsearch: no step rewards, no key term.
    off = br.StepSearchConfig(step_reward_scale=0.0, search_key_coef=0.0)
    assert env_rewards("stepsearch", rows, [ex], stepsearch=off) == [pytest.approx([0, 0, 0, 0.6667])]


def test_stepsearch_without_an_answer_scores_the_format_penalty_only():
    rows = [[search_turn("capital of france", hits("d1")),
             Turn(1, 2, "<search>again</search>", Action("invalid", "search is disabled", done=True))]]
    ex = example(supporting_ids=["d1"], search_keys=KEYS)
    assert env_rewards("stepsearch", rows, [ex]) == [[0.0, -1.0]]


def test_stepsearch_without_gold_passages_pays_the_outcome_only():
    rows = [[search_turn("capital of france", hits("d1", "d1")), answer_turn("Paris")]]
    out = br.stepsearch_rewards(br.stepsearch_record(rows[0], example(), br.StepSearchConfig()))
    assert (out.information_gains, out.redundancy, out.total) == ([], [], [0.0, 1.0])


def test_search_key_score_follows_the_public_matching():
    # A later, weaker query replaces its group's score (1 -> 0.5 for "tower": P 1, R 1/3); a query that
    # matches no group sets nothing; the mean is over groups.
    assert br.search_key_score(["eiffel tower city", "tower", "zzz"], KEYS) == pytest.approx(0.25, abs=1e-12)
    assert br.search_key_score(["Capital of France?"], KEYS) == pytest.approx(0.5, abs=1e-12)
    assert br.search_key_score([], KEYS) == br.search_key_score(["x"], []) == 0.0


def test_information_gain_with_gold_texts_by_hand():
    texts = {"a": "Apple cherry", "b": "apple banana", "c": ""}
    steps = [br.Retrieval(("a",), ("Apple cherry",)), br.Retrieval(("b", "c"), ("apple banana", ""))]
    degrees = [br.match_degrees(s, ["apple banana"], ()) for s in steps]
    assert [d.tolist() for d in degrees] == [pytest.approx([COS], abs=1e-12), pytest.approx([1.0], abs=1e-12)]
    assert br.information_gains(degrees) == pytest.approx([COS, 1 - COS], abs=1e-12)
    # Through the env, the passages' texts are read back from the observations the policy saw.
    rows = [[search_turn("apple", hits("a", texts=texts)), search_turn("banana", hits("b", "c", texts=texts)),
             answer_turn("Paris")]]
    ex = example(support_docs=[{"title": "Fruit", "paragraph_text": "apple banana"}])
    expected = [0.6 * COS, 0.6 * (1 - COS), 1.0]
    assert env_rewards("stepsearch", rows, [ex]) == [pytest.approx(expected, abs=1e-12)]


# StepSearch's public code (verl/utils/reward_score/qa_step.py, submodule.py), the reference below.

def _public_normalize(s):
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def _public_information_gain(informations, golden_info):
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics.pairwise import cosine_similarity

    def subm_tfidf_cosine(input_str, concept_units):
        if input_str == "":
            return [0.0] * len(concept_units)
        matrix = TfidfVectorizer().fit_transform([input_str] + concept_units)
        return np.maximum(cosine_similarity(matrix[0], matrix[1:]).flatten(), 0)

    golden = [_public_normalize(info["paragraph_text"]) for info in golden_info]
    previous, gains = [0.0] * len(golden), []
    for information in informations:
        current = [0.0] * len(golden)
        for info in information:
            for i, score in enumerate(subm_tfidf_cosine(_public_normalize(info), golden)):
                current[i] = max(current[i], score)
        gains.append(sum(max(c - p, 0) for c, p in zip(current, previous)) / len(current))
        previous = [max(c, p) for c, p in zip(current, previous)]
    return gains


def test_information_gain_matches_the_public_code():
    pytest.importorskip("sklearn")
    golden = [{"title": "A", "paragraph_text": "The Eiffel Tower is a wrought-iron tower in Paris, France."},
              {"title": "B", "paragraph_text": "Paris is the capital and largest city of France."},
              {"title": "C", "paragraph_text": "Gustave Eiffel's company designed and built the tower."}]
    informations = [["Paris is a city in France.", "The tower was built for the 1889 World's Fair."],
                    ["Gustave Eiffel designed it; his company built the tower.", ""],
                    ["The Eiffel Tower is a wrought-iron tower in Paris, France.", "Lyon is a city."],
                    ["Unrelated text about rivers."]]
    steps = [br.Retrieval(tuple(str(i) for i in range(len(docs))), tuple(docs)) for docs in informations]
    texts = [g["paragraph_text"] for g in golden]
    ours = br.information_gains([br.match_degrees(s, texts, ()) for s in steps])
    assert ours == pytest.approx(_public_information_gain(informations, golden), abs=1e-12)
    assert sum(ours) > 0.5  # the case is not all zeros


def test_redundancy_counts_repeats_within_and_across_steps():
    assert br.redundancy_penalties([("a", "b"), ("a", "a", "c"), (), ("c",)]) == \
        pytest.approx([0.0, 2 / 3, 0.0, 1.0], abs=1e-12)


def test_observed_passages_read_back_the_env_layout():
    found = [Hit("1", 1.0, '"Foo (film)"', "A film.\nSecond line."), Hit("2", 1.0, "B", "Bee"),
             Hit("3", 1.0, "T", "Doc 3 (Title: x) is quoted")]
    text = search_observation(found).text
    assert br.observed_passages(text, 3) == ("A film.\nSecond line.", "Bee", "Doc 3 (Title: x) is quoted")
    passages = format_passages(found)
    cut = f"\n\n<information>{passages[:passages.index('is quoted')]}"  # truncated: no closing tag
    assert br.observed_passages(cut, 3) == ("A film.\nSecond line.", "Bee", "Doc 3 (Title: x)")
    cut = f"\n\n<information>{passages[:passages.index('Doc 3')]}"  # the third passage cut off entirely
    assert br.observed_passages(cut, 3) == ("A film.\nSecond line.", "Bee", "")
    assert br.observed_passages(INVALID_ACTION, 0) == ()


def test_bad_metadata_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"'q1'.*metadata.search_keys must be a list"):
        br.search_keys(example(search_keys="capital"), "search_keys")
    with pytest.raises(ValueError, match=r"metadata.support_docs holds 3, not a string"):
        br.support_docs(example(support_docs=[3]), "support_docs")
    with pytest.raises(ValueError, match=r"metadata.plan holds \{'a': 1\}, not a string or a list"):
        br.search_keys(example(plan=[{"a": 1}]), "plan")
    assert br.search_keys(example(plan=["a b", ["c", "d"]]), "plan") == [["a b"], ["c", "d"]]


# ---- HiPRAG ----

def hiprag(searches: list[str | None], intermediate: list[str | None], final: str | None,
           format_ok: bool = True) -> br.HiPRAGRewards:
    """HiPRAG on a record: `searches` (None: an invalid turn), the answers after them, the final answer."""
    turns = [au.SearchTurn("t", q, q is not None) for q in searches]
    answer = None if final is None else au.AnswerTurn(f"<think>t</think><answer>{final}</answer>", True)
    return br.hiprag_rewards(au.AutoSearchRecord(turns, answer, intermediate, GOLDS), format_ok)


@pytest.mark.parametrize("searches, intermediate, final, format_ok, score, over, under", [
    # Search 2 came after a right intermediate answer: 2 optimal steps of 3 -> 1 + 0.4 * 2/3.
    (["q1", "q2"], ["Paris", "Paris"], "Paris", True, 1 + 0.4 * 2 / 3, [False, True, False], [False] * 3),
    # Right without searching: the only step is optimal -> 1 + 0.4.
    ([], [], "Paris", True, 1.4, [False], [False]),
    # Cover-EM: the answer contains the gold. Search 3 follows the right answer of search 2 -> 1 + 0.4 * 3/4.
    (["q1", "q2", "q3"], ["Lyon", "Paris!", "x"], "It is Paris, France", True, 1.3, [0, 0, 1, 0], [0] * 4),
    # The gate: a wrong answer or a bad format gets no process bonus.
    (["q1"], ["Lyon"], "Lyon", True, 0.2, [False, False], [False, True]),
    (["q1"], ["Paris"], "Paris", False, 0.8, [False, False], [False, False]),
    (["q1"], ["Lyon"], "Lyon", False, 0.0, [False, False], [False, True]),
    # An invalid turn is an under-search and leaves the last intermediate answer in place: the answer before
    # search 2 is search 1's, right, so search 2 is an over-search.
    (["q1", None, "q2"], ["Paris", None, "Paris"], "Paris", True, 1.2, [0, 0, 1, 0], [0, 1, 0, 0]),
    # No answer turn: steps are the search turns; nothing right.
    (["q1"], ["Paris"], None, False, 0.0, [False], [False]),
])
def test_hiprag_by_hand(searches, intermediate, final, format_ok, score, over, under):
    out = hiprag(searches, intermediate, final, format_ok)
    assert out.score == pytest.approx(score, abs=1e-12)
    assert (out.over_search, out.under_search) == ([bool(o) for o in over], [bool(u) for u in under])


def test_hiprag_through_the_env_reads_the_format_and_the_intermediate_answers():
    rows = [[search_turn("capital of france", hits("d1"), " Paris </answer>"),
             search_turn("france capital", hits("d2"), " Paris </answer>"), answer_turn("Paris")],
            [search_turn("capital of france", hits("d1"), " Paris </answer>"),
             answer_turn("Paris", think=False)]]
    ex = example()
    # Row 0: valid, the second search was an over-search: 1 + 0.4 * 2/3. Row 1: no <think>: 0.8, no bonus.
    assert env_rewards("hiprag", rows, [ex, ex]) == [[0.0, 0.0, pytest.approx(1 + 0.4 * 2 / 3, abs=1e-12)],
                                                     [0.0, pytest.approx(0.8, abs=1e-12)]]
    weights = br.HiPRAGConfig(format_weight=0.4, process_coef=0.0)
    assert env_rewards("hiprag", rows, [ex, ex], hiprag=weights)[1] == [0.0, pytest.approx(0.6, abs=1e-12)]
    with pytest.raises(ValueError, match="reads the 'intermediate_answer' side branch"):
        AutoSearchEnv(NoRetriever(), autosearch_env.Config(reward="hiprag", intermediate_answers=False))
    AutoSearchEnv(NoRetriever(), autosearch_env.Config(reward="stepsearch", intermediate_answers=False))


def test_presets_carry_the_public_coefficients():
    """configs/autosearch_baselines.py against the public sources: [SS] main_ppo.py step_reward_scale=0.6,
    qa_step.py search_keys_score=0.618 and 'score': -1, train.sh information_gain / redundancy_penalty true;
    [HP] train_ppo_format.sh structure_format_score=0.2, qa_em_format.py's 0.4."""
    baselines = configlib.sibling(str(CONFIGS / "autosearch.py"), "autosearch_baselines")
    for preset in baselines.PRESETS:
        env = run_config.parse(baselines.get_config(preset)).env
        assert env.reward == preset.removeprefix("paper_").removeprefix("tiny_").removesuffix("_grpo")
        ss = env.stepsearch
        assert (ss.step_reward_scale, ss.search_key_coef, ss.format_penalty, ss.information_gain_coef,
                ss.redundancy_coef) == (0.6, 0.618, -1.0, 1.0, 1.0)
        assert (env.hiprag.format_weight, env.hiprag.process_coef) == (0.2, 0.4)
    assert br.StepSearchConfig() == run_config.parse(baselines.get_config("paper_stepsearch")).env.stepsearch
    assert br.HiPRAGConfig() == run_config.parse(baselines.get_config("paper_hiprag")).env.hiprag
    grpo = run_config.parse(baselines.get_config("paper_hiprag_grpo"))
    assert grpo.rl.advantage == "grpo" and grpo.env.intermediate_answers
