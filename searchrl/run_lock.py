"""A run owns its workdir: `<workdir>/run.lock` names the run holding it (host, pid, start time), so that a
second run on the same workdir stops with an error naming the holder instead of resuming from the first run's
checkpoint, replacing its metrics file and racing its saves.

The lock file is created exclusively (`O_EXCL`). A lock left by a process of this host that no longer exists
(a crashed or killed run) is stale: it is taken over, with a warning. A lock held by another host cannot be
checked from here and is never taken over: remove the file by hand once that run is known to be gone.
Acquiring holds an `fcntl.flock` on `<workdir>/run.lock.guard` so that two runs taking over one stale lock at
the same moment cannot both win.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

LOCK = "run.lock"
GUARD = "run.lock.guard"

log = logging.getLogger(__name__)


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


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this host (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(holder: Mapping[str, Any], host: str) -> bool:
    """A lock is stale when it was taken on `host` (this one) by a process that no longer exists."""
    pid = holder.get("pid")
    return holder.get("host") == host and isinstance(pid, int) and pid > 0 and not pid_alive(pid)


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


@contextlib.contextmanager
def _guard(workdir: Path) -> Iterator[None]:
    with open(workdir / GUARD, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _create(path: Path, holder: Mapping[str, Any]) -> bool:
    """Writes `holder` to a new file `path`; False if the file exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(dict(holder), f)
        f.flush()
        os.fsync(f.fileno())
    return True


class WorkdirLock:
    """The lock of one run on `workdir`, held from `acquire` until `release`."""

    def __init__(self, workdir: str | os.PathLike, holder: Mapping[str, Any]):
        self.path = Path(workdir) / LOCK
        self.holder = dict(holder)

    @classmethod
    def acquire(cls, workdir: str | os.PathLike) -> WorkdirLock:
        """Takes `workdir` for this process (creating it), taking over a stale lock with a warning; raises
        WorkdirInUseError naming the holder if another run holds it."""
        directory = Path(workdir)
        directory.mkdir(parents=True, exist_ok=True)
        lock = cls(directory, holder_info())
        with _guard(directory):
            while not _create(lock.path, lock.holder):
                other = read_holder(lock.path)
                if other is None:  # released in between
                    continue
                if not is_stale(other, lock.holder["host"]):
                    who = describe(other) if other else "a run whose lock file is unreadable"
                    raise WorkdirInUseError(
                        f"workdir {directory} is in use by {who}: {lock.path} names it. Two runs on one "
                        "workdir would resume from each other's checkpoints and overwrite each other's "
                        f"metrics. Use another --config.workdir, or delete {lock.path} if that run is gone.")
                log.warning("workdir %s: taking over the stale lock of %s, which no longer runs", directory,
                            describe(other))
                lock.path.unlink()
        return lock

    def release(self) -> None:
        """Removes the lock file if it is still this run's (never another run's)."""
        if read_holder(self.path) == self.holder:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> WorkdirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
