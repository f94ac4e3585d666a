"""Fetch the papers' datasets, corpora, indexes and models by their hub names, into the layouts the configs
read.

  python -m searchrl.data.download qa     --names nq,hotpotqa [--splits train,test] --out /data/flashrag
  python -m searchrl.data.download beir   --names msmarco,scifact --out /data/beir
  python -m searchrl.data.download wiki18 --out /data/wiki18 [--index_dir /data/indexes/wiki18_e5_flat
                                          --encoder /data/models/e5-base-v2]
  python -m searchrl.data.download model  --names Qwen/Qwen2.5-3B,intfloat/e5-base-v2 --out /data/models
  every command: [--revision main] [--cache_dir DIR] [--dry_run] [--lock_wait_s 30]

What each command fetches (hub repositories, in their public layouts):
  qa      dataset RUC-NLPIR/FlashRAG_datasets, <name>/<split>.jsonl with FlashRAG rows {"id", "question",
          "golden_answers", "metadata"} -> OUT/<name>/<split>.jsonl (config.data.dir, format "qa"); every
          split the hub has unless --splits names some.
  beir    dataset BeIR/<name>: corpus.jsonl.gz and queries.jsonl.gz; dataset BeIR/<name>-qrels: <split>.tsv
          -> OUT/<name>/corpus.jsonl, queries.jsonl (decompressed) and qrels/<split>.tsv (format "beir").
  wiki18  Search-R1's retrieval data (its scripts/download.py and README quick start): dataset
          PeterJinGo/wiki-18-corpus, wiki-18.jsonl.gz (Wikipedia of Dec. 2018 in 100-word passages,
          {"id", "contents": "\\"Title\\"\\ntext"}) -> OUT/wiki-18.jsonl; dataset PeterJinGo/wiki-18-e5-index,
          part_aa and part_ab, pieces of one file concatenated in name order -> OUT/e5_Flat.index (a FAISS
          Flat inner-product index of intfloat/e5-base-v2 passage embeddings). With --index_dir and --encoder
          (a local intfloat/e5-base-v2, e.g. from the `model` command) it is then imported as a searchrl dense
          index, without re-encoding (`searchrl.retrieval.import_faiss`).
  model   model <name>: its top-level *.json (config, tokenizer, generation config), *.txt and *.model
          (vocabularies) and *.safetensors -> OUT/<last part of the name> (config.model.path, an encoder).

Files download with huggingface_hub into its cache (HF_HUB_CACHE, under HF_HOME, or --cache_dir): an
interrupted download resumes, and a file already cached is not fetched again. Every repository is pinned to
the commit its revision names when the command starts. Each file's size, the total and what is already cached
are printed before anything downloads (--dry_run stops there).

What could lose disk, data or a rerun is checked (`searchrl.data.layout`): one download writes an output
folder at a time (a lock, waited for --lock_wait_s); a download that would not fit is refused before it
starts, counting the download in the cache and the layout made from it (decompressed and concatenated sizes,
checked again exactly once the files are here); each file is verified against the hub's listing (its size,
and its sha256 in LFS or git object id otherwise) and a `.gz` must decompress, so damaged bytes are deleted
from the cache, never used, and a cached copy that fails is fetched again. The layout is then made from the
cached files: a file used as it is becomes a hard link to the cached copy (a copy on another filesystem: edit
neither in place), `.gz` files are decompressed and split files concatenated, each written under a unique
hidden name and renamed into place (removed on any failure, a full disk included).
OUT/.searchrl_download.json (written atomically) records the hub files each layout file was made from, so
running a command again rebuilds nothing; when it is unreadable the layout is made again. HF_ENDPOINT points
huggingface_hub at another hub (a mirror). Every failure is one line on stderr, exit status 1.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from absl import flags

from searchrl import cli
from searchrl.data import layout
from searchrl.data.layout import DownloadError, human_size

if TYPE_CHECKING:
    from huggingface_hub.hf_api import RepoSibling

FLASHRAG_REPO = "RUC-NLPIR/FlashRAG_datasets"
WIKI18_CORPUS_REPO, WIKI18_INDEX_REPO = "PeterJinGo/wiki-18-corpus", "PeterJinGo/wiki-18-e5-index"
WIKI18_CORPUS, WIKI18_INDEX = "wiki-18.jsonl", "e5_Flat.index"  # the names Search-R1's README gives them
MODEL_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model")
COMMANDS = ("qa", "beir", "wiki18", "model")
LOCK_WAIT_S = 30.0  # how long a download waits for another one writing its output folder


@dataclasses.dataclass(frozen=True)
class HubFile:
    """One file of a hub repository at a fixed commit."""

    repo_id: str
    repo_type: str  # "dataset" or "model"
    commit: str
    path: str
    size: int
    digest: str  # "sha256:<hex>" (LFS), "git-sha1:<hex>" (git object id) or "" when the hub gives neither

    @property
    def key(self) -> str:
        """What identifies the file's contents: repository, commit and path."""
        return f"{self.repo_type}:{self.repo_id}@{self.commit}:{self.path}"


