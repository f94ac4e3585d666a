"""Dense retrieval: `DenseEncoder` passage embeddings in a FAISS inner-product index.

Index dir layout: `searchrl_index.json` (kind "dense", encoder settings, factory), `corpus/` (a CorpusStore
over the source JSONL), `faiss.index`. Factory strings are FAISS's own: "Flat" (exact), "HNSW32",
"IVF4096,PQ64", ...
"""
from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import faiss
import numpy as np
from tqdm import tqdm

from searchrl.retrieval.corpus import CorpusStore, building, read_manifest, write_manifest
from searchrl.retrieval.encoder import DenseEncoder, check_texts
from searchrl.retrieval.types import Hit

INDEX_FILE = "faiss.index"

log = logging.getLogger(__name__)


def make_index(dim: int, factory: str) -> faiss.Index:
    """An empty inner-product index from a FAISS factory string."""
    try:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"invalid FAISS factory string {factory!r} for dim {dim}: {e}") from None


def to_gpu(index: faiss.Index, use_gpu: bool) -> faiss.Index:
    """The index on every visible GPU when asked and possible; otherwise the CPU index, with a logged note."""
    if not use_gpu:
        return index
    if faiss.get_num_gpus() == 0:
        log.info("FAISS sees no GPU (faiss-cpu build or none visible): the index stays on CPU")
        return index
    try:
        return faiss.index_cpu_to_all_gpus(index)
    except RuntimeError as e:  # e.g. HNSW has no GPU implementation
        log.info("%s has no GPU version (%s): the index stays on CPU", type(index).__name__, e)
        return index


GPU_MODES = ("replicate", "shard")


def on_gpus(index: faiss.Index, mode: str, gpus: Sequence[int] = ()) -> faiss.Index:
    """The index on GPUs `gpus` (every GPU FAISS sees when empty), for serving: "replicate" puts a copy on
    each (a batch's queries are split over them), "shard" a slice of the vectors on each (every query
    searches all; for an index larger than one GPU). Unlike `to_gpu`, asking for what cannot be had is an
    error."""
    if mode not in GPU_MODES:
        raise ValueError(f"FAISS GPU mode {mode!r} not in {GPU_MODES}")
    available = faiss.get_num_gpus()
    if available == 0:
        raise RuntimeError(f"FAISS on GPU ({mode}) was asked for, but FAISS sees no GPU (a faiss-cpu build, "
                           f"or none visible in CUDA_VISIBLE_DEVICES): install faiss-gpu or serve the index "
                           f"on CPU")
    gpus = list(gpus) or list(range(available))
    if any(not 0 <= g < available for g in gpus):
        raise ValueError(f"FAISS GPUs {gpus}: FAISS sees {available} GPU(s), numbered 0..{available - 1}")
    options = faiss.GpuMultipleClonerOptions()
    options.shard = mode == "shard"
    try:
        return faiss.index_cpu_to_gpus_list(index, co=options, gpus=gpus)
    except RuntimeError as e:  # e.g. HNSW has no GPU implementation
        raise ValueError(f"{type(index).__name__} cannot be put on GPU: {e}") from None


def read_index(path: str | os.PathLike) -> faiss.Index:
    """Reads an index memory-mapped (flat codes and inverted lists stay on disk) where its type allows."""
    try:
        return faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError as e:
        log.info("%s cannot be memory-mapped (%s): reading it into memory", path, e)
        return faiss.read_index(str(path))


def warn_if_shared(path: Path) -> None:
    """Logs a warning when an index file shares its data with another path (a hard or symbolic link, as
    imports made before they copied): rewriting that path in place pulls the memory-mapped pages from under
    the searcher (SIGBUS)."""
    if path.is_symlink() or path.stat().st_nlink > 1:
        log.warning("%s is a link shared with another path: rewriting that file in place (Search-R1's `cat "
                    "part_* > e5_Flat.index`) will crash this searcher; import the index again to give it a "
                    "private copy", path)


