"""Ranking metrics on hand-computed cases (trec_eval definitions) and the qrels readers."""
import math
import random

import pytest

from searchrl.retrieval.metrics import dpr_tokens, evaluate, first_answer_rank, has_answer, mrr_at_k, \
    ndcg_at_k, precision_at_k, read_beir_qrels, read_qrels, read_trec_qrels, recall_at_k

RANKED = ["d1", "d2", "d3", "d4", "d5"]
# Relevant: d1, d3, d6 (d6 is never retrieved); d7 is judged non-relevant.
QRELS = {"d1": 1, "d3": 2, "d6": 1, "d7": 0}


def test_ndcg_hand_computed():
    # @3: DCG = 1/log2(2) + 0/log2(3) + 2/log2(4) = 1 + 0 + 1 = 2
    #     ideal gains [2, 1, 1]: IDCG = 2/1 + 1/log2(3) + 1/2 = 3.1309298
    assert ndcg_at_k(RANKED, QRELS, 3) == pytest.approx(2 / (2.5 + 1 / math.log2(3)), rel=1e-12)
    assert ndcg_at_k(RANKED, QRELS, 3) == pytest.approx(0.6387878, abs=1e-7)
    # @1: DCG = 1, IDCG = 2
    assert ndcg_at_k(RANKED, QRELS, 1) == 0.5
    # @10: DCG = 2 (d6 never retrieved), IDCG = 2 + 1/log2(3) + 1/log2(4) = 3.1309298
    assert ndcg_at_k(RANKED, QRELS, 10) == pytest.approx(2 / (2.5 + 1 / math.log2(3)), rel=1e-12)
    assert ndcg_at_k(["d3", "d1", "d6"], QRELS, 3) == pytest.approx(1.0)  # the ideal ranking
    assert ndcg_at_k(RANKED, {"d9": 0}, 10) == 0.0  # nothing relevant
    # A negative judgement is a gain of 0.
    assert ndcg_at_k(["x", "d1"], {"x": -1, "d1": 1}, 2) == pytest.approx(1 / math.log2(3))


def test_ndcg_matches_sklearn_on_random_cases():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    for _ in range(50):
        docs = [f"d{i}" for i in range(12)]
        qrels = {d: rng.choice([0, 0, 1, 2, 3]) for d in rng.sample(docs, 8)}
        if not any(qrels.values()):
            continue
        ranked = rng.sample(docs, 12)
        k = rng.randint(1, 12)
        y_true = [[qrels.get(d, 0) for d in ranked]]
        y_score = [[12 - i for i in range(12)]]
        assert ndcg_at_k(ranked, qrels, k) == pytest.approx(sklearn_metrics.ndcg_score(y_true, y_score, k=k))


def test_recall_precision_mrr_hand_computed():
    assert recall_at_k(RANKED, QRELS, 1) == 1 / 3
    assert recall_at_k(RANKED, QRELS, 3) == 2 / 3  # d1, d3 of {d1, d3, d6}
    assert recall_at_k(RANKED, QRELS, 100) == 2 / 3
    assert precision_at_k(RANKED, QRELS, 3) == 2 / 3
    assert precision_at_k(RANKED, QRELS, 10) == 2 / 10  # trec_eval divides by k even past the run's end
    assert mrr_at_k(RANKED, QRELS, 10) == 1.0
    assert mrr_at_k(["d2", "d4", "d3"], QRELS, 10) == 1 / 3
    assert mrr_at_k(["d2", "d4", "d3"], QRELS, 2) == 0.0
    assert recall_at_k(RANKED, {}, 10) == 0.0


