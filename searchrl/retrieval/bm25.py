"""BM25 sparse retrieval on bm25s: Lucene-style IDF, k1=0.9 b=0.4 (pyserini's defaults), English stopwords and
Snowball stemming; the score matrix is saved as .npy files and loaded memory-mapped.

Index dir layout: `searchrl_index.json`, `corpus/` (a CorpusStore over the source JSONL), `bm25/` (bm25s).
"""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Sequence

import bm25s
import bm25s.tokenization
import Stemmer
from bm25s.stopwords import STOPWORDS_EN
from tqdm import tqdm

from searchrl.retrieval import BM25_B, BM25_K1
from searchrl.retrieval.corpus import CorpusStore, building, read_manifest, write_manifest
from searchrl.retrieval.types import Hit

TOKEN_PATTERN = r"(?u)\b\w\w+\b"  # bm25s' default splitter


def make_tokenizer(stemmer: str) -> bm25s.tokenization.Tokenizer:
    """The document tokenizer: lowercase, words of 2+ chars, English stopwords removed, stemmed."""
    return bm25s.tokenization.Tokenizer(lower=True, splitter=TOKEN_PATTERN, stopwords=list(STOPWORDS_EN),
                                        stemmer=Stemmer.Stemmer(stemmer).stemWord)


class BM25Retriever:
    """Batched BM25 search over an index dir built by `BM25Retriever.build`."""

    def __init__(self, index_dir: str | os.PathLike, n_threads: int = -1):
        """`n_threads`: bm25s retrieval threads for batches (-1: one per CPU, 0: the calling thread only)."""
        self.index_dir = Path(index_dir)
        self.manifest = read_manifest(index_dir)
        if self.manifest["kind"] != "bm25":
            raise ValueError(f"{index_dir}: a {self.manifest['kind']!r} index, not a bm25 index")
        self.store = CorpusStore.open(self.index_dir / "corpus")
        self.model = bm25s.BM25.load(self.index_dir / "bm25", mmap=True)
        self.n_threads = n_threads
        self._vocab: dict[str, int] = self.model.vocab_dict
        self._split = re.compile(TOKEN_PATTERN).findall
        self._stopwords = frozenset(STOPWORDS_EN)
        self._stemmer = Stemmer.Stemmer(self.manifest["stemmer"])
        self._stem_lock = threading.Lock()  # PyStemmer objects are not thread-safe

    @classmethod
    def build(cls, corpus_path: str | os.PathLike, out_dir: str | os.PathLike, k1: float = BM25_K1,
              b: float = BM25_B, stemmer: str = "english", skip_malformed: bool = False,
              show_progress: bool = True, n_threads: int = -1) -> "BM25Retriever":
        """Indexes a JSONL corpus into `out_dir`, streaming passages from the corpus store. The index is built
        next to `out_dir` and moved there at the end (see `corpus.building`). A corpus without a single
        indexable term (every word a stopword, one character long or punctuation) is an error."""
        if stemmer not in Stemmer.algorithms():
            raise ValueError(f"unknown stemmer {stemmer!r}; one of {Stemmer.algorithms()}")
        with building(out_dir) as out:
            store = CorpusStore.build(corpus_path, out / "corpus", skip_malformed, show_progress)
            if not len(store):
                raise ValueError(f"{corpus_path}: no passages to index")
            tokenizer = make_tokenizer(stemmer)
            stream = tokenizer.streaming_tokenize(store.texts(), update_vocab=True)
            token_ids = list(tqdm(stream, total=len(store), desc="tokenize", disable=not show_progress))
            if not set(tokenizer.get_vocab_dict()) - {""}:  # bm25s gives empty passages the term ""
                raise ValueError(f"{corpus_path}: no passage has an indexable term (all {len(store)} hold "
                                 "only stopwords, one-character words or punctuation)")
            model = bm25s.BM25(k1=k1, b=b, method="lucene")
            model.index((token_ids, tokenizer.get_vocab_dict()), show_progress=show_progress)
            model.save(out / "bm25", show_progress=show_progress)
            write_manifest(out, "bm25", store.source, k1=k1, b=b, stemmer=stemmer, stopwords="english",
                           count=len(store))
        return cls(out_dir, n_threads=n_threads)

    def query_token_ids(self, query: str) -> list[int]:
        """The query's vocabulary ids, tokenized exactly as documents were; unknown terms are dropped."""
        words = [w for w in self._split(query.lower()) if w not in self._stopwords]
        with self._stem_lock:
            stems = self._stemmer.stemWords(words)
        return [self._vocab[s] for s in stems if s in self._vocab]

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Top-k passages per query. Only passages sharing a term with the query are returned (as in
        Lucene), so a query of stopwords or unknown terms gets no hits."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        token_ids = [self.query_token_ids(q) for q in queries]
        live = [i for i, ids in enumerate(token_ids) if ids]
        results: list[list[Hit]] = [[] for _ in queries]
        if not live:
            return results
        docs, scores = self.model.retrieve([token_ids[i] for i in live], k=min(k, len(self.store)),
                                           n_threads=self.n_threads if len(live) > 1 else 0,
                                           show_progress=False, backend_selection="numpy")
        for row, i in enumerate(live):
            results[i] = [self.store.hit(int(d), s) for d, s in zip(docs[row], scores[row]) if s > 0]
        return results
