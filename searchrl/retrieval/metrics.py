"""Ranking metrics with trec_eval's definitions, and qrels readers (BEIR tsv, TREC).

Per query: `ranked` is the list of retrieved doc ids, best first; `qrels` maps doc id -> graded relevance
(> 0 is relevant). nDCG uses gain = rel and discount log2(rank + 1) (trec_eval / pytrec_eval `ndcg_cut`);
precision@k divides by k even when fewer were retrieved (trec_eval `P_k`).
"""
from __future__ import annotations

import math
import os
from typing import Callable, Mapping, Sequence

Qrels = dict[str, dict[str, int]]


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


def _add(qrels: Qrels, where: str, qid: str, docid: str, rel: str) -> None:
    try:
        qrels.setdefault(qid, {})[docid] = int(rel)
    except ValueError:
        raise ValueError(f"{where}: relevance must be an integer, got {rel!r}") from None


def read_beir_qrels(path: str | os.PathLike) -> Qrels:
    """BEIR qrels tsv: a `query-id<TAB>corpus-id<TAB>score` header, then one judgement a line."""
    qrels: Qrels = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("\t")
            if lineno == 1 and fields[0].strip().lower() in ("query-id", "query_id", "qid"):
                continue
            if len(fields) != 3:
                raise ValueError(f"{path}:{lineno}: expected query-id<TAB>corpus-id<TAB>score, got {line!r}")
            _add(qrels, f"{path}:{lineno}", fields[0].strip(), fields[1].strip(), fields[2].strip())
    return qrels


def read_trec_qrels(path: str | os.PathLike) -> Qrels:
    """TREC qrels: `qid iteration docid rel`, whitespace separated."""
    qrels: Qrels = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) != 4:
                raise ValueError(f"{path}:{lineno}: expected 'qid 0 docid rel', got {line!r}")
            _add(qrels, f"{path}:{lineno}", fields[0], fields[2], fields[3])
    return qrels


def read_qrels(path: str | os.PathLike) -> Qrels:
    """BEIR tsv when lines are tab separated with three fields, else TREC."""
    with open(path, encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), "")
    if len(first.rstrip("\n").split("\t")) == 3:
        return read_beir_qrels(path)
    return read_trec_qrels(path)
