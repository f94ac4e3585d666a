"""Passage corpora: JSONL parsing (FlashRAG/Search-R1 and BEIR rows), an offset-indexed store over the JSONL
file itself (O(1) random access, texts stay on disk), the `searchrl_index.json` manifest of index dirs and
atomic index builds.

Formats:
  FlashRAG / Search-R1: {"id": ..., "contents": "title\\ntext"}  (wiki-18 wraps the title in double quotes)
  BEIR:                 {"_id": ..., "title": ..., "text": ...}
  plain:                {"id": ..., "title": ..., "text": ...}

A passage is read as (id, title, text). FlashRAG `contents` are split by `split_contents` so that
`join_contents(title, text)` (which is `Hit.contents`) gives back the stored string byte for byte: the title
is the first line verbatim, quotes included (`"Evan Morris"`), as Search-R1's `_passages2string` reads it,
and the server returns each row's `contents` exactly as stored. BEIR and plain rows have no `contents`:
theirs is `join_contents(title, text)`. Indexes are built on these `contents` (bm25s, Lucene and dense alike,
as Search-R1's index builder encodes the raw `contents`).
"""
from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from tqdm import tqdm

from searchrl.retrieval.types import Hit

MANIFEST = "searchrl_index.json"
_STORE_META, _STORE_OFFSETS, _STORE_IDS = "store.json", "offsets.npy", "ids.txt"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # a \u escape of a UTF-16 surrogate half


class JSONError(ValueError):
    """A JSON document that cannot be read: the message says why; `line` is the line of a syntax error in a
    multi-line document (0 when there is none)."""

    def __init__(self, reason: str, line: int = 0):
        super().__init__(reason)
        self.line = line


def _check_unicode(value: Any, text: str) -> None:
    """Raises JSONError when `\\u` escapes in `text` decoded to a lone surrogate (not a character)."""
    if not _SURROGATE_ESCAPE.search(text):
        return
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise JSONError("invalid JSON (a \\u escape of a lone UTF-16 surrogate, not a character)") from None
    except RecursionError:
        raise JSONError("invalid JSON (nested too deeply)") from None


def parse_json(data: bytes | str) -> Any:
    """One JSON document from UTF-8 bytes or text (a leading BOM is ignored). Everything that can be wrong
    raises JSONError saying what: not UTF-8, a syntax error, nesting too deep for Python, an integer of more
    than 4,300 digits (Python's int-string limit) or a lone surrogate."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as e:
        raise JSONError(f"not UTF-8 ({e.reason} at byte {e.start + 1})") from None
    text = text.removeprefix("\ufeff").rstrip(" \t\r\n")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        line = e.lineno if "\n" in text else 0
        raise JSONError(f"invalid JSON ({e.msg} at column {e.colno})", line) from None
    except RecursionError:
        raise JSONError("invalid JSON (nested too deeply)") from None
    except ValueError as e:  # an integer over the int-string limit
        raise JSONError(f"invalid JSON ({str(e).split(':')[0]})") from None
    _check_unicode(value, text)
    return value


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG `contents` -> (title, text), the inverse of `join_contents`: the first line verbatim (quotes
    and all) and the rest when there is a non-empty first line and a second one; else ("", contents)."""
    title, sep, text = contents.partition("\n")
    if not sep or not title:
        return "", contents
    return title, text


def join_contents(title: str, text: str) -> str:
    """(title, text) -> FlashRAG `contents` (what `Hit.contents` gives): title and text on separate lines."""
    return f"{title}\n{text}" if title else text


