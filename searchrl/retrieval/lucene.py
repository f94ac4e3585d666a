"""Lucene BM25 through pyserini 0.22.1's Anserini jar (runs on Java 17), for users with Lucene indexes.

Indexing runs Anserini's IndexCollection (the indexer behind `python -m pyserini.index.lucene`) in a child JVM
over a JsonCollection of the checked, normalized corpus ({"id", "contents"} rows), storing each raw row in the
index. Search runs in-process on Anserini's SimpleSearcher (the class
pyserini's LuceneSearcher wraps) with BM25 k1=0.9 b=0.4 and multi-threaded `batch_search`. pyserini's Python
search package is not imported: it pulls torch, onnxruntime and pandas in at import time, none of which the
Lucene path uses; only `pyserini.pyclass` (pyjnius + the bundled jar) is.

pyserini and pyjnius are optional (requirements-lucene.txt) and imported lazily, so the rest of searchrl works
without Java. Index dir layout: `searchrl_index.json` and `lucene/` (the Lucene index). Passages come from the
raw rows stored in the index, so a bare Lucene index dir built with -storeRaw (e.g. pyserini's prebuilt
wikipedia-dpr-100w) loads as well.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Sequence

from searchrl.retrieval import BM25_B, BM25_K1
from searchrl.retrieval.corpus import MANIFEST, CorpusScan, building, join_contents, parse_line, \
    read_manifest, split_contents, write_manifest
from searchrl.retrieval.types import Hit

MIN_JAVA = 17
INSTALL_HINT = "pip install -r requirements-lucene.txt && pip install --no-deps pyserini==0.22.1"


def detect_java_home() -> str | None:
    """JAVA_HOME, or the JDK the `java` on PATH belongs to (set into the environment for pyjnius)."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    if java is None:
        return None
    home = str(Path(os.path.realpath(java)).parent.parent)
    os.environ["JAVA_HOME"] = home
    return home


detect_java_home()


def java_major_version(java_home: str | os.PathLike) -> int:
    """The major version of the JDK at `java_home`, read from its `release` file (e.g. 17 for "17.0.15")."""
    release = Path(java_home) / "release"
    match = re.search(r'JAVA_VERSION="(\d+)(?:\.(\d+))?', release.read_text()) if release.is_file() else None
    if match is None:
        raise RuntimeError(f"cannot tell the Java version of JAVA_HOME={java_home} (no readable {release})")
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    return minor if major == 1 else major  # "1.8.0" is Java 8


def require_java() -> Path:
    """The `java` binary of a Java 17+ JDK; a clear error when there is none."""
    home = detect_java_home()
    if home is None:
        raise RuntimeError(f"the Lucene backend needs Java {MIN_JAVA}+: no `java` on PATH and JAVA_HOME is "
                           "unset (Debian: apt-get install openjdk-17-jdk-headless)")
    version = java_major_version(home)
    if version < MIN_JAVA:
        raise RuntimeError(f"the Lucene backend needs Java {MIN_JAVA}+, JAVA_HOME={home} is Java {version}")
    return Path(home) / "bin" / "java"


def anserini_jar() -> Path:
    """The Anserini fat jar that pyserini ships (or the one in $ANSERINI_CLASSPATH, as pyserini honours)."""
    import importlib.util
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the Lucene backend needs pyserini 0.22.1: {INSTALL_HINT}")
    jar_dir = os.environ.get("ANSERINI_CLASSPATH") or os.path.join(spec.submodule_search_locations[0],
                                                                   "resources", "jars")
    jars = sorted(Path(jar_dir).glob("anserini-*-fatjar.jar"))
    if not jars:
        raise FileNotFoundError(f"no anserini-*-fatjar.jar in {jar_dir}")
    return jars[-1]


def _threads(n_threads: int) -> int:
    """-1 means one thread per CPU."""
    return (os.cpu_count() or 1) if n_threads == -1 else n_threads


def _autoclass(name: str) -> Any:
    """A Java class through pyserini's classpath setup; starts the JVM on first use."""
    require_java()
    try:
        from pyserini.pyclass import autoclass
    except ImportError as e:
        raise ImportError(f"the Lucene backend needs pyserini 0.22.1 and pyjnius ({e}): "
                          f"{INSTALL_HINT}") from e
    return autoclass(name)


