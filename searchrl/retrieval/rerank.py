"""Reranking: a BERT cross-encoder (query [SEP] passage -> relevance logit, `searchrl.models.bert`), and a
dense-similarity fallback for setups without one. Both expose `rerank(query, docs, top_k) -> list[Hit]` with
new scores."""
from __future__ import annotations

import functools
import logging
import os
import threading
from pathlib import Path
from typing import Any, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from searchrl.models import BertConfig, bert, load_bert
from searchrl.retrieval.encoder import (DenseEncoder, check_sizes, check_texts, length_buckets, resolve_dtype,
                                        run_batched)
from searchrl.retrieval.types import Hit

log = logging.getLogger(__name__)


class Reranker(Protocol):
    """Anything that re-scores a candidate list for a query."""

    def rerank(self, query: str, docs: Sequence[Hit], top_k: int | None = None) -> list[Hit]:
        """`docs` re-scored for `query`, best first, the first `top_k` (all when None)."""
        ...


def reorder(docs: Sequence[Hit], scores: np.ndarray, top_k: int | None) -> list[Hit]:
    """Docs with their new scores, sorted by descending score (stable: ties keep the input order)."""
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    order = np.argsort(-scores, kind="stable")[:top_k]
    return [Hit(docs[i].id, float(scores[i]), docs[i].title, docs[i].text) for i in order]


@functools.partial(jax.jit, static_argnames=("config",))
def _relevance(params: dict, batch: dict[str, jax.Array], *, config: BertConfig) -> jax.Array:
    """One score per pair: the logit when there is one label, else the logit of label 1 ("relevant")."""
    log.info("compiling the cross-encoder for input shape %s", batch["input_ids"].shape)  # once per shape
    logits = bert.classify(config, params, batch["input_ids"], batch["token_type_ids"],
                           batch["attention_mask"])
    return logits[:, 0] if config.num_labels == 1 else logits[:, 1]


class CrossEncoderReranker:
    """Scores (query, passage) pairs jointly with a BERT cross-encoder from a Hugging Face directory; it
    computes in its params' dtype."""

    def __init__(self, params: dict, config: BertConfig, tokenizer: Any, *, max_length: int = 512,
                 batch_size: int = 32):
        check_sizes(config, max_length, batch_size)
        self.config, self.tokenizer = config, tokenizer
        self._tokenizer_lock = threading.Lock()
        self.max_length, self.batch_size = max_length, batch_size
        self.params = jax.device_put(params)
        self._score = functools.partial(_relevance, self.params, config=config)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, max_length: int = 512, batch_size: int = 32,
                        dtype: str | None = None) -> "CrossEncoderReranker":
        """Loads a BertForSequenceClassification checkpoint (config.json, weights in `dtype`: `resolve_dtype`,
        tokenizer). `max_length` (tokens of the pair) is capped at the model's max_position_embeddings."""
        from transformers import AutoTokenizer
        path = Path(path)
        config, params = load_bert(path, jnp.dtype(resolve_dtype(dtype)), classifier=True)
        return cls(params, config, AutoTokenizer.from_pretrained(str(path)),
                   max_length=min(max_length, config.max_position_embeddings), batch_size=batch_size)

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """Relevance of each passage to the query, float32 [N]. Long pairs are truncated longest-first."""
        passages = check_texts(passages, "CrossEncoderReranker.score")
        check_texts([query], "CrossEncoderReranker.score query")
        if not passages:
            return np.zeros((0,), np.float32)
        with self._tokenizer_lock:  # fast tokenizers fail when one instance is used from two threads
            features = self.tokenizer([query] * len(passages), passages, truncation=True,
                                      max_length=self.max_length, return_attention_mask=False,
                                      return_token_type_ids=True)
        return run_batched(self._score, features, self.batch_size, length_buckets(self.max_length),
                           self.tokenizer.pad_token_id or 0)

    def rerank(self, query: str, docs: Sequence[Hit], top_k: int | None = None) -> list[Hit]:
        return reorder(docs, self.score(query, [d.contents for d in docs]), top_k)


class DenseSimilarityReranker:
    """The fallback reranker: cosine similarity of dense embeddings of the query and each passage."""

    def __init__(self, encoder: DenseEncoder):
        self.encoder = encoder

    def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
        vectors = np.concatenate([self.encoder.encode_queries([check_texts([query], "rerank query")[0]]),
                                  self.encoder.encode_passages(passages)])
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors[1:] @ vectors[0]

    def rerank(self, query: str, docs: Sequence[Hit], top_k: int | None = None) -> list[Hit]:
        return reorder(docs, self.score(query, [d.contents for d in docs]), top_k)
