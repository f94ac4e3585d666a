"""The download tool's writes to disk, each safe against a crash, a full disk and a second download: a lock
on the output folder, the stamps file written atomically and read with validation, free space checked per
filesystem before writing, file digests, and layout files written under unique hidden names that never
outlive a failure.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import hashlib
import json
import os
import secrets
import shutil
import sys
import time
import zlib
from pathlib import Path
from typing import IO, Iterator, Sequence

from tqdm import tqdm

STAMPS = ".searchrl_download.json"
LOCK = ".searchrl_download.lock"
PARTIAL = ".partial"
CHUNK = 1 << 24
GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)  # a damaged or cut-short .gz


class DownloadError(Exception):
    """A download or layout failure its user can act on; the message is one line naming the file."""


def human_size(n: float) -> str:
    """Bytes in decimal units, as the hub shows them (1.07 GB)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"


@contextlib.contextmanager
def folder_lock(folder: Path, wait_s: float) -> Iterator[None]:
    """Holds an exclusive fcntl lock on `folder`/LOCK (made if needed) while the block runs: one download
    writes a folder at a time. Waits at most `wait_s` seconds for another holder, then raises naming it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    with open(path, "a+") as f:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    f.seek(0)
                    holder = f.read().strip() or "unknown"
                    raise DownloadError(f"another download is writing {folder} (pid {holder}, lock {path}); "
                                        f"waited {wait_s:g} s: run again when it is done") from None
                time.sleep(0.1)
        try:
            f.truncate(0)
            f.write(str(os.getpid()))
            f.flush()
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _new_partial(path: Path) -> tuple[int, str]:
    """A new hidden file beside `path`, named for it and unique (`.<name>.<random>.partial`), with the
    permissions of any new file (mkstemp's are owner-only): its descriptor, open for writing, and path."""
    while True:
        tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(4)}{PARTIAL}"))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def write_atomic(path: Path, data: bytes) -> None:
    """Replaces `path` by `data` all at once: written to a unique file beside it, fsync'd, renamed."""
    fd, tmp = _new_partial(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_stamps(folder: Path) -> dict:
    """The stamps of `folder` ({layout file: {"sources", "bytes"}}); {} when there are none or they are
    unreadable (torn, not an object), with a warning naming the file: the layout is then made again."""
    path = folder / STAMPS
    try:
        stamps = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (ValueError, OSError) as e:
        print(f"warning: {path} is unreadable ({e}): remaking the files it records", file=sys.stderr)
        return {}
    if not isinstance(stamps, dict):
        print(f"warning: {path} holds a {type(stamps).__name__}, not an object: remaking the files it "
              "records", file=sys.stderr)
        return {}
    return stamps


def write_stamps(folder: Path, stamps: dict) -> None:
    """Writes the stamps atomically, first removing the temporary files a killed run left (the caller holds
    the folder's lock)."""
    for stale in folder.glob(f".{STAMPS}.*{PARTIAL}"):
        stale.unlink(missing_ok=True)
    write_atomic(folder / STAMPS, json.dumps(stamps, indent=1).encode())


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def device(path: Path) -> int:
    """The filesystem `path` is on (or would be, when it does not exist yet)."""
    return os.stat(_existing_parent(path.absolute())).st_dev


def check_free(needs: Sequence[tuple[Path, int, str]]) -> None:
    """Raises unless each filesystem has room for what is to be written on it: `needs` holds (a path on it,
    bytes, what they are), summed per filesystem."""
    by_device: dict[int, list[tuple[Path, int, str]]] = {}
    for need in needs:
        by_device.setdefault(device(need[0]), []).append(need)
    for group in by_device.values():
        total = sum(n for _, n, _ in group)
        where = _existing_parent(group[0][0].absolute())
        free = shutil.disk_usage(where).free
        if total > free:
            parts = " + ".join(f"{human_size(n)} ({what})" for _, n, what in group if n)
            raise DownloadError(f"not enough disk space: {parts} = {human_size(total)} must fit on the "
                                f"filesystem of {where}, which has {human_size(free)} free")


def digest(path: str, algorithm: str) -> str:
    """The hex digest of a file: "sha256", or "git-sha1" (the git object id of a blob, which the hub lists
    for files not in LFS)."""
    git = algorithm == "git-sha1"
    h = hashlib.sha1(b"blob %d\0" % os.path.getsize(path)) if git else hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def unzipped_size(path: str) -> int:
    """The size of a .gz file decompressed (read through, so its CRC and length are checked: a damaged file
    raises one of GZIP_ERRORS)."""
    size = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            size += len(chunk)
    return size


def _copy_stream(src: IO[bytes], out: IO[bytes], raw: IO[bytes], bar: tqdm) -> None:
    """Copies `src` to `out`, advancing `bar` by the bytes read from `raw`, the file under `src`."""
    done = raw.tell()
    while chunk := src.read(CHUNK):
        out.write(chunk)
        bar.update(raw.tell() - done)
        done = raw.tell()


def _write(tmp: str, dest: Path, sources: Sequence[str]) -> None:
    if len(sources) == 1 and not sources[0].endswith(".gz"):
        try:
            os.unlink(tmp)
            os.link(os.path.realpath(sources[0]), tmp)
        except OSError:
            shutil.copyfile(sources[0], tmp)
        return
    total = sum(os.path.getsize(s) for s in sources)
    with open(tmp, "wb") as out, tqdm(total=total, unit="B", unit_scale=True,
                                      desc=f"write {dest.name}") as bar:
        for source in sources:
            with open(source, "rb") as raw:
                if source.endswith(".gz"):
                    with gzip.GzipFile(fileobj=raw) as unzipped:
                        _copy_stream(unzipped, out, raw, bar)
                else:
                    _copy_stream(raw, out, raw, bar)
        out.flush()
        os.fsync(out.fileno())


def make_file(dest: Path, sources: Sequence[str]) -> None:
    """Writes `dest` from cached files: a hard link to one plain file (a copy across filesystems), else the
    files concatenated, each decompressed when it ends in .gz. Written to a unique hidden file beside `dest`
    and renamed into place, so `dest` is never half-written; that file is removed on any failure, and those
    a killed run left are removed first (the caller holds the folder's lock: no one else writes them)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in [*dest.parent.glob(f".{dest.name}.*{PARTIAL}"), dest.with_name(f".{dest.name}{PARTIAL}")]:
        stale.unlink(missing_ok=True)
    fd, tmp = _new_partial(dest)
    os.close(fd)
    try:
        _write(tmp, dest, sources)
        os.replace(tmp, dest)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise DownloadError(f"no space left on the device while writing {dest} (the partial file is "
                                f"removed): free space there and run again") from None
        raise
    finally:
        Path(tmp).unlink(missing_ok=True)