class LuceneRetriever:
    """Batched BM25 search on a Lucene index (built by `LuceneRetriever.build`, or a bare prebuilt one)."""

    def __init__(self, index_dir: str | os.PathLike, n_threads: int = -1, k1: float = BM25_K1,
                 b: float = BM25_B):
        """`n_threads`: batch_search threads (-1: one per CPU). k1 and b apply to bare indexes; ours record
        theirs in the manifest."""
        self.index_dir = Path(index_dir)
        self.n_threads = _threads(n_threads)
        lucene_dir = self.index_dir
        if (self.index_dir / MANIFEST).is_file():
            manifest = read_manifest(self.index_dir)
            if manifest["kind"] != "lucene":
                raise ValueError(f"{index_dir}: a {manifest['kind']!r} index, not a lucene index")
            k1, b = manifest["k1"], manifest["b"]
            lucene_dir = self.index_dir / "lucene"
        if not any(lucene_dir.glob("segments_*")):
            raise FileNotFoundError(f"not a Lucene index (no segments_* file): {lucene_dir}")
        self._searcher = _autoclass("io.anserini.search.SimpleSearcher")(str(lucene_dir))
        self._searcher.set_bm25(float(k1), float(b))
        self._array_list = _autoclass("java.util.ArrayList")

    def __len__(self) -> int:
        return int(self._searcher.get_total_num_docs())

    @classmethod
    def build(cls, corpus_path: str | os.PathLike, out_dir: str | os.PathLike, k1: float = BM25_K1,
              b: float = BM25_B, n_threads: int = -1, skip_malformed: bool = False, show_progress: bool = True
              ) -> "LuceneRetriever":
        """Indexes a JSONL corpus (any format `CorpusScan` reads) into `out_dir` with `n_threads` indexing
        (and later search) threads. Each passage is stored as {"id", "contents"}, its `contents` as in the
        corpus. The index is built next to `out_dir` and moved there at the end (see `corpus.building`)."""
        java = require_java()
        with building(out_dir) as out:
            scan = CorpusScan(corpus_path, skip_malformed, show_progress)
            collection = out / "collection"
            collection.mkdir()
            count = 0
            with open(collection / "docs.jsonl", "w", encoding="utf-8") as f:
                for _, doc_id, title, text in scan:
                    row = {"id": doc_id, "contents": join_contents(title, text)}
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    count += 1
            if not count:
                raise ValueError(f"{corpus_path}: no passages to index")
            cmd = [str(java), "-cp", str(anserini_jar()), "io.anserini.index.IndexCollection",
                   "-collection", "JsonCollection", "-generator", "DefaultLuceneDocumentGenerator",
                   "-input", str(collection), "-index", str(out / "lucene"),
                   "-threads", str(_threads(n_threads)), "-storeRaw"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            shutil.rmtree(collection)
            if proc.returncode != 0:
                raise RuntimeError(f"Lucene indexing of {corpus_path} failed (exit {proc.returncode}):\n"
                                   f"{(proc.stdout + proc.stderr)[-4000:]}")
            write_manifest(out, "lucene", scan.path, k1=k1, b=b, count=count, skipped=scan.skipped)
            indexed = len(cls(out, n_threads=n_threads))
            if indexed != count:
                raise RuntimeError(f"Lucene indexed {indexed} of {count} passages of {corpus_path}")
        return cls(out_dir, n_threads=n_threads)

    @staticmethod
    def _hit(result: Any) -> Hit:
        """A SimpleSearcher result as a Hit: from the raw JSON row stored in the index, else from its stored
        contents or raw text (title on the first line, as in FlashRAG corpora)."""
        try:
            doc_id, title, text = parse_line(result.raw or "")
        except ValueError:
            doc_id, (title, text) = result.docid, split_contents(result.contents or result.raw or "")
        return Hit(id=doc_id, score=float(result.score), title=title, text=text)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Top-k passages per query (Anserini's bag-of-words BM25 query; no query syntax is parsed)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        texts, qids = self._array_list(), self._array_list()
        for i, query in enumerate(queries):
            texts.add(query)
            qids.add(str(i))
        results = self._searcher.batch_search(texts, qids, int(k), int(self.n_threads))
        return [[self._hit(r) for r in (results.get(str(i)) or [])] for i in range(len(queries))]