def parse_record(row: Any) -> tuple[str, str, str]:
    """One decoded JSONL row -> (id, title, text). Raises ValueError naming what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    if "_id" in row:
        doc_id = row["_id"]
    elif "id" in row:
        doc_id = row["id"]
    else:
        raise ValueError('no "id" or "_id" field')
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool) or doc_id == "":
        raise ValueError(f"id must be a non-empty string or an integer, got {doc_id!r}")
    if "contents" in row:
        if not isinstance(row["contents"], str):
            raise ValueError('"contents" must be a string')
        title, text = split_contents(row["contents"])
    elif "text" in row:
        title, text = row.get("title") or "", row["text"]
        if not isinstance(title, str) or not isinstance(text, str):
            raise ValueError('"title" and "text" must be strings')
    else:
        raise ValueError('no "contents" or "text" field')
    return str(doc_id), title, text


def parse_line(line: bytes | str) -> tuple[str, str, str]:
    """One JSONL line -> (id, title, text). Raises ValueError saying what is wrong with the line."""
    return parse_record(parse_json(line))


class CorpusScan:
    """One checked pass over a JSONL corpus: iterating yields (byte offset, id, title, text) per passage.

    A malformed line raises `ValueError("file:line: reason")`, or is skipped and counted in `.skipped` with
    `skip_malformed=True`. Blank lines are ignored; a duplicate id is always an error.
    """

    def __init__(self, path: str | os.PathLike, skip_malformed: bool = False, show_progress: bool = False):
        self.path = Path(path).resolve()
        if not self.path.is_file():
            raise FileNotFoundError(f"corpus file not found: {self.path}")
        self.skip_malformed = skip_malformed
        self.show_progress = show_progress
        self.skipped = 0

    def __iter__(self) -> Iterator[tuple[int, str, str, str]]:
        first_line: dict[str, int] = {}
        self.skipped = 0
        bar = tqdm(total=os.path.getsize(self.path), unit="B", unit_scale=True, desc=f"read {self.path.name}",
                   disable=not self.show_progress)
        with open(self.path, "rb") as f, bar:
            pos = 0
            for lineno, line in enumerate(f, start=1):
                start, pos = pos, pos + len(line)
                bar.update(len(line))
                if not line.strip():
                    continue
                try:
                    doc_id, title, text = parse_line(line)
                except ValueError as e:
                    if not self.skip_malformed:
                        raise ValueError(f"{self.path}:{lineno}: {e}") from None
                    self.skipped += 1
                    continue
                if doc_id in first_line:
                    raise ValueError(f"{self.path}:{lineno}: duplicate id {doc_id!r} (first at line "
                                     f"{first_line[doc_id]})")
                first_line[doc_id] = lineno
                yield start, doc_id, title, text


class CorpusStore:
    """Random access to the passages of a JSONL corpus without loading it: an int64 array of line offsets and
    the mmapped JSONL. `store[i] -> (id, title, text)`; `store.index_of(id) -> i`."""

    def __init__(self, store_dir: str | os.PathLike, source: Path, offsets: np.ndarray):
        self.store_dir = Path(store_dir)
        self.source = source
        self.offsets = offsets
        with open(source, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.path.getsize(source) else b""
        self._ids: list[str] | None = None
        self._index: dict[str, int] | None = None

    @classmethod
    def build(cls, jsonl: str | os.PathLike, out_dir: str | os.PathLike, skip_malformed: bool = False,
              show_progress: bool = True) -> "CorpusStore":
        """Checks every line of `jsonl` (see CorpusScan) and writes offsets.npy, ids.txt and store.json to
        `out_dir`; store.json counts the skipped lines."""
        scan = CorpusScan(jsonl, skip_malformed, show_progress)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        offsets = []
        with open(out / _STORE_IDS, "w", encoding="utf-8") as ids_out:
            for offset, doc_id, _, _ in scan:
                offsets.append(offset)
                ids_out.write(json.dumps(doc_id, ensure_ascii=False) + "\n")
        np.save(out / _STORE_OFFSETS, np.asarray(offsets, dtype=np.int64))
        meta = {"source": str(scan.path), "bytes": os.path.getsize(scan.path), "count": len(offsets),
                "skipped": scan.skipped}
        (out / _STORE_META).write_text(json.dumps(meta, indent=2))
        return cls.open(out)

    @classmethod
    def open(cls, store_dir: str | os.PathLike) -> "CorpusStore":
        """Opens a store written by `build`; fails if the JSONL it points at is gone or changed size."""
        store_dir = Path(store_dir)
        meta_path = store_dir / _STORE_META
        if not meta_path.is_file():
            raise FileNotFoundError(f"not a corpus store (no {_STORE_META}): {store_dir}")
        meta = json.loads(meta_path.read_text())
        source = Path(meta["source"])
        if not source.is_file():
            raise FileNotFoundError(f"{meta_path}: corpus file {source} is missing")
        if os.path.getsize(source) != meta["bytes"]:
            raise ValueError(f"{meta_path}: corpus file {source} changed since the store was built; "
                             "rebuild it")
        offsets = np.load(store_dir / _STORE_OFFSETS, mmap_mode="r")
        return cls(store_dir, source, offsets)

    def __len__(self) -> int:
        return len(self.offsets)

    def line(self, i: int) -> bytes:
        """The raw JSONL line of passage i (without its newline)."""
        start = int(self.offsets[i])
        end = self._mm.find(b"\n", start)
        return self._mm[start:end if end >= 0 else len(self._mm)]

    def __getitem__(self, i: int) -> tuple[str, str, str]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"passage index {i} out of range for a corpus of {len(self)}")
        return parse_line(self.line(i))

    def __iter__(self) -> Iterator[tuple[str, str, str]]:
        return (self[i] for i in range(len(self)))

    def texts(self) -> Iterator[str]:
        """Passage texts as indexed: each passage's `contents` (see `join_contents`)."""
        for _, title, text in self:
            yield join_contents(title, text)

    @property
    def ids(self) -> list[str]:
        """All passage ids in store order (read from ids.txt on first use)."""
        if self._ids is None:
            with open(self.store_dir / _STORE_IDS, encoding="utf-8") as f:
                self._ids = [json.loads(line) for line in f]
        return self._ids

    def index_of(self, doc_id: str) -> int:
        """Store position of a passage id (a dict built on first use). Raises KeyError for unknown ids."""
        if self._index is None:
            self._index = {d: i for i, d in enumerate(self.ids)}
        try:
            return self._index[doc_id]
        except KeyError:
            raise KeyError(f"unknown passage id {doc_id!r} in {self.source}") from None

    def hit(self, i: int, score: float) -> Hit:
        """Passage i as a search hit."""
        doc_id, title, text = self[i]
        return Hit(id=doc_id, score=float(score), title=title, text=text)