def set_search_params(index: faiss.Index, nprobe: int, ef_search: int) -> None:
    """Search-time knobs: inverted lists probed (IVF) and beam width (HNSW); no-ops for other types."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = nprobe
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = ef_search


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


class DenseRetriever:
    """Batched dense search: queries are encoded in one pass and searched with one FAISS call."""

    def __init__(self, index: faiss.Index, encoder: DenseEncoder, store: CorpusStore):
        if index.d != encoder.dim:
            raise ValueError(f"index dimension {index.d} != encoder dimension {encoder.dim}")
        if index.ntotal != len(store):
            raise ValueError(f"index holds {index.ntotal} vectors but the corpus has {len(store)} passages")
        self.index, self.encoder, self.store = index, encoder, store

    @classmethod
    def build(cls, corpus_path: str | os.PathLike, out_dir: str | os.PathLike,
              encoder_path: str | os.PathLike, factory: str = "Flat", pooling: str = "mean",
              normalize: bool = True, query_prefix: str = "", passage_prefix: str = "", max_length: int = 256,
              batch_size: int = 64, dtype: str | None = None, chunk_size: int = 8192,
              train_size: int = 100_000, use_gpu: bool = False, nprobe: int = 32, ef_search: int = 128,
              skip_malformed: bool = False, show_progress: bool = True, seed: int = 0) -> "DenseRetriever":
        """Encodes every passage of a JSONL corpus (its `contents`, as stored) into a FAISS index.

        Passages are encoded and added `chunk_size` at a time. Indexes that need training (IVF, PQ) are
        trained first on a random sample of `train_size` passages. The index is built next to `out_dir` and
        moved there at the end (see `corpus.building`).
        """
        with building(out_dir) as out:
            store = CorpusStore.build(corpus_path, out / "corpus", skip_malformed, show_progress)
            if not len(store):
                raise ValueError(f"{corpus_path}: no passages to index")
            encoder = DenseEncoder.from_pretrained(encoder_path, pooling=pooling, normalize=normalize,
                                                   query_prefix=query_prefix, passage_prefix=passage_prefix,
                                                   max_length=max_length, batch_size=batch_size, dtype=dtype)
            cpu_index = make_index(encoder.dim, factory)
            index = to_gpu(cpu_index, use_gpu)
            if not index.is_trained:
                rng = np.random.default_rng(seed)
                sample = np.sort(rng.choice(len(store), min(len(store), train_size), replace=False))
                log.info("training %s on %d passages", factory, len(sample))
                index.train(encoder.encode_passages([store.hit(int(i), 0.0).contents for i in sample]))
            with tqdm(total=len(store), desc=f"encode {factory}", unit="doc",
                      disable=not show_progress) as bar:
                for texts in _chunks(store.texts(), chunk_size):
                    index.add(encoder.encode_passages(texts))
                    bar.update(len(texts))
            if index is not cpu_index:
                cpu_index = faiss.index_gpu_to_cpu(index)
            faiss.write_index(cpu_index, str(out / INDEX_FILE))
            write_manifest(out, "dense", store.source, factory=factory, dim=encoder.dim, count=len(store),
                           index_file=INDEX_FILE, encoder=encoder.settings())
        set_search_params(cpu_index, nprobe, ef_search)
        return cls(to_gpu(cpu_index, use_gpu), encoder, CorpusStore.open(Path(out_dir) / "corpus"))

    @classmethod
    def load(cls, index_dir: str | os.PathLike, use_gpu: bool = False, nprobe: int = 32, ef_search: int = 128,
             encoder_path: str | os.PathLike | None = None, batch_size: int | None = None,
             dtype: str | None = None, device: str = "", faiss_gpu: str = "",
             faiss_gpus: Sequence[int] = ()) -> "DenseRetriever":
        """Opens an index dir written by `build`. `encoder_path` overrides the model directory recorded in
        the manifest (e.g. after moving it); the index is memory-mapped where its type allows. The query
        encoder runs on `device` (`encoder.resolve_device`); `faiss_gpu` ("replicate" or "shard") puts the
        index on `faiss_gpus` (`on_gpus`: an error without them), `use_gpu` on every GPU when there are
        any."""
        index_dir = Path(index_dir)
        manifest = read_manifest(index_dir)
        if manifest["kind"] != "dense":
            raise ValueError(f"{index_dir}: a {manifest['kind']!r} index, not a dense index")
        settings = dict(manifest["encoder"])
        if encoder_path is not None:
            settings["path"] = str(encoder_path)
        if batch_size is not None:
            settings["batch_size"] = batch_size
        warn_if_shared(index_dir / manifest["index_file"])
        index = read_index(index_dir / manifest["index_file"])
        set_search_params(index, nprobe, ef_search)
        index = on_gpus(index, faiss_gpu, faiss_gpus) if faiss_gpu else to_gpu(index, use_gpu)
        encoder = DenseEncoder.from_pretrained(**settings, dtype=dtype, device=device)
        return cls(index, encoder, CorpusStore.open(index_dir / "corpus"))

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Top-k passages per query by inner product of embeddings (cosine when the encoder normalises)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        queries = check_texts(queries, "DenseRetriever.search")
        if not queries:
            return []
        scores, ids = self.index.search(self.encoder.encode_queries(queries), min(k, self.index.ntotal))
        return [[self.store.hit(int(i), float(s)) for i, s in zip(row_ids, row_scores) if i >= 0]
                for row_ids, row_scores in zip(ids, scores)]