def test_evaluate_means_over_qrels_queries():
    qrels = {"q1": QRELS, "q2": {"a": 1}, "q3": {"b": 1}}
    run = {"q1": RANKED, "q2": ["x", "a"], "extra": ["a"]}  # q3 missing from the run: scores 0
    out = evaluate(run, qrels, ["mrr@10", "recall@1", "precision@2", "ndcg@2"])
    assert out["mrr@10"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    assert out["recall@1"] == pytest.approx((1 / 3 + 0 + 0) / 3)
    assert out["precision@2"] == pytest.approx((1 / 2 + 1 / 2 + 0) / 3)
    # q1 @2: DCG 1, IDCG 2 + 1/log2(3); q2 @2: DCG 1/log2(3), IDCG 1
    assert out["ndcg@2"] == pytest.approx((1 / (2 + 1 / math.log2(3)) + 1 / math.log2(3)) / 3)
    for bad in ["ndcg", "map@10", "ndcg@0", "ndcg@x"]:
        with pytest.raises(ValueError, match="unknown metric"):
            evaluate(run, qrels, [bad])
    with pytest.raises(ValueError, match="no queries"):
        evaluate(run, {}, ["ndcg@10"])


def test_qrels_readers(tmp_path):
    beir = tmp_path / "test.tsv"
    beir.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t2\n\nq2\td3\t0\n")
    expected = {"q1": {"d1": 1, "d2": 2}, "q2": {"d3": 0}}
    assert read_beir_qrels(beir) == expected == read_qrels(beir)
    trec = tmp_path / "qrels.txt"
    trec.write_text("q1 0 d1 1\nq1 0 d2 2\nq2 Q0 d3 0\n")
    assert read_trec_qrels(trec) == expected == read_qrels(trec)

    bad = tmp_path / "bad.tsv"
    bad.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\n")
    with pytest.raises(ValueError, match=rf"{bad}:3: expected query-id"):
        read_beir_qrels(bad)
    bad.write_text("q1\td1\thigh\n")
    with pytest.raises(ValueError, match=rf"{bad}:1: relevance must be an integer of at most 18 digits, got 'high'"):
        read_qrels(bad)
    bad.write_text("q1 0 d1 1\nq1 d2 1\n")
    with pytest.raises(ValueError, match=rf"{bad}:2: expected 'qid 0 docid rel'"):
        read_qrels(bad)


def test_qrels_byte_order_mark_and_negative_grades(tmp_path):
    """A BOM once made the header a judgement ("relevance must be an integer of at most 18 digits, got 'score'"); negative
    grades are TREC's (e.g. -2: junk) and count as not relevant."""
    beir = tmp_path / "test.tsv"
    beir.write_bytes(b"\xef\xbb\xbfquery-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t-2\n")
    assert read_beir_qrels(beir) == read_qrels(beir) == {"q1": {"d1": 1, "d2": -2}}
    trec = tmp_path / "qrels.txt"
    trec.write_bytes(b"\xef\xbb\xbfq1 0 d1 1\nq1 0 d2 -2\n")
    assert read_trec_qrels(trec) == read_qrels(trec) == {"q1": {"d1": 1, "d2": -2}}
    assert ndcg_at_k(["d2", "d1"], {"d1": 1, "d2": -2}, 2) == pytest.approx(1 / math.log2(3))
    assert recall_at_k(["d2"], {"d1": 1, "d2": -2}, 1) == 0.0


@pytest.mark.parametrize("content, reason", [
    (b"q1\td1\t1\nq2\td\xff2\t1\n", r":2: not UTF-8 \(at character 5\)"),
    (b"q1 0 d1 1\r\nq1 0 d2 " + b"7" * 5000 + b"\r\n", r":2: relevance must be an integer of at most 18 digits, got '7777"),
    (b"query-id\tcorpus-id\tscore\n\n\nq1\td1\n", r":4: expected query-id<TAB>corpus-id<TAB>score"),
    (b"query-id\tcorpus-id\tscore\nq1\td1\t1_0\n", r":2: relevance must be an integer of at most 18 digits, got '1_0'"),
    ("q1\td1\t\u0663\n".encode(), r":1: relevance must be an integer of at most 18 digits, got '\u0663'"),  # Arabic-Indic 3
    (b"q1 0 d1 +1\n", r":1: relevance must be an integer of at most 18 digits, got '\+1'"),
    (b"q1 0 d1 --1\n", r":1: relevance must be an integer of at most 18 digits, got '--1'"),
])
def test_qrels_hazards_name_file_and_line(tmp_path, content, reason):
    bad = tmp_path / "bad.qrels"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=rf"{bad}{reason}"):
        read_qrels(bad)