def write_manifest(index_dir: str | os.PathLike, kind: str, corpus: str | os.PathLike, **extra: Any) -> Path:
    """Writes `searchrl_index.json` ({"kind", "corpus", ...extra}) that `load_retriever` dispatches on."""
    path = Path(index_dir) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": kind, "corpus": str(Path(corpus).resolve()), **extra}, indent=2))
    return path


def read_manifest(index_dir: str | os.PathLike) -> dict[str, Any]:
    """Reads an index dir's manifest; a clear error when the dir or the manifest is missing or invalid."""
    path = Path(index_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"not a searchrl index dir (no {MANIFEST}): {index_dir}")
    try:
        manifest = parse_json(path.read_bytes())
    except JSONError as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(manifest, dict) or "kind" not in manifest:
        raise ValueError(f'{path}: expected an object with a "kind" field')
    return manifest


def _missing_dirs(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _check_replaceable(out: Path) -> None:
    """An index build may replace `out` only when it is missing, an empty dir or a searchrl index dir."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"cannot build an index at {out}: it exists and is not a directory")
    if any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise ValueError(f"cannot build an index at {out}: a non-empty directory that is not a searchrl "
                         f"index dir (no {MANIFEST}); remove it or choose another path")


def _new_dir(parent: Path, prefix: str, suffix: str) -> Path:
    """A new empty dir `parent/<prefix><random><suffix>`, with the usual permissions (mkdtemp's are 0o700)."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}{suffix}"
        with contextlib.suppress(FileExistsError):
            path.mkdir()
            return path


def _replace_dir(new: Path, out: Path) -> None:
    """Moves dir `new` to `out`, replacing what is there; the old `out` is deleted only once `new` is in."""
    if not out.exists():
        os.rename(new, out)
        return
    old = out.with_name(f".{out.name}.{secrets.token_hex(4)}.old")
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def building(out_dir: str | os.PathLike) -> Iterator[Path]:
    """Builds an index dir atomically: yields a new temporary dir next to `out_dir` to write the index into,
    and moves it to `out_dir` when the block succeeds, replacing an index already there.

    A failed (or interrupted) build removes the temporary dir and any parent dirs it created, and leaves an
    existing index at `out_dir` untouched. A non-empty `out_dir` that is not an index dir is refused, not
    replaced.
    """
    out = Path(out_dir).absolute()
    _check_replaceable(out)
    created = _missing_dirs(out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_dir(out.parent, f".{out.name}.", ".building")
    try:
        yield tmp
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for path in created:
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
