"""The SQL sandbox: the function allow-list, fetch limits, and a worker process that is killed when a query
overruns and started again for the next one."""
import sqlite3
import time

import pytest

from searchrl.tasks.deepretrieval import sql_sandbox as sb

NUMBERS = "WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n LIMIT {}) "
# Quadratic in its arguments inside one VM step: minutes, whatever the deadline inside SQLite.
SLOW_TRIM = "SELECT trim(printf('%.*c', 300000, 'a'), printf('%.*c', 150000, 'b') || 'a')"


@pytest.fixture
def db_uri(tmp_path):
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as conn:
        conn.executescript("CREATE TABLE t(i INTEGER, s TEXT);"
                           "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c');")
    conn.close()
    return f"{path.as_uri()}?mode=ro&immutable=1"


@pytest.fixture
def worker():
    worker = sb.Worker(sqlite_heap_bytes=64 << 20, kill_grace_s=0.3)
    yield worker
    worker.close()


LIMITS = sb.Limits(timeout_s=5.0, max_rows=100, max_result_bytes=1_000_000)


@pytest.mark.parametrize("name, allowed", [
    ("count", True), ("COUNT", True), ("strftime", True), ("row_number", True), ("like", True),
    ("fts3_tokenizer", False), ("load_extension", False), ("zeroblob", False), ("randomblob", False),
    ("sqlite_version", False), ("json_extract", False), (None, False),
])
def test_functions_are_allowed_by_name(name, allowed):
    expected = sqlite3.SQLITE_OK if allowed else sqlite3.SQLITE_DENY
    assert sb.authorize(sqlite3.SQLITE_FUNCTION, None, name, None, None) == expected
    assert sb.authorize(sqlite3.SQLITE_READ, "t", "i", "main", None) == sqlite3.SQLITE_OK
    assert sb.authorize(sqlite3.SQLITE_PRAGMA, "temp_store", None, None, None) == sqlite3.SQLITE_DENY


def test_execute_limits(db_uri):
    assert sb.execute(db_uri, "SELECT i FROM t ORDER BY i", LIMITS) == [(1,), (2,), (3,)]
    with pytest.raises(sb.SqlError, match="more than 2 rows"):
        sb.execute(db_uri, "SELECT i FROM t", sb.Limits(5.0, 2, 1_000_000))
    with pytest.raises(sb.SqlError, match="more than 100000 bytes"):
        sb.execute(db_uri, "SELECT printf('%.*c', 40000 + i, 'x') FROM t", sb.Limits(5.0, 100, 100_000))
    with pytest.raises(sqlite3.DataError, match="too big"):
        sb.execute(db_uri, "SELECT printf('%.*c', 10000, 'x') || printf('%.*c', 9999999, 'x')", LIMITS)
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        sb.execute(db_uri, NUMBERS.format(10**9) + "SELECT count(*) FROM n", sb.Limits(0.1, 100, 1_000_000))
    with pytest.raises(sqlite3.DatabaseError, match="not authorized to use function: fts3_tokenizer"):
        sb.execute(db_uri, "SELECT fts3_tokenizer('simple')", LIMITS)


def test_error_messages_are_short():
    assert sb.error_message(MemoryError()) == "MemoryError"
    assert sb.error_message(ValueError("x" * 1000)) == "x" * 300 + "..."


def test_worker_answers_and_passes_errors_on(worker, db_uri):
    assert worker.run(db_uri, "SELECT s FROM t WHERE i = 2", LIMITS) == [("b",)]
    with pytest.raises(sb.SqlError, match="no such column: nope"):
        worker.run(db_uri, "SELECT nope FROM t", LIMITS)
    with pytest.raises(sb.SqlError, match="surrogates not allowed"):
        worker.run(db_uri, "SELECT '\ud800'", LIMITS)
    assert worker.run(db_uri, "SELECT count(*) FROM t", LIMITS) == [(3,)]


def test_a_slow_single_call_kills_the_worker_and_the_next_query_gets_a_new_one(worker, db_uri):
    start = time.perf_counter()
    with pytest.raises(sb.SqlError, match=r"timed out after 0.5s; the SQL worker was stopped"):
        worker.run(db_uri, SLOW_TRIM, sb.Limits(0.2, 100, 1_000_000))
    assert time.perf_counter() - start < 2.0
    assert worker.run(db_uri, "SELECT count(*) FROM t", LIMITS) == [(3,)]


def test_a_dead_worker_fails_one_query_and_is_replaced(worker, db_uri):
    worker.run(db_uri, "SELECT 1", LIMITS)
    worker._proc.kill()
    worker._proc.wait()
    with pytest.raises(sb.SqlError, match="the SQL worker died"):
        worker.run(db_uri, "SELECT 1", LIMITS)
    assert worker.run(db_uri, "SELECT 1", LIMITS) == [(1,)]


def test_sqlite_memory_in_the_worker_is_capped(worker, db_uri):
    # 20 sorted values of 4 MB need 80 MB of SQLite's heap; the worker allows 64 MB.
    sort = NUMBERS.format(20) + ("SELECT length(x) FROM "
                                 "(SELECT printf('%.*c', 4000000 + k, 'x') AS x FROM n ORDER BY x)")
    with pytest.raises(sb.SqlError, match="MemoryError|out of memory"):
        worker.run(db_uri, sort, sb.Limits(10.0, 100, 1_000_000))
    assert worker.run(db_uri, "SELECT count(*) FROM t", LIMITS) == [(3,)]