@dataclasses.dataclass(frozen=True)
class Target:
    """One file of the local layout (`dest`, relative to the output dir) and the hub files it is made of: one
    is linked, or decompressed when it ends in .gz; several are concatenated (each decompressed if .gz)."""

    dest: str
    sources: tuple[HubFile, ...]


def list_repo(repo_id: str, repo_type: str, revision: str) -> dict[str, HubFile]:
    """{path: file} for every file of a hub repository at `revision`, with sizes (one API call: the
    repository's info with file metadata), pinned to the commit the revision resolves to."""
    from huggingface_hub import HfApi

    info = HfApi().repo_info(repo_id, repo_type=repo_type, revision=revision, files_metadata=True)
    return {s.rfilename: _hub_file(repo_id, repo_type, info.sha, s) for s in info.siblings or ()}


def _hub_file(repo_id: str, repo_type: str, commit: str, sibling: RepoSibling) -> HubFile:
    """A file of the repository info (a huggingface_hub RepoSibling); raises on a size that is not a count
    of bytes (missing, negative), which the disk check and the verification could not use."""
    size = sibling.lfs.size if sibling.lfs else sibling.size
    if type(size) is not int or size < 0:
        raise ValueError(f"{repo_type} {repo_id}: the hub lists {sibling.rfilename} with size {size!r}, not "
                         "a count of bytes")
    digest = (f"sha256:{sibling.lfs.sha256}" if sibling.lfs and sibling.lfs.sha256
              else f"git-sha1:{sibling.blob_id}" if sibling.blob_id and not sibling.lfs else "")
    return HubFile(repo_id, repo_type, commit, sibling.rfilename, size, digest)


def _one_of(files: dict[str, HubFile], names: Sequence[str], repo_id: str) -> HubFile:
    """The first of `names` the repository has."""
    for name in names:
        if name in files:
            return files[name]
    raise ValueError(f"{repo_id} has none of {list(names)}; its files: {sorted(files)}")


def qa_targets(names: Sequence[str], splits: Sequence[str], revision: str) -> list[Target]:
    """FlashRAG's <name>/<split>.jsonl for each name: the given splits, or all the hub has."""
    files = list_repo(FLASHRAG_REPO, "dataset", revision)
    have: dict[str, list[str]] = {}
    for path in files:
        name, _, rest = path.partition("/")
        if rest.endswith(".jsonl") and "/" not in rest:
            have.setdefault(name, []).append(rest.removesuffix(".jsonl"))
    targets = []
    for name in names:
        if name not in have:
            raise ValueError(f"{FLASHRAG_REPO} has no dataset {name!r}; it has {sorted(have)}")
        missing = [s for s in splits if s not in have[name]]
        if missing:
            raise ValueError(f"{FLASHRAG_REPO} has no {name} split {missing}; its {name} splits: "
                             f"{sorted(have[name])}")
        targets += [Target(f"{name}/{s}.jsonl", (files[f"{name}/{s}.jsonl"],))
                    for s in (splits or sorted(have[name]))]
    return targets


