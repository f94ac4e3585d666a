"""Import a FAISS index built elsewhere, with the JSONL corpus it was built on, as a searchrl dense index
without re-encoding. Search-R1's prebuilt e5 index over wiki-18 (e5_Flat.index and wiki-18.jsonl, fetched by
`python -m searchrl.data.download wiki18`) becomes a directory that `DenseRetriever.load` opens.

  python -m searchrl.retrieval.import_faiss --index e5_Flat.index --corpus wiki-18.jsonl \\
      --encoder /data/models/e5-base-v2 --out /data/indexes/wiki18_e5_flat [--check_passages 8]
      [--pooling mean|cls] [--no_normalize] [--query_prefix "query: "] [--passage_prefix "passage: "]
      [--max_length 256]

Row i of the index must be the embedding of passage i of the corpus, in file order (blank lines aside), as
Search-R1's search_r1/search/index_builder.py writes it. The encoder settings default to the ones Search-R1
built and serves its e5 index with (build_index.sh, index_builder.py, retrieval_server.py):
intfloat/e5-base-v2 (--encoder is a local copy of it), mean pooling over the attention mask, L2-normalised,
"query: " and "passage: " prefixes (its e5 branch), at most 256 tokens, a Flat inner-product index. The
manifest records them, so the index searches as Search-R1's server does.

Checked, each failure a clear error before anything is written: the index scores by inner product, holds one
vector per corpus passage and has the encoder's dimension; and the encoder reproduces the stored vectors of
`check_passages` passages spread over the corpus (cosine >= min_cosine), so that another model, pooling or
prefix fails here instead of retrieving badly. Search-R1 encoded in float16; the default threshold leaves
room for that.

The index dir gets a private copy of the index file: a reflink (a copy-on-write clone, instant and taking no
space, where the filesystem makes them: btrfs, XFS, ...) or else a byte copy, checked to fit first. Never a
link: the searcher memory-maps its index, and Search-R1's instructions rebuild the file in place
(`cat part_* > e5_Flat.index`), which would pull the pages from under a searcher sharing it (SIGBUS). The
corpus store points at the corpus JSONL where it is, as `DenseRetriever.build`'s does.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import time
import types
from pathlib import Path
from typing import Any, Mapping, Sequence

import faiss
import numpy as np
from absl import flags

from searchrl import cli
from searchrl.retrieval.corpus import CorpusStore, building, write_manifest
from searchrl.retrieval.dense import INDEX_FILE, DenseRetriever, read_index
from searchrl.retrieval.encoder import DenseEncoder

log = logging.getLogger(__name__)

BATCH_SIZE = 64  # passages encoded at once (the vector check's)
FICLONE = 0x40049409  # Linux's ioctl that clones a file's blocks (a reflink)
# Search-R1's e5 settings (search_r1/search/index_builder.py, retrieval_server.py).
SEARCH_R1_E5 = types.MappingProxyType({"pooling": "mean", "normalize": True, "query_prefix": "query: ",
                                      "passage_prefix": "passage: ", "max_length": 256})


def check_index(index: faiss.Index, where: str, encoder: DenseEncoder) -> None:
    """Raises unless the index scores by inner product, in the encoder's dimension."""
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ValueError(f"{where}: the index does not score by inner product (FAISS metric "
                         f"{index.metric_type}); searchrl's dense indexes do")
    if index.d != encoder.dim:
        raise ValueError(f"{where}: vectors of dimension {index.d}, but the encoder {encoder.path} embeds in "
                         f"dimension {encoder.dim}")


def check_count(index: faiss.Index, where: str, store: CorpusStore) -> None:
    """Raises unless the index holds one vector per passage of `store`."""
    if index.ntotal != len(store):
        raise ValueError(f"{where} holds {index.ntotal} vectors but {store.source} has {len(store)} "
                         "passages: an index imports only with the corpus it was built on, one vector per "
                         "passage")


def check_vectors(index: faiss.Index, store: CorpusStore, encoder: DenseEncoder, count: int,
                  min_cosine: float) -> None:
    """Raises unless the encoder's embedding of each of `count` passages spread over the corpus has a cosine
    of at least `min_cosine` with the vector the index stores for it. Skipped (logged) for index types that
    cannot return their stored vectors."""
    if count <= 0 or not len(store):
        return
    rows = np.unique(np.linspace(0, len(store) - 1, min(count, len(store))).round().astype(np.int64))
    try:
        stored = np.stack([index.reconstruct(int(i)) for i in rows])
    except RuntimeError as e:
        log.warning("%s cannot return its stored vectors (%s): the encoder check is skipped",
                    type(index).__name__, e)
        return
    fresh = encoder.encode_passages([store.hit(int(i), 0.0).contents for i in rows])
    norms = np.linalg.norm(stored, axis=1) * np.linalg.norm(fresh, axis=1)
    cosines = (stored * fresh).sum(axis=1) / np.maximum(norms, 1e-12)
    worst = int(np.argmin(cosines))
    if cosines[worst] < min_cosine:
        settings = {k: v for k, v in encoder.settings().items() if k != "batch_size"}
        raise ValueError(
            f"the encoder does not reproduce the index's vectors: passage {store.ids[rows[worst]]!r} (row "
            f"{rows[worst]}) has cosine {cosines[worst]:.4f} < {min_cosine} between its stored vector and "
            f"its embedding with {settings}; the index was built with another model or other settings")


