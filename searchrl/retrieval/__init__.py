"""searchrl.retrieval: corpora, sparse (bm25s, Lucene) and dense retrieval behind one `Retriever` protocol,
a client of Search-R1's `/retrieve` service (`remote`; the server is `searchrl.serving`), metrics and CLIs.
Local index kinds are `INDEX_KINDS` (`kinds`); backends import lazily: bm25s, pyserini (Java) and the dense
stack load only when an index of their kind is built or opened."""
from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any, Callable

from searchrl import cli
from searchrl.configlib import group, ranged
from searchrl.registry import Registry
from searchrl.retrieval import record
from searchrl.retrieval.corpus import MANIFEST, read_manifest, write_manifest
from searchrl.retrieval.kinds import BM25_B, BM25_K1, INDEX_KINDS
from searchrl.retrieval.types import Hit, Retriever

__all__ = ["Hit", "Retriever", "RetrievalConfig", "MANIFEST", "read_manifest", "write_manifest", "index_kind",
           "is_dense", "index_fingerprint", "load_retriever", "make_retriever", "RETRIEVERS", "RetrieverKind",
           "register_retriever", "options_group", "INDEX_KINDS", "BM25_K1", "BM25_B"]


@group
class RetrievalConfig:
    """`config.retrieval`: a local index dir, a Search-R1 `/retrieve` server, or a retriever a task registers.
    `options` are the kind's own: an instance of the group its `RetrieverKind` declares (which
    `searchrl.run_config.parse` makes them into), or else a dict (local: the index backend's options)."""

    kind: str = "local"  # a name in RETRIEVERS: local, remote, or one a task registers
    index_dir: str = ""  # local: any searchrl index dir (its manifest names the backend)
    options: Any = dataclasses.field(default_factory=dict)  # the kind's options (see the class docstring)
    url: str = ""  # remote: http://HOST:PORT/retrieve, or replicas' urls joined by commas (a batch is spread
    #   over them); a kind a task registers: its service's base URL ("": the real one)
    timeout_s: float = ranged(30.0, "(0, inf)")
    retries: int = ranged(3, "[0, inf)")  # tries after the first
    batch_size: int = ranged(256, "[1, inf)")  # remote: queries per request
    # remote: queries x topk per request (the server's --max_hits)
    max_hits: int = ranged(100_000, "[1, inf)")
    index_fingerprint: str = ""  # remote: refuse servers whose /health names another index ("": any)
    # Recorded retrieval (`searchrl.retrieval.record`): append every search (query, results, time) to this
    # JSONL record; or answer every search from one, with no index and no network ("": neither).
    record: str = ""
    replay: str = ""

    def __post_init__(self):
        declared = options_group(self.kind)
        if declared is not None and not isinstance(self.options, declared):
            raise TypeError(f"options of retriever kind {self.kind!r} must be a {declared.__name__}, got "
                            f"{type(self.options).__name__}")


def existing_index(index_dir: str | os.PathLike) -> Path:
    """`index_dir` as a Path; a `MissingInput` naming how to make it when it is not a directory."""
    path = Path(index_dir)
    if not path.is_dir():
        raise cli.MissingInput("index dir", path, cli.make_index(path))
    return path


def index_kind(index_dir: str | os.PathLike) -> str:
    """The kind (a name in INDEX_KINDS) named in an index dir's manifest; without a manifest, the kind that
    recognises it as its own bare index (a prebuilt Lucene index: "lucene")."""
    path = existing_index(index_dir)
    if not (path / MANIFEST).is_file():
        for name in INDEX_KINDS:
            bare = INDEX_KINDS.get(name).bare
            if bare is not None and bare(path):
                return name
    kind = read_manifest(path)["kind"]
    if kind not in INDEX_KINDS:
        raise ValueError(f"{path / MANIFEST}: unknown index kind {kind!r}; known: {INDEX_KINDS.names()}")
    return kind


def is_dense(index_dir: str | os.PathLike) -> bool:
    """Whether an index dir is of a dense kind (searched by embedding)."""
    return INDEX_KINDS.get(index_kind(index_dir)).dense


