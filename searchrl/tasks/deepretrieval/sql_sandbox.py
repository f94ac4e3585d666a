"""Model-written SQL, run read-only in a worker process that is stopped when it overruns.

In the worker, `execute` runs one statement on an immutable read-only connection: an authorizer allows
reads and the functions of `ALLOWED_FUNCTIONS` only (no writes, ATTACH, PRAGMA, `load_extension`,
`fts3_tokenizer`, `zeroblob`, ...); a string or blob holds at most `MAX_VALUE_BYTES`; a progress handler
checks the deadline every `PROGRESS_STEPS` VM steps; fetching stops past `max_rows` rows or
`max_result_bytes` bytes. SQLite's heap in the worker is capped (a process-wide setting, which is one reason
for the worker) and so is the worker's address space.

A single SQL function call is one VM step, which no deadline inside SQLite can stop, and some calls take
long whatever the length limit: `instr`, `replace` and two-argument `trim` are quadratic in their arguments
(minutes on a few hundred kB), and SQLite 3.40's `printf('%.*c', n, 'x')` loops n times (0.7 s for n = 10**8)
after its result has outgrown the limit. So the parent waits `timeout_s + kill_grace_s` for an answer, then
kills the worker and starts a new one for the next query.
The worker is a plain script run by file path (`python -I`), importing the standard library only.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import pickle
import queue
import resource
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

MAX_VALUE_BYTES = 10_000_000  # the largest string or blob one SQL value may hold
PROGRESS_STEPS = 100  # VM steps between deadline checks
START_TIMEOUT_S = 60.0  # how long a new worker may take to start
_ERROR_CHARS = 300  # the longest error message passed on

# SQLite's ordinary functions (those Spider / BIRD queries use, and their kin); all others are denied.
ALLOWED_FUNCTIONS = frozenset({
    # aggregate and window
    "avg", "count", "group_concat", "max", "min", "sum", "total",
    "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead",
    "first_value", "last_value", "nth_value",
    # scalar and string
    "abs", "char", "coalesce", "format", "glob", "hex", "ifnull", "iif", "instr", "length", "like",
    "likelihood", "likely", "lower", "ltrim", "nullif", "printf", "quote", "replace", "round", "rtrim",
    "sign", "soundex", "substr", "substring", "trim", "typeof", "unicode", "unlikely", "upper",
    # date and time
    "date", "time", "datetime", "julianday", "strftime", "unixepoch",
    "current_date", "current_time", "current_timestamp",
    # math
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "ceiling", "cos", "cosh", "degrees",
    "exp", "floor", "ln", "log", "log10", "log2", "mod", "pi", "pow", "power", "radians", "sin", "sinh",
    "sqrt", "tan", "tanh", "trunc",
})
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per query: wall-clock limit, the most rows, the most bytes of fetched values."""

    timeout_s: float
    max_rows: int
    max_result_bytes: int


class SqlError(Exception):
    """A query that failed in the worker (or killed it); the message says why."""


def authorize(action: int, arg1: str | None, arg2: str | None, *_: Any) -> int:
    """sqlite3 authorizer: reads, and calls of the allowed functions (SQLITE_FUNCTION's second argument is
    the function's name)."""
    if action == sqlite3.SQLITE_FUNCTION:
        return sqlite3.SQLITE_OK if (arg2 or "").lower() in ALLOWED_FUNCTIONS else sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def row_bytes(row: tuple) -> int:
    """The memory one fetched row holds: the sizes of its values as Python objects."""
    return sum(map(sys.getsizeof, row))


def fetch(cursor: sqlite3.Cursor, limits: Limits) -> list[tuple]:
    """The rows of an executed query, one at a time; raises SqlError past max_rows or max_result_bytes."""
    rows, size = [], 0
    for row in cursor:
        size += row_bytes(row)
        if size > limits.max_result_bytes:
            raise SqlError(f"the result holds more than {limits.max_result_bytes} bytes")
        if len(rows) == limits.max_rows:
            raise SqlError(f"query returned more than {limits.max_rows} rows")
        rows.append(row)
    return rows


def execute(db_uri: str, sql: str, limits: Limits) -> list[tuple]:
    """Runs one read-only statement in this process (the worker's side); raises on any failure."""
    # immutable: no locks and no -wal/-shm files; temporary tables and sorts stay in memory.
    conn = sqlite3.connect(db_uri, uri=True)
    try:
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.set_authorizer(authorize)
        deadline = time.monotonic() + limits.timeout_s
        conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
        return fetch(conn.execute(sql), limits)
    finally:
        conn.close()


def error_message(error: BaseException) -> str:
    """A short message for an exception (its type when it has no message)."""
    message = str(error) or type(error).__name__
    return message if len(message) <= _ERROR_CHARS else message[:_ERROR_CHARS] + "..."