def private_copy(src: Path, dest: Path) -> None:
    """Writes the new file `dest` as a copy of `src` sharing nothing a rewrite of `src` in place changes: a
    reflink where the filesystem makes one, else a byte copy, refused (ValueError) when it would not fit.
    Nothing is left at `dest` on a failure."""
    with open(src, "rb") as source, open(dest, "xb") as out:
        try:
            try:
                fcntl.ioctl(out.fileno(), FICLONE, source.fileno())
                return
            except OSError as e:  # no reflinks here (another filesystem, ext4, tmpfs, ...)
                log.info("cannot clone %s (%s): copying it", src, e)
            size, free = os.fstat(source.fileno()).st_size, shutil.disk_usage(dest.parent).free
            if size > free:
                raise ValueError(f"importing {src} copies it ({size / 1e9:.3g} GB; the index must not share "
                                 f"a file you may rewrite) but {dest.parent} has {free / 1e9:.3g} GB free: "
                                 "free space or import to another disk")
            shutil.copyfileobj(source, out, 1 << 24)
        except BaseException as e:
            dest.unlink(missing_ok=True)
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                raise ValueError(f"no space left on the device while copying {src} to {dest}") from None
            raise


def import_index(index_path: str | os.PathLike, corpus_path: str | os.PathLike, out_dir: str | os.PathLike,
                 encoder_path: str | os.PathLike, *, encoder_settings: Mapping[str, Any] = SEARCH_R1_E5,
                 batch_size: int, check_passages: int = 8, min_cosine: float = 0.98,
                 show_progress: bool = True) -> DenseRetriever:
    """Writes a searchrl dense index dir at `out_dir` from a FAISS index file and its JSONL corpus (see the
    module docstring). `encoder_settings`: the `DenseEncoder.from_pretrained` settings the index was encoded
    with (pooling, normalize, query_prefix, passage_prefix, max_length), Search-R1's e5 ones by default. Built
    atomically (`corpus.building`): a failed check leaves nothing at `out_dir`, and an index already there as
    it was."""
    index_path = Path(index_path).resolve()
    if not index_path.is_file():
        raise FileNotFoundError(f"FAISS index file not found: {index_path}")
    index = read_index(index_path)
    encoder = DenseEncoder.from_pretrained(encoder_path, **encoder_settings, batch_size=batch_size)
    check_index(index, str(index_path), encoder)
    with building(out_dir) as out:
        store = CorpusStore.build(corpus_path, out / "corpus", show_progress=show_progress)
        check_count(index, str(index_path), store)
        check_vectors(index, store, encoder, check_passages, min_cosine)
        private_copy(index_path, out / INDEX_FILE)
        write_manifest(out, "dense", store.source, dim=index.d, count=len(store), index_file=INDEX_FILE,
                       encoder=encoder.settings(), imported_from=str(index_path),
                       faiss_class=type(faiss.downcast_index(index)).__name__)
    out_dir = Path(out_dir)
    return DenseRetriever(read_index(out_dir / INDEX_FILE), encoder, CorpusStore.open(out_dir / "corpus"))


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    index = flags.DEFINE_string("index", None, "FAISS index file (Search-R1: e5_Flat.index)", required=True,
                                flag_values=values)
    corpus = flags.DEFINE_string("corpus", None, "the JSONL corpus it was built on (wiki-18.jsonl)",
                                 required=True, flag_values=values)
    encoder = flags.DEFINE_string("encoder", None, "local encoder dir (intfloat/e5-base-v2 for Search-R1's)",
                                  required=True, flag_values=values)
    out = flags.DEFINE_string("out", None, "index dir to write", required=True, flag_values=values)
    pooling = flags.DEFINE_enum("pooling", SEARCH_R1_E5["pooling"], ("mean", "cls"), "encoder pooling",
                                flag_values=values)
    no_normalize = flags.DEFINE_boolean("no_normalize", not SEARCH_R1_E5["normalize"],
                                        "the index holds raw embeddings, not L2-normalised ones",
                                        flag_values=values)
    query_prefix = flags.DEFINE_string("query_prefix", SEARCH_R1_E5["query_prefix"], "prepended to queries",
                                       flag_values=values)
    passage_prefix = flags.DEFINE_string("passage_prefix", SEARCH_R1_E5["passage_prefix"],
                                         "prepended to passages", flag_values=values)
    max_length = flags.DEFINE_integer("max_length", SEARCH_R1_E5["max_length"], "encoder max tokens",
                                      lower_bound=1, flag_values=values)
    batch_size = flags.DEFINE_integer("batch_size", BATCH_SIZE, "encoder batch size", lower_bound=1,
                                      flag_values=values)
    check_passages = flags.DEFINE_integer("check_passages", 8, "passages whose stored vectors the encoder "
                                          "must reproduce (0: no check)", lower_bound=0, flag_values=values)
    min_cosine = flags.DEFINE_float("min_cosine", 0.98, "least cosine of a checked passage", lower_bound=-1,
                                    upper_bound=1, flag_values=values)
    cli.parse(values, argv, __doc__)

    start = time.perf_counter()
    try:
        settings = {"pooling": pooling.value, "normalize": not no_normalize.value,
                    "query_prefix": query_prefix.value, "passage_prefix": passage_prefix.value,
                    "max_length": max_length.value}
        retriever = import_index(index.value, corpus.value, out.value, encoder.value,
                                 encoder_settings=settings, batch_size=batch_size.value,
                                 check_passages=check_passages.value, min_cosine=min_cosine.value)
    except (ValueError, FileNotFoundError) as e:
        cli.fail(str(e))
    print(json.dumps({"kind": "dense", "out": out.value, "passages": len(retriever.store),
                      "seconds": round(time.perf_counter() - start, 2)}))


if __name__ == "__main__":
    cli.run(main)