# Answer matching (H@N) against pyserini's own `has_answers` (DPR's tokenizer), byte for byte.
TRICKY = [  # (passage, answers), each where SQuAD normalisation, substring search or plain lower() differ
    ("The Beatles were a band.", ["the Beatles"]), ("Beatles!", ["The Beatles"]), ("a party", ["art"]),
    ("the U.S. army", ["U.S."]), ("the US army", ["U.S."]), ("rock-and-roll music", ["rock and roll"]),
    ("rock and roll", ["rock-and-roll"]), ("it's 1,000 km", ["1000"]), ("it's 1,000 km", ["1,000"]),
    ("O'Neil said", ["oneil"]), ("O'Neil said", ["O'Neil"]), ("Café de Flore", ["cafe\u0301"]),
    ("Cafe de Flore", ["café"]), ("naïve", ["naive"]), ("ΟΔΟΣ ΣΟΦΙΑΣ", ["οδος"]), ("İstanbul", ["istanbul"]),
    ("Straße", ["STRASSE"]), ("ﬁnal", ["final"]), ("东京是首都", ["东京"]), ("x\u200by", ["xy"]),
    ("smile 😀 now", ["😀"]), ("$5.00 price", ["5.00"]), ("a\tb\nc", ["b c"]), ("", ["x"]), ("text", []),
    ("anything", [""]), ("anything", [" \n"]), ("Mr. Smith", ["mr smith"]), ("e=mc²", ["mc2"]),
    ("100%", ["100 %"]), ("C++ language", ["c+"]), ("Ⅻ chapter", ["xii"]), ("a b a b c", ["b c", "z"]),
]


def test_has_answer_is_pyserinis_has_answers_on_tricky_and_random_strings():
    dpr = pytest.importorskip("pyserini.eval.evaluate_dpr_retrieval")
    tokenizer = dpr.SimpleTokenizer()
    cases = list(TRICKY)
    rng = random.Random(0)
    alphabet = list("aAbB eé\u0301.,'-!ΣσςİßﬁΩ1²\t\n\u200b😀东") + [" the ", " a "]
    for _ in range(1500):
        passage = "".join(rng.choices(alphabet, k=rng.randint(0, 30)))
        start = rng.randint(0, len(passage))
        answers = [passage[start:start + rng.randint(0, 6)], "".join(rng.choices(alphabet, k=rng.randint(0, 4)))]
        cases.append((passage, answers))
    ours = [has_answer(p, a) for p, a in cases]
    theirs = [dpr.has_answers(p, a, tokenizer, regex=False) for p, a in cases]
    assert ours == theirs
    assert 0.2 < sum(ours) / len(ours) < 0.8  # both outcomes are well represented
    assert [has_answer(p, a) for p, a in TRICKY[:4]] == [True, False, False, True]
    assert [dpr_tokens(t) for t in ("U.S.", "Café", "1,000")] == [["u", ".", "s", "."], ["cafe\u0301"],
                                                                ["1", ",", "000"]]


def test_first_answer_rank_is_the_first_passage_holding_an_answer():
    passages = ["The party was fun.", "Lyon is big.", "The Art of War is a book."]
    assert first_answer_rank(passages, ["art"]) == 3  # "party" does not hold "art"
    assert first_answer_rank(passages, ["Paris", "lyon"]) == 2
    assert first_answer_rank(passages, ["Paris"]) is None