def _serve(fd: int, sqlite_heap_bytes: int, memory_bytes: int) -> None:
    """The worker: answers (db_uri, sql, limits) requests with ("ok", rows) or ("error", message) until
    its parent closes the connection."""
    with contextlib.suppress(ValueError, OSError):  # not every platform lets a process set it
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    with contextlib.closing(sqlite3.connect(":memory:")) as memory:
        memory.execute(f"PRAGMA hard_heap_limit = {sqlite_heap_bytes}")  # for the whole worker process
    conn = Connection(fd)
    conn.send(("ready", None))
    while True:
        try:
            db_uri, sql, limits = conn.recv()
        except EOFError:
            return
        try:
            reply = ("ok", execute(db_uri, sql, Limits(*limits)))
        except Exception as e:  # noqa: BLE001 -- every failure of model SQL is an answer, not a crash
            reply = ("error", error_message(e))
        conn.send(reply)


class Worker:
    """The parent's handle on one worker process, started on first use and again after a kill.

    sqlite_heap_bytes caps SQLite's heap in the worker, memory_bytes its address space; kill_grace_s is how
    long past a query's deadline the parent waits before it kills the worker.
    """

    def __init__(self, sqlite_heap_bytes: int = 1 << 30, memory_bytes: int = 4 << 30,
                 kill_grace_s: float = 2.0):
        self.sqlite_heap_bytes, self.memory_bytes = sqlite_heap_bytes, memory_bytes
        self.kill_grace_s = kill_grace_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._pid = os.getpid()

    def _start(self) -> Connection:
        """Starts a worker and waits for its ("ready", None)."""
        parent, child = socket.socketpair()
        self._conn = Connection(parent.detach())
        with child:
            try:
                args = (child.fileno(), self.sqlite_heap_bytes, self.memory_bytes)
                self._proc = subprocess.Popen([sys.executable, "-I", __file__, *map(str, args)],
                                              pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
            except OSError:
                self.close()
                raise
        self._receive(START_TIMEOUT_S)
        return self._conn

    def _receive(self, timeout_s: float) -> tuple[str, Any]:
        """The worker's next message; kills the worker when it takes longer than `timeout_s` or dies."""
        try:
            if self._conn.poll(timeout_s):
                return self._conn.recv()
            error = f"timed out after {timeout_s:.1f}s; the SQL worker was stopped"
        except (EOFError, OSError, pickle.UnpicklingError) as e:
            error = f"the SQL worker died ({error_message(e)})"
        self.close()
        raise SqlError(error)

    def run(self, db_uri: str, sql: str, limits: Limits) -> list[tuple]:
        """The rows of one query; raises SqlError when it fails, overruns or kills the worker."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its parent's worker is not its own
                self._proc, self._conn, self._pid = None, None, os.getpid()
            conn = self._conn or self._start()
            try:
                conn.send((db_uri, sql, dataclasses.astuple(limits)))
            except OSError as e:
                self.close()
                raise SqlError(f"the SQL worker died ({error_message(e)})") from e
            status, payload = self._receive(limits.timeout_s + self.kill_grace_s)
        if status != "ok":
            raise SqlError(payload)
        return payload

    def close(self) -> None:
        """Stops the worker (a new one starts on the next query)."""
        if self._conn is not None:
            self._conn.close()
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._proc, self._conn = None, None


class WorkerPool:
    """Up to `size` workers, so that concurrent callers (a batch's rewards) run their queries in parallel:
    each query takes an idle worker, starting one while fewer than `size` exist."""

    def __init__(self, size: int, **worker_settings: Any):
        self.size, self.worker_settings = size, worker_settings
        self._idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        self._workers: list[Worker] = []
        self._lock = threading.Lock()

    def _take(self) -> Worker:
        with self._lock:
            if self._idle.empty() and len(self._workers) < self.size:
                self._workers.append(Worker(**self.worker_settings))
                return self._workers[-1]
        return self._idle.get()

    def run(self, db_uri: str, sql: str, limits: Limits) -> list[tuple]:
        """`Worker.run` on an idle worker."""
        worker = self._take()
        try:
            return worker.run(db_uri, sql, limits)
        finally:
            self._idle.put(worker)

    def close(self) -> None:
        for worker in self._workers:
            worker.close()


WORKER = WorkerPool(min(os.cpu_count() or 1, 8))
atexit.register(WORKER.close)

WORKER_USAGE = ("usage: python -I sql_sandbox.py FD SQLITE_HEAP_BYTES MEMORY_BYTES\n"
                "The SQL worker a `Sandbox` starts on a socket it passes (FD); no command of its own.")


if __name__ == "__main__":
    if sys.argv[1:] in (["--help"], ["-h"]):
        print(WORKER_USAGE)
    elif len(sys.argv) != 4 or not all(arg.isdigit() for arg in sys.argv[1:]):
        sys.exit(f"{WORKER_USAGE}\nerror: expected three integers, got {sys.argv[1:]}")
    else:
        _serve(*map(int, sys.argv[1:]))
