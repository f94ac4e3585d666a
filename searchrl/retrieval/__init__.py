"""searchrl.retrieval: corpora, sparse (bm25s, Lucene) and dense retrieval behind one `Retriever` protocol,
a Search-R1-compatible server and client, metrics and CLIs. Backends import lazily: bm25s, pyserini (Java) and
the dense stack load only when an index of their kind is opened."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from searchrl.retrieval.corpus import MANIFEST, read_manifest, write_manifest
from searchrl.retrieval.types import Hit, Retriever

__all__ = ["Hit", "Retriever", "MANIFEST", "read_manifest", "write_manifest", "index_kind", "load_retriever",
           "make_retriever", "KINDS", "BM25_K1", "BM25_B"]

KINDS = ("bm25", "lucene", "dense")
BM25_K1, BM25_B = 0.9, 0.4  # pyserini / Anserini defaults, shared by both BM25 backends



def index_kind(index_dir: str | os.PathLike) -> str:
    """The kind named in an index dir's manifest; a bare Lucene index (segments_* files, no manifest) is
    "lucene"."""
    path = Path(index_dir)
    if not (path / MANIFEST).is_file() and any(path.glob("segments_*")):
        return "lucene"
    kind = read_manifest(path)["kind"]
    if kind not in KINDS:
        raise ValueError(f"{path / MANIFEST}: unknown index kind {kind!r}; expected one of {KINDS}")
    return kind


def load_retriever(index_dir: str | os.PathLike, **options: Any) -> Retriever:
    """Opens any searchrl index dir; `options` go to the backend's constructor (e.g. n_threads for bm25 and
    lucene)."""
    kind = index_kind(index_dir)
    if kind == "bm25":
        from searchrl.retrieval.bm25 import BM25Retriever
        return BM25Retriever(index_dir, **options)
    if kind == "lucene":
        from searchrl.retrieval.lucene import LuceneRetriever
        return LuceneRetriever(index_dir, **options)
    from searchrl.retrieval.dense import DenseRetriever
    return DenseRetriever.load(index_dir, **options)


def make_retriever(config: Mapping[str, Any]) -> Retriever:
    """A retriever from a config (ml_collections ConfigDict or dict):
    {"kind": "local", "index_dir": str, "options": {...}} or
    {"kind": "remote", "url": str, "timeout_s": 30.0, "retries": 3, "batch_size": 256}."""
    kind = config.get("kind", "local")
    if kind == "local":
        if not config.get("index_dir"):
            raise ValueError('retrieval config: kind "local" needs "index_dir"')
        return load_retriever(config["index_dir"], **dict(config.get("options") or {}))
    if kind == "remote":
        if not config.get("url"):
            raise ValueError('retrieval config: kind "remote" needs "url"')
        from searchrl.retrieval.client import RemoteRetriever
        return RemoteRetriever(config["url"], timeout=float(config.get("timeout_s", 30.0)),
                               retries=int(config.get("retries", 3)),
                               batch_size=int(config.get("batch_size", 256)))
    raise ValueError(f'retrieval config: "kind" must be "local" or "remote", got {kind!r}')