def beir_targets(names: Sequence[str], revision: str) -> list[Target]:
    """BeIR/<name>'s corpus and queries and BeIR/<name>-qrels' splits, in the unzipped BEIR layout."""
    targets = []
    for name in names:
        repo, qrels_repo = f"BeIR/{name}", f"BeIR/{name}-qrels"
        files, qrels = list_repo(repo, "dataset", revision), list_repo(qrels_repo, "dataset", revision)
        splits = sorted(p for p in qrels if p.endswith(".tsv") and "/" not in p)
        if not splits:
            raise ValueError(f"{qrels_repo} has no <split>.tsv qrels; its files: {sorted(qrels)}")
        targets += [Target(f"{name}/{stem}.jsonl",
                           (_one_of(files, (f"{stem}.jsonl.gz", f"{stem}.jsonl"), repo),))
                    for stem in ("corpus", "queries")]
        targets += [Target(f"{name}/qrels/{split}", (qrels[split],)) for split in splits]
    return targets


def wiki18_targets(revision: str) -> list[Target]:
    """Search-R1's wiki-18 corpus and its e5 Flat index (the pieces part_aa, part_ab, ... in name order)."""
    corpus = list_repo(WIKI18_CORPUS_REPO, "dataset", revision)
    index = list_repo(WIKI18_INDEX_REPO, "dataset", revision)
    parts = sorted(p for p in index if p.startswith("part_"))
    if not parts:
        raise ValueError(f"{WIKI18_INDEX_REPO} has no part_* files; its files: {sorted(index)}")
    corpus_file = _one_of(corpus, ("wiki-18.jsonl.gz", "wiki-18.jsonl"), WIKI18_CORPUS_REPO)
    return [Target(WIKI18_CORPUS, (corpus_file,)), Target(WIKI18_INDEX, tuple(index[p] for p in parts))]


def model_targets(names: Sequence[str], revision: str) -> list[Target]:
    """Each model's top-level files matching MODEL_PATTERNS, under the last part of its name."""
    targets = []
    for name in names:
        files = list_repo(name, "model", revision)
        chosen = sorted(p for p in files
                        if "/" not in p and any(fnmatch.fnmatch(p, m) for m in MODEL_PATTERNS))
        if not any(p.endswith(".safetensors") for p in chosen):
            raise ValueError(f"model {name} has no *.safetensors weights (searchrl reads safetensors only); "
                             f"its files: {sorted(files)}")
        targets += [Target(f"{name.rsplit('/', 1)[-1]}/{p}", (files[p],)) for p in chosen]
    return targets


def _cached(f: HubFile, cache_dir: str | None) -> bool:
    """Whether huggingface_hub's cache holds the file at its commit."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(f.repo_id, f.path, cache_dir=cache_dir, revision=f.commit,
                                   repo_type=f.repo_type)
    return isinstance(found, str)


def plan(files: Sequence[HubFile], cached: set[str]) -> tuple[str, int]:
    """The listing printed before a download (each file's size, by repository, then the totals) and the bytes
    still to download."""
    lines, repo = [], None
    for f in files:
        if (f.repo_type, f.repo_id) != repo:
            repo = (f.repo_type, f.repo_id)
            lines.append(f"{f.repo_type} {f.repo_id} @ {f.commit[:12]}")
        lines.append(f"  {f.path:<48} {human_size(f.size):>9}{'  cached' if f.key in cached else ''}")
    total = sum(f.size for f in files)
    to_fetch = sum(f.size for f in files if f.key not in cached)
    lines.append(f"total {human_size(total)} in {len(files)} files: {human_size(to_fetch)} to download, "
                 f"{human_size(total - to_fetch)} cached")
    return "\n".join(lines), to_fetch


def _cache_root(cache_dir: str | None) -> Path:
    from huggingface_hub import constants

    return Path(cache_dir or constants.HF_HUB_CACHE).expanduser()


def _one_line(e: BaseException) -> str:
    """An error's message on one line (huggingface_hub's span several)."""
    return " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


def _download(f: HubFile, cache_dir: str | None) -> str:
    """The file's path in the hub cache, downloaded unless cached; a failure (an HTTP error, a body cut short
    or of the wrong size, a redirect loop, a full disk) raises DownloadError naming the file."""
    import httpx2
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(f.repo_id, f.path, repo_type=f.repo_type, revision=f.commit,
                               cache_dir=cache_dir)
    except (OSError, httpx2.HTTPError) as e:
        raise DownloadError(f"downloading {f.repo_type} {f.repo_id} {f.path} failed: "
                            f"{_one_line(e)}") from None


def _inspect(path: str, f: HubFile) -> tuple[str | None, int]:
    """What is wrong with a downloaded copy of `f`, checked against the hub's listing (None: nothing), and its
    size in the layout (decompressed for a .gz)."""
    size = os.path.getsize(path)
    if size != f.size:
        return f"it has {size} bytes, the hub lists {f.size}", size
    algorithm, _, expected = f.digest.partition(":")
    if expected and (actual := layout.digest(path, algorithm)) != expected:
        return f"its {algorithm} is {actual}, the hub lists {expected}", size
    if f.path.endswith(".gz"):
        try:
            return None, layout.unzipped_size(path)
        except layout.GZIP_ERRORS as e:
            return f"it is not a valid .gz file ({_one_line(e)})", size
    return None, size


def _discard(path: str) -> None:
    """Deletes a cached file: its blob and the snapshot's link to it."""
    Path(os.path.realpath(path)).unlink(missing_ok=True)
    Path(path).unlink(missing_ok=True)


