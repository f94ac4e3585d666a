"""Tiny indexes for the serving tests: two small BM25 indexes over different corpora, and one of 4,000
passages with one long one (deep retrieval)."""
import json
from pathlib import Path

import pytest

from searchrl.retrieval.bm25 import BM25Retriever

DEEP = 3000  # DeepRetrieval's retrieval depth
LONG_ID = "dlong"  # the deep index's one long (7.8 kB) passage


def bm25_index(directory: Path, rows: list[dict]) -> Path:
    """A BM25 index dir (directory/index) over `rows` written as a JSONL corpus."""
    directory.mkdir(parents=True, exist_ok=True)
    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    BM25Retriever.build(corpus, directory / "index", show_progress=False, n_threads=0)
    return directory / "index"


@pytest.fixture(scope="session")
def capitals(tmp_path_factory) -> Path:
    """Twelve passages on capitals."""
    rows = [{"id": f"c{i}", "contents": f"Country {i}\nThe capital of country {i} is city{i}, on "
                                        f"river{i % 3}."} for i in range(12)]
    return bm25_index(tmp_path_factory.mktemp("capitals"), rows)


@pytest.fixture(scope="session")
def rivers(tmp_path_factory) -> Path:
    """Another index: eight passages on rivers."""
    rows = [{"id": f"r{i}", "contents": f"River {i}\nriver{i} flows into sea{i % 2}."} for i in range(8)]
    return bm25_index(tmp_path_factory.mktemp("rivers"), rows)


@pytest.fixture(scope="session")
def deep(tmp_path_factory) -> Path:
    """4,000 passages that all match "alpha", one of them 7.8 kB long (issue 67's corpus)."""
    rows = [{"id": f"d{i}", "contents": f"alpha {'filler ' * (i % 50)}word{i}"} for i in range(3999)]
    rows.append({"id": LONG_ID, "contents": "Long\n" + "alpha " * 1300})
    return bm25_index(tmp_path_factory.mktemp("deep"), rows)
