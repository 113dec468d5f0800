"""The state layer (``batchclient._state``): databases opened with the library's rules, and
schemas migrated in order, once, in one transaction; databases made before schema versions were
recorded open with their data intact."""

from __future__ import annotations

import hashlib
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchclient._state import Database, Migration, Schema, StateVersionError, add_columns
from batchclient.batchapi._parts import RemoteIds
from batchclient.cache import ResultCache
from batchclient.jobs._store import DB_NAME, JobRow, ResultRow, Store
from batchclient.server._idempotency import IdempotencyKeys

# The tables as batchclient made them before schema versions were recorded (copied from the
# stores of that release: jobs, remote Batch API, result cache, server idempotency keys).
BEFORE_VERSIONS = """
CREATE TABLE IF NOT EXISTS files(
    id TEXT PRIMARY KEY, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL, purpose TEXT NOT NULL, sha256 TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS files_sha256 ON files(sha256);
CREATE TABLE IF NOT EXISTS jobs(
    id TEXT PRIMARY KEY, input_file_id TEXT NOT NULL, endpoint TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    in_progress_at INTEGER, expires_at INTEGER, finalizing_at INTEGER, completed_at INTEGER,
    failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0, metadata TEXT, errors TEXT,
    output_file_id TEXT, error_file_id TEXT, model TEXT,
    identity TEXT NOT NULL, seed_job_id TEXT, owner TEXT, heartbeat_at REAL);
CREATE TABLE IF NOT EXISTS results(
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, custom_id TEXT NOT NULL, ok INTEGER NOT NULL,
    status_code INTEGER, error TEXT, line TEXT NOT NULL,
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(job_id, seq));
CREATE TABLE IF NOT EXISTS job_lines(
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, custom_id TEXT NOT NULL, same_as INTEGER,
    repeat INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(job_id, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS job_lines_same_as ON job_lines(job_id, same_as);
CREATE TABLE IF NOT EXISTS remote_parts(
    job_id TEXT NOT NULL, part INTEGER NOT NULL, first_seq INTEGER NOT NULL,
    count INTEGER NOT NULL, attempt INTEGER NOT NULL DEFAULT 1, state TEXT NOT NULL,
    input_file_id TEXT, batch_id TEXT, remote_status TEXT,
    completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(job_id, part));
CREATE TABLE IF NOT EXISTS remote_calls(
    call_key TEXT PRIMARY KEY, job_id TEXT NOT NULL, delivered INTEGER NOT NULL DEFAULT 0);
"""
CACHE_COLUMNS = """
ALTER TABLE jobs ADD COLUMN cache INTEGER;
ALTER TABLE jobs ADD COLUMN cache_hits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN cached INTEGER NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS result_cache(
    key TEXT PRIMARY KEY, endpoint TEXT NOT NULL, model TEXT NOT NULL,
    status_code INTEGER NOT NULL, body BLOB NOT NULL, created_at REAL NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0, hit_at REAL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS result_cache_model ON result_cache(model, created_at);
CREATE INDEX IF NOT EXISTS result_cache_created ON result_cache(created_at);
"""
IDEMPOTENCY = (
    "CREATE TABLE IF NOT EXISTS idempotency(key TEXT PRIMARY KEY, "
    "body TEXT NOT NULL, batch_id TEXT NOT NULL, created_at REAL NOT NULL)"
)
LINE = '{"id": "r", "custom_id": "a", "response": {"status_code": 200, "body": {"x": 1}}}'