def _fetch_checked(f: HubFile, cache_dir: str | None, was_cached: bool) -> tuple[str, int]:
    """The cached path of `f` once its copy is verified (`_inspect`), and its size in the layout. A damaged
    copy is deleted from the cache; one cached before this run is fetched again, a fresh one raises
    DownloadError."""
    path = _download(f, cache_dir)
    problem, size = _inspect(path, f)
    if problem and was_cached:
        print(f"warning: the cached copy of {f.key} is damaged ({problem}): fetching it again",
              file=sys.stderr)
        _discard(path)
        path = _download(f, cache_dir)
        problem, size = _inspect(path, f)
    if problem:
        _discard(path)
        raise DownloadError(f"{f.repo_type} {f.repo_id} {f.path} as downloaded is damaged: {problem}; it is "
                            "deleted from the cache, nothing was made from it")
    return path, size


def _made(out: Path, target: Target, stamps: dict) -> bool:
    """Whether the target's file is there, made from its hub files (its stamp)."""
    dest = out / target.dest
    return dest.is_file() and stamps.get(target.dest) == _stamp(target, dest)


def _stamp(target: Target, dest: Path) -> dict:
    return {"sources": [f.key for f in target.sources], "bytes": dest.stat().st_size}


def _layout_bytes(target: Target, sizes: Sequence[int], linked: bool) -> int:
    """The disk the target's file takes beside its sources (`sizes`, decompressed for a .gz): none for a
    hard link (`linked`: one plain file on the cache's filesystem), else their sum."""
    plain_one = len(target.sources) == 1 and not target.sources[0].path.endswith(".gz")
    return 0 if plain_one and linked else sum(sizes)


def fetch(targets: Sequence[Target], out: str | os.PathLike, cache_dir: str | None = None,
          dry_run: bool = False, lock_wait_s: float = LOCK_WAIT_S) -> None:
    """Prints what `targets` need from the hub, downloads and verifies what is not cached, then makes each
    target under `out` that is missing or was made from other files (the stamps in
    OUT/.searchrl_download.json), holding the folder's lock. Free space is checked before the download (for
    it, and for the layout counting each .gz at its compressed size) and again before the layout is made (at
    its exact size)."""
    files = list({f.key: f for t in targets for f in t.sources}.values())
    cached = {f.key for f in files if _cached(f, cache_dir)}
    listing, to_fetch = plan(files, cached)
    print(listing)
    if dry_run:
        return
    out, cache = Path(out), _cache_root(cache_dir)
    with layout.folder_lock(out, lock_wait_s):
        stamps = layout.read_stamps(out)
        todo = [t for t in targets if not _made(out, t, stamps)]
        linked = layout.device(cache) == layout.device(out)
        layout.check_free([(cache, to_fetch, "the download, in the hub cache"),
                           (out, sum(_layout_bytes(t, [f.size for f in t.sources], linked) for t in todo),
                            "the files made from it, at least")])
        used = {f.key for t in todo for f in t.sources}
        fetched = {f.key: _fetch_checked(f, cache_dir, f.key in cached) for f in files
                   if f.key in used or f.key not in cached}
        paths, sizes = {k: p for k, (p, _) in fetched.items()}, {k: n for k, (_, n) in fetched.items()}
        exact = sum(_layout_bytes(t, [sizes[f.key] for f in t.sources], linked) for t in todo)
        layout.check_free([(out, exact, "the files made from the download")])
        for target in todo:
            dest = out / target.dest
            layout.make_file(dest, [paths[f.key] for f in target.sources])
            stamps[target.dest] = _stamp(target, dest)
            layout.write_stamps(out, stamps)  # after each file: a rerun keeps those done


