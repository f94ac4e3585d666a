"""Local index kinds by name (an index dir's manifest "kind"; `python -m searchrl.retrieval.index --kind`).

An `IndexKind` says how to build its index dir from a corpus, how to open one, which flags of the index CLI
its build takes, and whether it is dense (searched by embedding: RPL's `dense_retrieval`). Its backend is
imported when an index of its kind is built or opened. A new kind is its module and one registration here:

    INDEX_KINDS.register("splade")(IndexKind(_build_splade, _load_splade, flags=(...), dense=False))
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from absl import flags

from searchrl.registry import Registry
from searchrl.retrieval.types import Retriever

BM25_K1, BM25_B = 0.9, 0.4  # pyserini / Anserini defaults, shared by both BM25 backends


@dataclasses.dataclass(frozen=True)
class BuildFlag:
    """A flag of the index CLI that a kind's build takes, as the keyword argument `name`. Kinds share a flag
    by declaring the same `BuildFlag`."""

    name: str
    define: Callable[..., Any]  # an absl DEFINE_* function
    default: Any
    help: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # DEFINE_*'s other keywords
    required: bool = False  # the kind's build needs it set
    check: tuple[Callable[[Any], bool], str] | None = None  # a validator of its value, and its message


@dataclasses.dataclass(frozen=True)
class IndexKind:
    """One local index kind. `build(corpus_path, out_dir, skip_malformed=..., **its flags)` writes an index
    dir (with a manifest naming the kind) and returns its retriever; `load(index_dir, **options)` opens one.
    `bare` recognises an index dir of this kind that has no manifest (a prebuilt one)."""

    build: Callable[..., Retriever]
    load: Callable[..., Retriever]
    flags: tuple[BuildFlag, ...] = ()
    dense: bool = False
    bare: Callable[[Path], bool] | None = None


INDEX_KINDS: Registry[IndexKind] = Registry("index kind", "--kind")

K1 = BuildFlag("k1", flags.DEFINE_float, BM25_K1, "BM25 k1", {"lower_bound": 0})
B = BuildFlag("b", flags.DEFINE_float, BM25_B, "BM25 b", {"lower_bound": 0, "upper_bound": 1})


def _build_bm25(corpus: str | os.PathLike, out: str | os.PathLike, **options: Any) -> Retriever:
    from searchrl.retrieval.bm25 import BM25Retriever
    return BM25Retriever.build(corpus, out, **options)


def _load_bm25(index_dir: str | os.PathLike, **options: Any) -> Retriever:
    from searchrl.retrieval.bm25 import BM25Retriever
    return BM25Retriever(index_dir, **options)


INDEX_KINDS.register("bm25")(IndexKind(_build_bm25, _load_bm25, flags=(
    K1, B, BuildFlag("stemmer", flags.DEFINE_string, "english", "PyStemmer algorithm"))))


def _build_lucene(corpus: str | os.PathLike, out: str | os.PathLike, *, skip_malformed: bool, k1: float,
                  b: float, threads: int) -> Retriever:
    from searchrl.retrieval.lucene import LuceneRetriever
    return LuceneRetriever.build(corpus, out, k1=k1, b=b, n_threads=threads, skip_malformed=skip_malformed)


def _load_lucene(index_dir: str | os.PathLike, **options: Any) -> Retriever:
    from searchrl.retrieval.lucene import LuceneRetriever
    return LuceneRetriever(index_dir, **options)


INDEX_KINDS.register("lucene")(IndexKind(_build_lucene, _load_lucene, flags=(
    K1, B, BuildFlag("threads", flags.DEFINE_integer, -1, "indexing threads, -1: one per CPU",
                     check=(lambda n: n == -1 or n >= 1,
                            "--threads must be -1 (one per CPU) or a positive integer"))),
    bare=lambda path: any(path.glob("segments_*"))))


def _build_dense(corpus: str | os.PathLike, out: str | os.PathLike, *, skip_malformed: bool, encoder: str,
                 no_normalize: bool, **options: Any) -> Retriever:
    from searchrl.retrieval.dense import DenseRetriever
    return DenseRetriever.build(corpus, out, encoder, normalize=not no_normalize,
                                skip_malformed=skip_malformed, **options)


def _load_dense(index_dir: str | os.PathLike, **options: Any) -> Retriever:
    from searchrl.retrieval.dense import DenseRetriever
    return DenseRetriever.load(index_dir, **options)


INDEX_KINDS.register("dense")(IndexKind(_build_dense, _load_dense, dense=True, flags=(
    BuildFlag("encoder", flags.DEFINE_string, None, "local encoder dir", required=True),
    BuildFlag("factory", flags.DEFINE_string, "Flat", "FAISS index factory string"),
    BuildFlag("pooling", flags.DEFINE_enum, "mean", "encoder pooling", {"enum_values": ("mean", "cls")}),
    BuildFlag("no_normalize", flags.DEFINE_boolean, False,
              "keep raw embeddings instead of L2-normalising them"),
    BuildFlag("query_prefix", flags.DEFINE_string, "", 'prepended to queries, e.g. "query: " for e5'),
    BuildFlag("passage_prefix", flags.DEFINE_string, "", 'prepended to passages, e.g. "passage: "'),
    BuildFlag("max_length", flags.DEFINE_integer, 256, "encoder max tokens", {"lower_bound": 1}),
    BuildFlag("batch_size", flags.DEFINE_integer, 64, "encoder batch size", {"lower_bound": 1}))))
