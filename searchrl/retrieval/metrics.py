"""Ranking metrics with trec_eval's definitions, and qrels readers (BEIR tsv, TREC).

Per query: `ranked` is the list of retrieved doc ids, best first; `qrels` maps doc id -> graded relevance
(> 0 is relevant). nDCG uses gain = rel and discount log2(rank + 1) (trec_eval / pytrec_eval `ndcg_cut`);
precision@k divides by k even when fewer were retrieved (trec_eval `P_k`).

Answer matching for open-domain QA retrieval (H@N, "top-N accuracy"): `has_answer` is DPR's, as pyserini's
`evaluate_dpr_retrieval.has_answers` computes it (Karpukhin et al. 2020; Ma et al. 2021).
"""
from __future__ import annotations

import math
import os
import unicodedata
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import regex

Qrels = dict[str, dict[str, int]]
# DPR's SimpleTokenizer (DrQA): a run of letters, digits and marks, or any one other non-space character.
_DPR_TOKEN = regex.compile(r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
                           flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)


def dpr_tokens(text: str) -> list[str]:
    """The lower-cased tokens of DPR's SimpleTokenizer over the NFD form of `text` (each token lower-cased
    alone, as `Tokens.words(uncased=True)` does)."""
    return [m.group().lower() for m in _DPR_TOKEN.finditer(unicodedata.normalize("NFD", text))]


def _holds(tokens: Sequence[str], answer: Sequence[str]) -> bool:
    n = len(answer)
    return any(tokens[i:i + n] == answer for i in range(len(tokens) - n + 1))


def first_answer_rank(passages: Iterable[str], answers: Sequence[str]) -> int | None:
    """1-based rank of the first passage that `has_answer`, or None; each answer is tokenised once."""
    wanted = [dpr_tokens(a) for a in answers]
    for rank, passage in enumerate(passages, 1):
        tokens = dpr_tokens(passage)
        if any(_holds(tokens, a) for a in wanted):
            return rank
    return None


def has_answer(passage: str, answers: Sequence[str]) -> bool:
    """True when some answer's DPR token sequence occurs in the passage's: pyserini's `has_answers(passage,
    answers, SimpleTokenizer(), regex=False)`, byte for byte. Matching is on whole tokens after NFD and
    lower-casing, with punctuation and articles kept ("the beatles" is not in "Beatles", "art" not in "party",
    "U.S." is in "the U.S. army"). As in pyserini, an answer with no tokens (empty or blank) is in every
    passage: the QA readers refuse empty answers."""
    return first_answer_rank([passage], answers) == 1


def _relevant(qrels: Mapping[str, int]) -> set[str]:
    return {d for d, rel in qrels.items() if rel > 0}


def dcg(gains: Sequence[float]) -> float:
    """sum_i gain_i / log2(i + 1), ranks i from 1."""
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains))


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """DCG of the top k over the DCG of the ideal top k; 0 for a query with no relevant docs."""
    ideal = dcg(sorted((r for r in qrels.values() if r > 0), reverse=True)[:k])
    if ideal == 0:
        return 0.0
    return dcg([max(qrels.get(d, 0), 0) for d in ranked[:k]]) / ideal


def recall_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """Fraction of the relevant docs found in the top k."""
    relevant = _relevant(qrels)
    return len(relevant.intersection(ranked[:k])) / len(relevant) if relevant else 0.0


def precision_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """Relevant docs in the top k, over k."""
    return len(_relevant(qrels).intersection(ranked[:k])) / k


def mrr_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """1 / rank of the first relevant doc within the top k, else 0."""
    relevant = _relevant(qrels)
    return next((1.0 / rank for rank, d in enumerate(ranked[:k], start=1) if d in relevant), 0.0)


METRICS: dict[str, Callable[[Sequence[str], Mapping[str, int], int], float]] = {
    "ndcg": ndcg_at_k, "recall": recall_at_k, "precision": precision_at_k, "mrr": mrr_at_k}


