"""Build a retrieval index from a JSONL corpus (FlashRAG {"id", "contents"} or BEIR {"_id", "title", "text"}).

  python -m searchrl.retrieval.index --kind bm25   --corpus C.jsonl --out DIR [--k1 0.9 --b 0.4]
  python -m searchrl.retrieval.index --kind lucene --corpus C.jsonl --out DIR [--threads 4]
  python -m searchrl.retrieval.index --kind dense  --corpus C.jsonl --out DIR --encoder ENC [--factory Flat]
      [--pooling mean|cls] [--no_normalize] [--query_prefix "query: " --passage_prefix "passage: "] (e5)

Every index dir gets a searchrl_index.json manifest; `searchrl.retrieval.load_retriever(DIR)` opens any kind.
The index is built in a temporary dir next to --out and moved there once complete: a failed build leaves
nothing behind and an index already at --out as it was.
"""
from __future__ import annotations

import json
import time
from typing import Sequence

from absl import flags

from searchrl import cli
from searchrl.retrieval import BM25_B, BM25_K1, KINDS, read_manifest


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    kind = flags.DEFINE_enum("kind", None, KINDS, "index kind", required=True, flag_values=values)
    corpus = flags.DEFINE_string("corpus", None, "corpus JSONL", required=True, flag_values=values)
    out = flags.DEFINE_string("out", None, "index dir to write", required=True, flag_values=values)
    k1 = flags.DEFINE_float("k1", BM25_K1, "BM25 k1 (bm25, lucene)", lower_bound=0, flag_values=values)
    b = flags.DEFINE_float("b", BM25_B, "BM25 b (bm25, lucene)", lower_bound=0, upper_bound=1,
                           flag_values=values)
    stemmer = flags.DEFINE_string("stemmer", "english", "PyStemmer algorithm (bm25)", flag_values=values)
    threads = flags.DEFINE_integer("threads", -1, "indexing threads, -1: one per CPU (lucene)",
                                   flag_values=values)
    skip_malformed = flags.DEFINE_boolean("skip_malformed", False, "skip and count malformed corpus lines",
                                          flag_values=values)
    encoder = flags.DEFINE_string("encoder", None, "local encoder dir (dense)", flag_values=values)
    factory = flags.DEFINE_string("factory", "Flat", "FAISS index factory string (dense)",
                                  flag_values=values)
    pooling = flags.DEFINE_enum("pooling", "mean", ("mean", "cls"), "encoder pooling (dense)",
                                flag_values=values)
    no_normalize = flags.DEFINE_boolean("no_normalize", False,
                                        "keep raw embeddings instead of L2-normalising them (dense)",
                                        flag_values=values)
    query_prefix = flags.DEFINE_string(
        "query_prefix", "", 'prepended to queries, e.g. "query: " for e5 (dense)', flag_values=values)
    passage_prefix = flags.DEFINE_string(
        "passage_prefix", "", 'prepended to passages, e.g. "passage: " (dense)', flag_values=values)
    max_length = flags.DEFINE_integer("max_length", 256, "encoder max tokens (dense)", lower_bound=1,
                                      flag_values=values)
    batch_size = flags.DEFINE_integer("batch_size", 64, "encoder batch size (dense)", lower_bound=1,
                                      flag_values=values)
    flags.register_validator("threads", lambda n: n == -1 or n >= 1,
                             "--threads must be -1 (one per CPU) or a positive integer", flag_values=values)
    flags.register_multi_flags_validator(["kind", "encoder"],
                                         lambda f: f["kind"] != "dense" or bool(f["encoder"]),
                                         "--kind dense needs --encoder", flag_values=values)
    cli.parse(values, argv, __doc__)

    start = time.perf_counter()
    if kind.value == "bm25":
        from searchrl.retrieval.bm25 import BM25Retriever
        BM25Retriever.build(corpus.value, out.value, k1=k1.value, b=b.value, stemmer=stemmer.value,
                            skip_malformed=skip_malformed.value)
    elif kind.value == "lucene":
        from searchrl.retrieval.lucene import LuceneRetriever
        LuceneRetriever.build(corpus.value, out.value, k1=k1.value, b=b.value, n_threads=threads.value,
                              skip_malformed=skip_malformed.value)
    else:
        from searchrl.retrieval.dense import DenseRetriever
        DenseRetriever.build(corpus.value, out.value, encoder.value, factory=factory.value,
                             pooling=pooling.value, normalize=not no_normalize.value,
                             query_prefix=query_prefix.value, passage_prefix=passage_prefix.value,
                             max_length=max_length.value, batch_size=batch_size.value,
                             skip_malformed=skip_malformed.value)
    print(json.dumps({"kind": kind.value, "out": out.value, "passages": read_manifest(out.value).get("count"),
                      "seconds": round(time.perf_counter() - start, 2)}))


if __name__ == "__main__":
    cli.run(main)