def old_database(state: Path, *, with_cache: bool) -> None:
    """A state directory as the release before schema versions left it, with one of each row."""
    state.mkdir(mode=0o700)
    with sqlite3.connect(state / DB_NAME) as db:
        db.executescript(BEFORE_VERSIONS + (CACHE_COLUMNS if with_cache else ""))
        db.execute("INSERT INTO files VALUES ('file-1', 'in.jsonl', 10, 1, 'batch', 'abc')")
        db.execute(
            "INSERT INTO jobs (id, input_file_id, endpoint, completion_window, status, "
            "created_at, total, completed, metadata, identity, model) VALUES ('batch_1', "
            "'file-1', '/v1/chat/completions', '24h', 'completed', 2, 1, 1, '{\"k\": \"v\"}', "
            "'{}', 'smollm2')"
        )
        db.execute(
            "INSERT INTO results (job_id, seq, custom_id, ok, status_code, line) "
            "VALUES ('batch_1', 0, 'a', 1, 200, ?)",
            (LINE,),
        )
        db.execute(
            "INSERT INTO remote_parts (job_id, part, first_seq, count, state, batch_id) "
            "VALUES ('batch_1', 0, 0, 1, 'collected', 'remote_9')"
        )
        db.execute("INSERT INTO remote_calls VALUES ('call-1', 'batch_1', 1)")
        if with_cache:
            db.execute(
                "INSERT INTO result_cache (key, endpoint, model, status_code, body, created_at) "
                "VALUES ('k1', '/v1/completions', 'smollm2', 200, '{\"y\": 2}', ?)",
                (time.time(),),
            )
    with sqlite3.connect(state / "server.sqlite3") as db:
        db.execute(IDEMPOTENCY)
        digest = hashlib.sha256(b"key-1").hexdigest()
        db.execute("INSERT INTO idempotency VALUES (?, 'body', 'batch_1', ?)", (digest, 1e10))


