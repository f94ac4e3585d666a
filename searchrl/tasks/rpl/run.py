"""Runs one Retrieval Program Learning program against an index and prints its result as one JSON object.

  python -m searchrl.tasks.rpl.run --index DIR PROGRAM_FILE

A sparse index (bm25, lucene) answers `sparse_retrieval`; a dense one (`searchrl.retrieval.is_dense`: dense,
or another kind registered as dense) answers `dense_retrieval` and `rerank` (by dense similarity); the other
retrieval functions fail with an "sdk error". The output holds "shown" (the hits shown, in order: id, score,
title, text), "error" (null, or the rule or limit the program broke and where) and the program's counters
("steps", "retrieval_calls", "docs_retrieved", "primitives", "seconds").
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from absl import flags

from searchrl import cli
from searchrl.tasks.rpl.sandbox import execute
from searchrl.tasks.rpl.sdk import RetrievalSDK


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    index = flags.DEFINE_string("index", None, "index dir (any kind)", required=True, flag_values=values)
    program_file = cli.parse_argument(values, argv, __doc__, "PROGRAM_FILE")

    from searchrl.retrieval import is_dense, load_retriever
    retriever = load_retriever(index.value)
    sdk = RetrievalSDK(dense=retriever) if is_dense(index.value) else RetrievalSDK(sparse=retriever)
    source = Path(program_file).read_text(encoding="utf-8", errors="replace")
    print(json.dumps(execute(source, sdk).to_dict(), ensure_ascii=False))


if __name__ == "__main__":
    cli.run(main)