def _targets(command: str, names: Sequence[str], splits: Sequence[str], revision: str) -> list[Target]:
    if command == "qa":
        return qa_targets(names, splits, revision)
    if command == "beir":
        return beir_targets(names, revision)
    if command == "wiki18":
        return wiki18_targets(revision)
    return model_targets(names, revision)


def _errors() -> tuple[type[Exception], ...]:
    """The errors a user can fix: a wrong name or revision, no hub access, a failed download, no disk space,
    an unwritable output folder."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    return (ValueError, OSError, DownloadError, HfHubHTTPError, LocalEntryNotFoundError,
            OfflineModeIsEnabled)


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    names = flags.DEFINE_list("names", [], "qa, beir: dataset names (nq, msmarco); model: hub model names "
                              "(Qwen/Qwen2.5-3B)", flag_values=values)
    out = flags.DEFINE_string("out", None, "output dir: config.data.dir (qa, beir), the corpus and index dir "
                              "(wiki18) or the models' parent dir (model)", required=True, flag_values=values)
    splits = flags.DEFINE_list("splits", [], "qa: the splits to fetch (default: every split the hub has)",
                               flag_values=values)
    revision = flags.DEFINE_string("revision", "main", "hub revision (branch, tag or commit) of every "
                                   "repository", flag_values=values)
    cache_dir = flags.DEFINE_string("cache_dir", None, "huggingface_hub cache dir (default: HF_HUB_CACHE)",
                                    flag_values=values)
    dry_run = flags.DEFINE_boolean("dry_run", False, "list the files and their sizes, download nothing",
                                   flag_values=values)
    lock_wait_s = flags.DEFINE_float("lock_wait_s", LOCK_WAIT_S, "seconds to wait for another download "
                                     "writing --out before giving up", lower_bound=0, flag_values=values)
    index_dir = flags.DEFINE_string("index_dir", None, "wiki18: import the e5 index as a searchrl dense "
                                    "index here (needs --encoder)", flag_values=values)
    encoder = flags.DEFINE_string("encoder", None, "wiki18: local intfloat/e5-base-v2 dir, for --index_dir",
                                  flag_values=values)
    flags.register_multi_flags_validator(["index_dir", "encoder"], lambda f: bool(f["index_dir"]) == bool(
        f["encoder"]), "--index_dir and --encoder go together", flag_values=values)
    command = cli.parse_command(values, argv, __doc__, COMMANDS)
    if not values["verbosity"].present:  # huggingface_hub's retry warnings: the failure is one line
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    if command in ("qa", "beir", "model") and not names.value:
        cli.fail(f"{command} needs --names")

    start = time.perf_counter()
    try:
        targets = _targets(command, names.value, splits.value, revision.value)
        fetch(targets, out.value, cache_dir.value, dry_run.value, lock_wait_s.value)
        if command == "wiki18" and index_dir.value and not dry_run.value:
            from searchrl.retrieval.import_faiss import BATCH_SIZE, import_index
            import_index(Path(out.value, WIKI18_INDEX), Path(out.value, WIKI18_CORPUS), index_dir.value,
                         encoder.value, batch_size=BATCH_SIZE)
    except _errors() as e:
        cli.fail(_one_line(e))
    print(json.dumps({"command": command, "out": out.value, "files": len(targets), "dry_run": dry_run.value,
                      "seconds": round(time.perf_counter() - start, 2)}))


if __name__ == "__main__":
    cli.run(main)