def versions(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT name, version FROM schema_versions").fetchall())


@pytest.mark.parametrize("with_cache", [True, False], ids=["with-cache", "first-release"])
def test_a_database_made_before_schema_versions_opens_with_its_data(
    tmp_path: Path, with_cache: bool
) -> None:
    state = tmp_path / "state"
    old_database(state, with_cache=with_cache)
    store = Store(state)
    try:
        job = store.get_job("batch_1")
        assert (job.status, job.metadata, job.cache_hits, job.model) == (
            "completed",
            {"k": "v"},
            0,
            "smollm2",
        )
        row = store.job_row("batch_1")
        assert isinstance(row, JobRow) and row.cache is None and row.total == 1
        assert row.owner_kernel is None  # a lease from before lock files: the old rules
        assert store.list_files()[0].id == "file-1" and store.file_sha256("file-1") == "abc"
        [result] = list(store.iter_results("batch_1"))
        assert isinstance(result, ResultRow) and result.body == {"x": 1} and not result.cached
        ids = RemoteIds(store)
        [part] = ids.parts("batch_1")
        assert (part.state, part.batch_id, part.attempt) == ("collected", "remote_9", 1)
        call = ids.call("call-1")
        assert call is not None and (call.job_id, call.delivered) == ("batch_1", True)
        store.commit_results("batch_1", [ResultRow(1, "b", True, 200, None, None, cached=True)])
        assert store.get_job("batch_1").cache_hits == 1  # the added columns are in use
        cached = ResultRow(2, "c", True, 200, None, None, input_tokens=9, cached_tokens=7)
        store.commit_results("batch_1", [cached])
        assert store.get_job("batch_1").usage.input_tokens_details.cached_tokens == 7
    finally:
        store.close()
    cache = ResultCache(state / DB_NAME)
    hit = cache.get("k1")
    assert (hit.body if hit else None) == ({"y": 2} if with_cache else None)
    cache.close()
    keys = IdempotencyKeys(state)
    assert keys.lookup("key-1", "body") == "batch_1"
    keys.close()
    assert versions(state / DB_NAME) == {"jobs": 9, "batchapi": 2, "result_cache": 1}
    assert versions(state / "server.sqlite3") == {"idempotency": 1}
    Store(state).close()  # opening again applies nothing and loses nothing
    assert Store(state).get_job("batch_1").request_counts.completed == 3


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_database_is_private_in_a_private_directory(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "x.sqlite3"
    db = Database(path, [Schema("t", (Migration(1, "CREATE TABLE t(x)"),))])
    db.write("INSERT INTO t VALUES (1)")
    assert _mode(path.parent) == 0o700 and _mode(path) == 0o600
    assert db.one("PRAGMA journal_mode")[0] == "wal"  # type: ignore[index]
    assert db.one("PRAGMA busy_timeout")[0] == 30_000  # type: ignore[index]
    assert all(_mode(p) == 0o600 for p in path.parent.iterdir())  # -wal and -shm too
    db.close()


def test_opening_a_database_again_keeps_this_processs_locks(tmp_path: Path) -> None:
    """A second :class:`Database` on a file this process holds open must not open the file
    itself: closing that descriptor would drop this process's POSIX locks, and another process's
    connection, closing, would take itself for the last one and delete the WAL under ours (the
    next read fails with "disk I/O error")."""
    path = tmp_path / "x.sqlite3"
    first = Database(path, [Schema("t", (Migration(1, "CREATE TABLE t(x)"),))])
    first.write("INSERT INTO t VALUES (1)")
    second = Database(path)
    other = f"import sqlite3; c = sqlite3.connect({str(path)!r}); c.execute('SELECT x FROM t')"
    subprocess.run([sys.executable, "-c", other], check=True, timeout=60)
    assert path.with_name(path.name + "-wal").exists()
    first.write("INSERT INTO t VALUES (2)")
    assert second.one("SELECT count(*) FROM t")[0] == 2  # type: ignore[index]
    first.close()
    second.close()


def test_migrations_run_in_order_once_and_only_the_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite3"
    calls: list[int] = []

    def step(n: int) -> Migration:
        def apply(db: sqlite3.Connection) -> None:
            calls.append(n)
            db.execute(f"INSERT INTO log VALUES ({n})")

        return Migration(n, apply)

    first = Schema("log", (Migration(1, "CREATE TABLE log(n INTEGER)"), step(2)))
    Database(path, [first]).close()
    Database(path, [first]).close()
    later = Schema("log", (*first.migrations, step(3), Migration(4, add_columns("log", "m INT"))))
    db = Database(path, [later])
    assert calls == [2, 3]
    assert [r[0] for r in db.all("SELECT n FROM log")] == [2, 3]
    assert [r[1] for r in db.all("PRAGMA table_info(log)")] == ["n", "m"]
    db.close()
    assert versions(path) == {"log": 4}


def test_a_failing_migration_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite3"
    Database(path, [Schema("a", (Migration(1, "CREATE TABLE a(x)"),))]).close()
    broken = Schema(
        "a",
        (
            Migration(1, "CREATE TABLE a(x)"),
            Migration(2, "CREATE TABLE b(y); INSERT INTO a VALUES (1)"),
            Migration(3, "INSERT INTO no_such_table VALUES (1)"),
        ),
    )
    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        Database(path, [broken])
    db = Database(path)
    assert db.all("SELECT * FROM a") == [] and versions(path) == {"a": 1}
    assert db.one("SELECT name FROM sqlite_master WHERE name = 'b'") is None
    db.close()


def test_schemas_share_a_file_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite3"
    one = Schema("one", (Migration(1, "CREATE TABLE one(x)"),))
    two = Schema("two", (Migration(1, "CREATE TABLE two(x)"), Migration(2, "SELECT 1")))
    Database(path, [one, two]).close()
    assert versions(path) == {"one": 1, "two": 2}
    older_two = Schema("two", two.migrations[:1])
    with pytest.raises(StateVersionError, match="two tables are at version 2"):
        Database(path, [older_two])
    with pytest.raises(ValueError, match="numbered"):
        Schema("bad", (Migration(2, "SELECT 1"),))


def test_opening_a_current_database_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite3"
    schema = Schema("t", (Migration(1, "CREATE TABLE t(x)"),))
    Database(path, [schema]).close()
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # a long write elsewhere (a job committing, say)
    writer.execute("INSERT INTO t VALUES (1)")
    started = time.monotonic()
    reader = Database(path, [schema])  # `batchclient jobs status` beside a run
    assert time.monotonic() - started < 5 and reader.all("SELECT * FROM t") == []
    reader.close()
    writer.execute("ROLLBACK")
    writer.close()