def evaluate(run: Mapping[str, Sequence[str]], qrels: Qrels, metrics: Sequence[str]) -> dict[str, float]:
    """Means over the queries of `qrels` of metrics named like "ndcg@10"; a query missing from `run` scores 0
    (trec_eval -c)."""
    if not qrels:
        raise ValueError("no queries in qrels")
    out = {}
    for name in metrics:
        metric, _, k = name.partition("@")
        if metric not in METRICS or not k.isdigit() or int(k) < 1:
            raise ValueError(f"unknown metric {name!r}; use <{'|'.join(METRICS)}>@<k>, e.g. ndcg@10")
        fn = METRICS[metric]
        out[name] = sum(fn(list(run.get(q, ())), rels, int(k)) for q, rels in qrels.items()) / len(qrels)
    return out


def _lines(path: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """("file:line", text) for each non-blank line of a text file, without a UTF-8 byte-order mark at its
    start; a line that is not UTF-8 raises `ValueError("file:line: not UTF-8 ...")`."""
    with open(path, encoding="utf-8-sig", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, start=1):
            try:
                line.encode("utf-8")
            except UnicodeEncodeError as e:  # undecodable bytes came back as lone surrogates
                raise ValueError(f"{path}:{lineno}: not UTF-8 (at character {e.start + 1})") from None
            if line.strip():
                yield f"{path}:{lineno}", line


Judgement = tuple[str, str, str, int]  # ("file:line", query id, doc id, relevance)


def _relevance(where: str, rel: str) -> int:
    """A judgement's relevance: plain ASCII decimal digits, with a leading "-" allowed (int() also takes
    "1_0", "+1", " 1" and non-ASCII digits such as "٣", which no qrels file means). Negative grades are kept
    as TREC qrels use them (e.g. -2 for junk pages in the ClueWeb Web-track judgements): the metrics count
    every grade <= 0 as not relevant."""
    digits = rel[1:] if rel.startswith("-") else rel
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 18):
        raise ValueError(f"{where}: relevance must be an integer of at most 18 digits, got {rel[:50]!r}")
    return int(rel)


def beir_judgements(path: str | os.PathLike) -> Iterator[Judgement]:
    """The judgements of a BEIR qrels tsv: a `query-id<TAB>corpus-id<TAB>score` header, then one a line."""
    for i, (where, line) in enumerate(_lines(path)):
        fields = line.rstrip("\r\n").split("\t")
        if i == 0 and fields[0].strip().lower() in ("query-id", "query_id", "qid"):
            continue
        if len(fields) != 3:
            raise ValueError(f"{where}: expected query-id<TAB>corpus-id<TAB>score, got {line[:200]!r}")
        yield where, fields[0].strip(), fields[1].strip(), _relevance(where, fields[2].strip())


def trec_judgements(path: str | os.PathLike) -> Iterator[Judgement]:
    """The judgements of a TREC qrels file: `qid iteration docid rel`, whitespace separated."""
    for where, line in _lines(path):
        fields = line.split()
        if len(fields) != 4:
            raise ValueError(f"{where}: expected 'qid 0 docid rel', got {line[:200]!r}")
        yield where, fields[0], fields[2], _relevance(where, fields[3])


def to_qrels(judgements: Iterable[Judgement]) -> Qrels:
    """Judgements as {query id: {doc id: relevance}}; a repeated pair keeps its last relevance."""
    qrels: Qrels = {}
    for _, qid, docid, rel in judgements:
        qrels.setdefault(qid, {})[docid] = rel
    return qrels


def read_beir_qrels(path: str | os.PathLike) -> Qrels:
    """A BEIR qrels tsv (see `beir_judgements`)."""
    return to_qrels(beir_judgements(path))


def read_trec_qrels(path: str | os.PathLike) -> Qrels:
    """A TREC qrels file (see `trec_judgements`)."""
    return to_qrels(trec_judgements(path))


def read_qrels(path: str | os.PathLike) -> Qrels:
    """BEIR tsv when the first non-blank line is tab separated with three fields, else TREC."""
    first = next((line for _, line in _lines(path)), "")
    if len(first.rstrip("\r\n").split("\t")) == 3:
        return read_beir_qrels(path)
    return read_trec_qrels(path)