FINGERPRINT_SAMPLE = 1 << 16  # bytes read from each end of each file


def index_fingerprint(index_dir: str | os.PathLike) -> str:
    """A short hash naming an index dir's contents, cheap on any size: every file's relative path, size and
    first and last 64 KiB, and so for the corpus file the manifest names outside the dir. Copies of one index
    at the same path (replicas on other hosts) agree, whatever their file times; a rebuild over another
    corpus, or with another encoder or factory, differs."""
    path = existing_index(index_dir)
    files = sorted((f.relative_to(path).as_posix(), f) for f in path.rglob("*") if f.is_file())
    if (path / MANIFEST).is_file():
        corpus = Path(read_manifest(path).get("corpus", ""))
        if corpus.is_file() and path.resolve() not in corpus.resolve().parents:
            files.append(("<corpus>", corpus))
    digest = hashlib.sha256()
    for name, file in files:
        size = file.stat().st_size
        with open(file, "rb") as f:
            head = f.read(FINGERPRINT_SAMPLE)
            f.seek(max(size - FINGERPRINT_SAMPLE, len(head)))
            tail = f.read()
        digest.update(f"{name}\0{size}\0".encode() + head + tail)
    return digest.hexdigest()[:16]


def load_retriever(index_dir: str | os.PathLike, **options: Any) -> Retriever:
    """Opens any searchrl index dir with its kind's `load`; `options` go to the backend (e.g. n_threads for
    bm25 and lucene)."""
    return INDEX_KINDS.get(index_kind(index_dir)).load(index_dir, **options)


Build = Callable[[RetrievalConfig], Retriever]


@dataclasses.dataclass(frozen=True)
class RetrieverKind:
    """An entry of RETRIEVERS: `build` makes the retriever from `config.retrieval`; `options`, when not None,
    is the config group (`searchrl.configlib.group`) its `config.retrieval.options` are made into."""

    build: Build
    options: type | None = None


RETRIEVERS: Registry[RetrieverKind] = Registry("retriever kind", "config.retrieval.kind")


def register_retriever(name: str, options: type | None = None) -> Callable[[Build], Build]:
    """A decorator registering its target as the `build` of retriever kind `name`, whose
    `config.retrieval.options` are the group `options` (None: a dict the target reads)."""
    def add(build: Build) -> Build:
        RETRIEVERS.register(name)(RetrieverKind(build, options))
        return build
    return add


def options_group(kind: str) -> type | None:
    """The group retriever kind `kind` declares for `config.retrieval.options`; None when it declares none or
    is not registered (yet: a task registers its kinds when it is imported)."""
    return RETRIEVERS.get(kind).options if kind in RETRIEVERS else None


@register_retriever("local")
def local_retriever(config: RetrievalConfig) -> Retriever:
    """Any searchrl index dir (`load_retriever`)."""
    if not config.index_dir:
        raise ValueError('retrieval config: kind "local" needs "index_dir"')
    return load_retriever(config.index_dir, **config.options)


@register_retriever("remote")
def remote_retriever(config: RetrievalConfig) -> Retriever:
    """A Search-R1 `/retrieve` server (`searchrl.retrieval.remote`)."""
    if not config.url:
        raise ValueError('retrieval config: kind "remote" needs "url"')
    from searchrl.retrieval.remote import RemoteRetriever
    return RemoteRetriever(config)


def make_retriever(config: RetrievalConfig) -> Retriever:
    """The retriever `config.retrieval` describes: its kind names an entry of RETRIEVERS (tasks register
    theirs), recording its searches to `config.record` or replaced by the replay of `config.replay`."""
    if config.record and config.replay:
        raise ValueError(f"config.retrieval: record={config.record!r} and replay={config.replay!r}: give one")
    build = RETRIEVERS.get(config.kind).build
    if config.replay:
        return record.ReplayRetriever(config.replay, config.kind)
    retriever = build(config)
    if config.record:
        return record.RecordingRetriever(retriever, config.record, config.kind, config.url or config.index_dir)
    return retriever
