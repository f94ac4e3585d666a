"""A run owns its workdir: `<workdir>/run.lock` names the run holding it (host, pid, start time), so that a
second run on the same workdir stops with an error naming the holder instead of resuming from the first run's
checkpoint, replacing its metrics file and racing its saves.

Whether the holder still runs is the kernel's to say, not its pid's: the holder keeps an exclusive
`fcntl.flock` on `<workdir>/run.lock.guard` for as long as it holds the workdir, and the kernel drops that
lock when the process ends, however it ends (SIGKILL included). A pid says nothing after a restart: a
restarted container runs in a fresh PID namespace, where the new trainer is pid 1 again, the pid its dead
predecessor's lock names. So a lock whose guard is free is stale, whatever pid it names, and is taken over
with a warning; a lock whose guard is held belongs to a live run, in this container or another one on this
host. A lock written on another host is never taken over (its holder's flock may not reach this host's
kernel): remove the file by hand once that run is known to be gone.

The guard file is never deleted (a lock on a file that a path no longer names would guard nothing), and it is
closed in a process forked from the holder, so that only the holder keeps the workdir.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LOCK = "run.lock"
GUARD = "run.lock.guard"

log = logging.getLogger(__name__)
_HELD: set[int] = set()  # this process's guard descriptors, closed in its forked children


def _close_in_child() -> None:
    for fd in _HELD:
        os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class WorkdirInUseError(RuntimeError):
    """Another live run holds the workdir."""


def holder_info() -> dict[str, Any]:
    """Who this process is, as a lock file records it; `token` tells two runs of one process apart."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "token": uuid.uuid4().hex}


def describe(holder: Mapping[str, Any]) -> str:
    """`holder` as a sentence fragment: "pid 123 on host h (started 2025-01-01T00:00:00+00:00)"."""
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} "
            f"(started {holder.get('started', '?')})")


def read_holder(path: Path) -> dict[str, Any] | None:
    """The holder recorded in the lock file `path`; None when it is gone; {} when it cannot be parsed."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _write(path: Path, holder: Mapping[str, Any]) -> None:
    """Writes `holder` to `path` atomically (a reader sees the old file or the new one, never a torn one)."""
    tmp = path.with_name(f"{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(dict(holder), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class WorkdirLock:
    """The lock of one run on `workdir`, held from `acquire` until `release`."""

    def __init__(self, workdir: str | os.PathLike, holder: Mapping[str, Any], guard: int | None = None):
        self.path = Path(workdir) / LOCK
        self.holder = dict(holder)
        self._guard = guard  # the descriptor holding the flock on GUARD while the workdir is this run's

    @classmethod
    def acquire(cls, workdir: str | os.PathLike) -> WorkdirLock:
        """Takes `workdir` for this process (creating it), taking over a stale lock with a warning; raises
        WorkdirInUseError naming the holder if another live run holds it (or one on another host may)."""
        directory = Path(workdir)
        directory.mkdir(parents=True, exist_ok=True)
        path, holder = directory / LOCK, holder_info()
        guard = os.open(directory / GUARD, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
                other, live = read_holder(path), False
            except BlockingIOError:
                other, live = read_holder(path) or {}, True
            if live or (other is not None and other.get("host") != holder["host"]):
                who = describe(other) if other else "a run whose lock file is unreadable"
                raise WorkdirInUseError(
                    f"workdir {directory} is in use by {who}: {path} names it. Two runs on one workdir "
                    "would resume from each other's checkpoints and overwrite each other's metrics. Use "
                    f"another --config.workdir, or delete {path} if that run is gone.")
            if other is not None:
                log.warning("workdir %s: taking over the stale lock of %s, which no longer runs", directory,
                            describe(other))
            _write(path, holder)
        except BaseException:
            os.close(guard)  # drops the flock, if it was taken
            raise
        _HELD.add(guard)
        return cls(directory, holder, guard)

    def release(self) -> None:
        """Removes the lock file if it is still this run's (never another run's), then lets the workdir go."""
        if read_holder(self.path) == self.holder:
            self.path.unlink(missing_ok=True)
        if self._guard is not None:
            _HELD.discard(self._guard)
            os.close(self._guard)
            self._guard = None

    def __enter__(self) -> WorkdirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
