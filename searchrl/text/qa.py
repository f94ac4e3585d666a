"""Open-domain QA metrics on answer strings: SQuAD normalisation, EM, cover-EM, token F1.

These are the metrics of Search-R1, FlashRAG and HotpotQA. Every metric takes one prediction and one or
more gold answers and returns the best score over the golds.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Sequence

Golds = str | Sequence[str]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)
# HotpotQA / FlashRAG: a yes/no/noanswer prediction or gold scores F1 only on an exact match.
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation, drop articles a/an/the, collapse whitespace."""
    text = text.lower().translate(_DROP_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _gold_list(golds: Golds) -> list[str]:
    """Accepts one gold string or a sequence of them."""
    if isinstance(golds, str):
        return [golds]
    golds = list(golds)
    if not all(isinstance(g, str) for g in golds):
        raise TypeError(f"gold answers must be strings, got {[type(g).__name__ for g in golds]}")
    return golds


def exact_match(prediction: str, golds: Golds) -> float:
    """1.0 when the normalised prediction equals some normalised gold answer."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _gold_list(golds)))


def cover_em(prediction: str, golds: Golds) -> float:
    """1.0 when some normalised gold answer is a substring of the normalised prediction (FlashRAG `acc`).

    A gold answer that normalises to the empty string is skipped: it would cover every prediction.
    """
    pred = normalize_answer(prediction)
    return float(any(g and g in pred for g in map(normalize_answer, _gold_list(golds))))


def has_answer(passage: str, golds: Golds) -> bool:
    """True when some normalised gold answer occurs in the normalised passage on word boundaries, so "art"
    is not found in "party". SQuAD normalisation drops punctuation and articles, so this is not DPR's
    `has_answers` (H@N as the DPR line of work counts it is `searchrl.retrieval.metrics.has_answer`).
    """
    text = f" {normalize_answer(passage)} "
    return any(g and f" {g} " in text for g in map(normalize_answer, _gold_list(golds)))


def _token_f1(pred: str, gold: str) -> float:
    """Token-level F1 of two normalised strings."""
    if (pred in _SPECIAL_ANSWERS or gold in _SPECIAL_ANSWERS) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, golds: Golds) -> float:
    """Best token-level F1 of the prediction against the gold answers (HotpotQA/FlashRAG rules)."""
    pred = normalize_answer(prediction)
    return max((_token_f1(pred, normalize_answer(g)) for g in _gold_list(golds)), default=0.0)


def scores(prediction: str, golds: Golds) -> dict[str, float]:
    """The prediction's EM, F1 and cover-EM against the gold answers (the columns of every QA table)."""
    return {"em": exact_match(prediction, golds), "f1": f1(prediction, golds),
            "cover_em": cover_em(prediction, golds)}
