"""The durable state of files and jobs: one SQLite database (stdlib ``sqlite3``, WAL) in the state
directory, plus the files themselves under ``files/``.

Tables: ``files`` (the OpenAI file records and each file's SHA-256), ``jobs`` (the OpenAI batch
record, the provider identity that may resume it, and a lease: ``owner`` + ``heartbeat_at``),
``results`` (one row per finished request line, keyed by ``(job_id, seq)``, holding the line of
the output or error file it becomes, serialised once when it is committed, so that writing the
files at the end only concatenates text) and ``job_lines`` (the lines of a job that are not sent
as they are: ``same_as`` an identical greedy line earlier in the file, whose answer they get, or
a ``repeat`` index > 0 for the k-th identical sampled line). Jobs run on a remote Batch API
(``batchclient.batchapi``) also use ``remote_parts`` (each remote batch a job owns: its range of
input lines, remote file and batch ids, last seen status and request counts) and
``remote_calls`` (the job behind each call, by content key, so a repeated call re-attaches). The
result cache keeps its own table in the same database (:mod:`batchclient.cache`). Tables are
created with ``IF NOT EXISTS`` and columns added since the first release are added to older
databases when they are opened.

Durability: WAL with ``synchronous=NORMAL``: a committed result survives the death of the
process (SIGKILL included; the WAL is in the OS page cache), not a power cut. Request counts are
updated in the same transaction as the rows they count, so they can never disagree with them.

One connection, used from worker threads (``anyio.to_thread``) under a lock; other processes
(``batchclient jobs status`` while a run goes on) read through their own connections, which WAL
allows alongside the writer.

Privacy: the state holds every prompt and answer, so the directory is created ``0700`` and
``files/`` is kept ``0700``; the database and every stored file are ``0600`` (SQLite gives its
``-wal`` and ``-shm`` files the database's mode). A state directory that already exists keeps
its own mode (it may be a directory the caller chose for other things too).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import FileNotFoundInStoreError, JobNotFoundError
from ..types import (
    Batch,
    BatchError,
    BatchErrors,
    BatchItemError,
    BatchRequestCounts,
    BatchUsage,
    FileObject,
)

DB_NAME = "batchclient.sqlite3"
_SCHEMA = """
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
_ADDED_COLUMNS = {
    "jobs": ("cache INTEGER", "cache_hits INTEGER NOT NULL DEFAULT 0"),
    "results": ("cached INTEGER NOT NULL DEFAULT 0",),
}
_RESULT_COLUMNS = (
    "job_id, seq, custom_id, ok, status_code, error, line, input_tokens, output_tokens, cached"
)
_TIMESTAMPS = (
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL = ("completed", "failed", "expired", "cancelled")
_CHUNK = 1000


def now() -> int:
    return int(time.time())


@dataclass(slots=True)
class ResultRow:
    """One finished request line. ``ok`` is the verdict counted in ``request_counts``;
    ``line`` the JSON text of its output/error file line (set before committing); ``cached``
    whether the result cache gave it; ``merged`` (not stored) that it is the answer of an
    identical line, so it is not counted again in the job's ``cache_hits``. Tokens count what
    was generated for this job (0 for a cache hit or a copy of an identical line's answer)."""

    seq: int
    custom_id: str
    ok: bool
    status_code: int | None
    body: dict[str, Any] | None
    error: BatchItemError | None
    request_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    line: str = ""
    cached: bool = False
    merged: bool = False


class Store:
    """The SQLite database of one state directory. Thread-safe; every method is blocking
    (call it through ``anyio.to_thread`` from async code)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.files_dir = state_dir / "files"
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.files_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.files_dir, 0o700)
        db_path = state_dir / DB_NAME
        os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT, 0o600))  # before SQLite creates it
        os.chmod(db_path, 0o600)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            db_path, check_same_thread=False, isolation_level=None, timeout=30
        )
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._opened = _file_id(state_dir / DB_NAME)
        with self._lock, self._tx():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            for table, columns in _ADDED_COLUMNS.items():
                have = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
                for column in columns:
                    if column.split()[0] not in have:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")

    @staticmethod
    def exists(state_dir: Path) -> bool:
        return (state_dir / DB_NAME).exists()

    def check_in_place(self) -> None:
        """Raise ``FileNotFoundError`` when the database this store has open is no longer the
        file at its path (the state directory was moved, removed or replaced under it: what
        is written now would be seen by no other process)."""
        path = self.state_dir / DB_NAME
        if _file_id(path) != self._opened:
            raise FileNotFoundError(
                errno.ENOENT, "the database open here is no longer at this path", str(path)
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)

    def _one(self, sql: str, args: Iterable[Any] = ()) -> sqlite3.Row | None:
        with self._lock:
            row: sqlite3.Row | None = self._db.execute(sql, tuple(args)).fetchone()
            return row

    def _all(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, tuple(args)).fetchall())

    def _write(self, sql: str, args: Iterable[Any] = ()) -> int:
        with self._lock, self._tx():
            return int(self._db.execute(sql, tuple(args)).rowcount)

    # ------------------------------------------------------------------ files

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def add_file(self, record: FileObject, sha256: str) -> None:
        self._write(
            "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?)",
            (record.id, record.filename, record.bytes, record.created_at, record.purpose, sha256),
        )

    def get_file(self, file_id: str) -> FileObject:
        row = self._one("SELECT * FROM files WHERE id = ?", (file_id,))
        if row is None:
            raise FileNotFoundInStoreError(f"no file {file_id!r} in {self.state_dir}")
        return _file(row)

    def file_sha256(self, file_id: str) -> str:
        row = self._one("SELECT sha256 FROM files WHERE id = ?", (file_id,))
        if row is None:
            raise FileNotFoundInStoreError(f"no file {file_id!r} in {self.state_dir}")
        return str(row["sha256"])

    def find_files(self, sha256: str, purpose: str) -> list[FileObject]:
        rows = self._all(
            "SELECT * FROM files WHERE sha256 = ? AND purpose = ? ORDER BY created_at DESC",
            (sha256, purpose),
        )
        return [_file(r) for r in rows]

    def list_files(self, purpose: str | None = None) -> list[FileObject]:
        if purpose is None:
            rows = self._all("SELECT * FROM files ORDER BY created_at DESC, rowid DESC")
        else:
            rows = self._all(
                "SELECT * FROM files WHERE purpose = ? ORDER BY created_at DESC, rowid DESC",
                (purpose,),
            )
        return [_file(r) for r in rows]

    def delete_file(self, file_id: str) -> None:
        if not self._write("DELETE FROM files WHERE id = ?", (file_id,)):
            raise FileNotFoundInStoreError(f"no file {file_id!r} in {self.state_dir}")
        self.file_path(file_id).unlink(missing_ok=True)

    def jobs_using_file(self, file_id: str) -> list[str]:
        rows = self._all(
            f"SELECT id FROM jobs WHERE input_file_id = ? AND status IN {ACTIVE}", (file_id,)
        )
        return [str(r["id"]) for r in rows]

    # ------------------------------------------------------------------ jobs

    def insert_job(self, fields: dict[str, Any]) -> None:
        names = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        self._write(f"INSERT INTO jobs ({names}) VALUES ({marks})", fields.values())

    def job_row(self, job_id: str) -> sqlite3.Row:
        row = self._one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if row is None:
            raise JobNotFoundError(f"no job {job_id!r} in {self.state_dir}")
        return row

    def get_job(self, job_id: str) -> Batch:
        return _job(self.job_row(job_id))

    def list_jobs(self, limit: int | None = None, after: str | None = None) -> list[Batch]:
        """Newest first; ``after``: only those older than that job (a cursor, exclusive)."""
        sql, args = "SELECT * FROM jobs", []
        if after is not None:
            self.job_row(after)  # an unknown cursor is an error, not an empty page
            sql += " WHERE (created_at, rowid) < (SELECT created_at, rowid FROM jobs WHERE id = ?)"
            args.append(after)
        sql += " ORDER BY created_at DESC, rowid DESC"
        rows = self._all(sql + (f" LIMIT {int(limit)}" if limit else ""), args)
        return [_job(r) for r in rows]

    def update_job(self, job_id: str, *, where_status: Iterable[str] = (), **fields: Any) -> bool:
        """Set ``fields``; with ``where_status``, only if the job is in one of those states.
        Returns whether the job was updated."""
        sets = ", ".join(f"{k} = ?" for k in fields)
        args: list[Any] = [_encode(k, v) for k, v in fields.items()]
        sql = f"UPDATE jobs SET {sets} WHERE id = ?"
        args.append(job_id)
        states = tuple(where_status)
        if states:
            sql += f" AND status IN ({', '.join('?' for _ in states)})"
            args += states
        return self._write(sql, args) > 0

    def active_jobs(self) -> list[sqlite3.Row]:
        return self._all(f"SELECT * FROM jobs WHERE status IN {ACTIVE} ORDER BY created_at")

    def claim(self, job_id: str, owner: str, expected: str | None) -> bool:
        """Take the job's lease if its owner is still ``expected`` (compare-and-swap)."""
        return (
            self._write(
                "UPDATE jobs SET owner = ?, heartbeat_at = ? WHERE id = ? AND owner IS ?",
                (owner, time.time(), job_id, expected),
            )
            > 0
        )

    def heartbeat(self, owner: str) -> list[tuple[str, str]]:
        """Refresh the leases of ``owner``; return ``(job id, status)`` of the jobs it holds."""
        with self._lock, self._tx():
            self._db.execute(
                "UPDATE jobs SET heartbeat_at = ? WHERE owner = ?", (time.time(), owner)
            )
            rows = self._db.execute("SELECT id, status FROM jobs WHERE owner = ?", (owner,))
            return [(str(r["id"]), str(r["status"])) for r in rows.fetchall()]

    def release(self, job_id: str, owner: str) -> None:
        self._write("UPDATE jobs SET owner = NULL WHERE id = ? AND owner = ?", (job_id, owner))

    # ------------------------------------------------------------------ results

    def commit_results(self, job_id: str, rows: list[ResultRow]) -> None:
        """Insert finished rows (a row already there is left alone) and grow the job's request
        counts and usage by exactly the rows inserted, in one transaction."""
        ok = bad = tokens_in = tokens_out = hits = 0
        with self._lock, self._tx():
            for row in rows:
                cur = self._db.execute(
                    f"INSERT OR IGNORE INTO results ({_RESULT_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        job_id,
                        row.seq,
                        row.custom_id,
                        int(row.ok),
                        row.status_code,
                        None if row.error is None else row.error.model_dump_json(exclude_none=True),
                        row.line,
                        row.input_tokens,
                        row.output_tokens,
                        int(row.cached),
                    ),
                )
                if cur.rowcount:
                    ok += row.ok
                    bad += not row.ok
                    tokens_in += row.input_tokens
                    tokens_out += row.output_tokens
                    hits += row.cached and not row.merged
            self._db.execute(
                "UPDATE jobs SET completed = completed + ?, failed = failed + ?, "
                "input_tokens = input_tokens + ?, output_tokens = output_tokens + ?, "
                "cache_hits = cache_hits + ? WHERE id = ?",
                (ok, bad, tokens_in, tokens_out, hits, job_id),
            )

    def finished_seqs(self, job_id: str, lo: int, hi: int) -> set[int]:
        """The finished ``seq``s of the job in ``lo..hi`` (inclusive)."""
        rows = self._all(
            "SELECT seq FROM results WHERE job_id = ? AND seq BETWEEN ? AND ?", (job_id, lo, hi)
        )
        return {int(r["seq"]) for r in rows}

    def _chunked(self, job_id: str, columns: str, ok: bool | None) -> Iterator[sqlite3.Row]:
        """Rows of the job's results in ``seq`` order, read in chunks (memory flat; the lock is
        not held between chunks, so writers are not blocked)."""
        after = -1
        extra = "" if ok is None else f" AND ok = {int(ok)}"
        while True:
            rows = self._all(
                f"SELECT {columns} FROM results WHERE job_id = ? AND seq > ?{extra} "
                "ORDER BY seq LIMIT ?",
                (job_id, after, _CHUNK),
            )
            yield from rows
            if len(rows) < _CHUNK:
                return
            after = int(rows[-1]["seq"])

    def iter_results(self, job_id: str, *, ok: bool | None = None) -> Iterator[ResultRow]:
        """Finished rows in ``seq`` order (all, only successes, or only failures)."""
        return (_result(r) for r in self._chunked(job_id, "*", ok))

    def iter_lines(self, job_id: str, *, ok: bool | None = None) -> Iterator[str]:
        """The stored output/error file lines in ``seq`` order, without decoding them."""
        return (str(r["line"]) for r in self._chunked(job_id, "seq, line", ok))

    def copy_successes(self, src_job: str, dst_job: str) -> None:
        """Seed ``dst_job`` with the successful rows of ``src_job`` (same input content)."""
        with self._lock, self._tx():
            self._db.execute(
                f"INSERT OR IGNORE INTO results ({_RESULT_COLUMNS}) SELECT ?, seq, custom_id, "
                "ok, status_code, error, line, input_tokens, output_tokens, 0 FROM results "
                "WHERE job_id = ? AND ok = 1",
                (dst_job, src_job),
            )
            self._db.execute(
                "UPDATE jobs SET completed = (SELECT count(*) FROM results WHERE job_id = ?1), "
                "input_tokens = (SELECT coalesce(sum(input_tokens), 0) FROM results "
                "WHERE job_id = ?1), output_tokens = (SELECT coalesce(sum(output_tokens), 0) "
                "FROM results WHERE job_id = ?1) WHERE id = ?1",
                (dst_job,),
            )

    def delete_results(self, job_id: str) -> None:
        with self._lock, self._tx():
            self._db.execute("DELETE FROM results WHERE job_id = ?", (job_id,))
            self._db.execute("DELETE FROM job_lines WHERE job_id = ?", (job_id,))

    def result_row(self, job_id: str, seq: int) -> ResultRow | None:
        row = self._one("SELECT * FROM results WHERE job_id = ? AND seq = ?", (job_id, seq))
        return None if row is None else _result(row)

    # ------------------------------------------------------------------ lines not sent as is

    def add_job_lines(self, job_id: str, lines: list[tuple[int, str, int | None, int]]) -> None:
        """Record ``(seq, custom_id, same_as, repeat)`` of lines merged into an earlier
        identical one (``same_as``) or repeating an earlier sampled one (``repeat`` > 0)."""
        with self._lock, self._tx():
            self._db.executemany(
                "INSERT OR REPLACE INTO job_lines VALUES (?, ?, ?, ?, ?)",
                [(job_id, *line) for line in lines],
            )

    def job_lines(self, job_id: str, lo: int, hi: int) -> dict[int, tuple[int | None, int]]:
        """``{seq: (same_as, repeat)}`` of the recorded lines in ``lo..hi``."""
        rows = self._all(
            "SELECT seq, same_as, repeat FROM job_lines WHERE job_id = ? AND seq BETWEEN ? AND ?",
            (job_id, lo, hi),
        )
        return {int(r["seq"]): (r["same_as"], int(r["repeat"])) for r in rows}

    def merged_into(self, job_id: str, lo: int, hi: int) -> dict[int, list[tuple[int, str]]]:
        """``{seq: [(seq, custom_id) of the lines merged into it]}`` for ``seq`` in ``lo..hi``."""
        rows = self._all(
            "SELECT same_as, seq, custom_id FROM job_lines WHERE job_id = ? "
            "AND same_as BETWEEN ? AND ? ORDER BY seq",
            (job_id, lo, hi),
        )
        merged: dict[int, list[tuple[int, str]]] = {}
        for r in rows:
            merged.setdefault(int(r["same_as"]), []).append((int(r["seq"]), str(r["custom_id"])))
        return merged

    def unanswered_merged(self, job_id: str) -> list[tuple[int, str, int]]:
        """``(seq, custom_id, same_as)`` of merged lines without a result whose line has one
        (left by results copied from an earlier job that did not merge them)."""
        rows = self._all(
            "SELECT l.seq, l.custom_id, l.same_as FROM job_lines l "
            "JOIN results r ON r.job_id = l.job_id AND r.seq = l.same_as "
            "WHERE l.job_id = ? AND NOT EXISTS "
            "(SELECT 1 FROM results x WHERE x.job_id = l.job_id AND x.seq = l.seq)",
            (job_id,),
        )
        return [(int(r["seq"]), str(r["custom_id"]), int(r["same_as"])) for r in rows]

    # ------------------------------------------------------------------ remote batches

    def add_part(self, job_id: str, part: int, first_seq: int, count: int, attempt: int) -> None:
        """Record a planned remote batch covering input lines ``first_seq .. +count``."""
        self._write(
            "INSERT INTO remote_parts (job_id, part, first_seq, count, attempt, state) "
            "VALUES (?, ?, ?, ?, ?, 'planned')",
            (job_id, part, first_seq, count, attempt),
        )

    def update_part(self, job_id: str, part: int, **fields: Any) -> None:
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._write(
            f"UPDATE remote_parts SET {sets} WHERE job_id = ? AND part = ?",
            [*fields.values(), job_id, part],
        )

    def parts(self, job_id: str) -> list[sqlite3.Row]:
        """The job's remote batches, in part order."""
        return self._all("SELECT * FROM remote_parts WHERE job_id = ? ORDER BY part", (job_id,))

    def call_job(self, call_key: str) -> sqlite3.Row | None:
        return self._one("SELECT * FROM remote_calls WHERE call_key = ?", (call_key,))

    def set_call(self, call_key: str, job_id: str, *, delivered: bool = False) -> None:
        self._write(
            "INSERT OR REPLACE INTO remote_calls VALUES (?, ?, ?)",
            (call_key, job_id, int(delivered)),
        )


class _Transaction:
    """``BEGIN IMMEDIATE`` .. ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error:  # e.g. a full disk: leave no transaction open behind us
                self._rollback()
                raise
        else:
            self._rollback()

    def _rollback(self) -> None:
        if self._db.in_transaction:  # SQLite may have rolled back already (a full disk)
            with contextlib.suppress(sqlite3.Error):  # keep the error that got us here
                self._db.execute("ROLLBACK")


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _encode(key: str, value: Any) -> Any:
    if key in ("metadata", "errors") and value is not None and not isinstance(value, str):
        return json.dumps(value)
    return value


def _file(row: sqlite3.Row) -> FileObject:
    return FileObject(
        id=row["id"],
        bytes=row["bytes"],
        created_at=row["created_at"],
        filename=row["filename"],
        purpose=row["purpose"],
    )


def _job(row: sqlite3.Row) -> Batch:
    errors = json.loads(row["errors"]) if row["errors"] else None
    return Batch(
        id=row["id"],
        endpoint=row["endpoint"],
        errors=(
            BatchErrors(data=[BatchError.model_validate(e) for e in errors]) if errors else None
        ),
        input_file_id=row["input_file_id"],
        completion_window=row["completion_window"],
        status=row["status"],
        output_file_id=row["output_file_id"],
        error_file_id=row["error_file_id"],
        created_at=row["created_at"],
        request_counts=BatchRequestCounts(
            total=row["total"], completed=row["completed"], failed=row["failed"]
        ),
        metadata=json.loads(row["metadata"]) if row["metadata"] else None,
        usage=BatchUsage(
            input_tokens=row["input_tokens"],
            output_tokens=row["output_tokens"],
            total_tokens=row["input_tokens"] + row["output_tokens"],
        ),
        model=row["model"],
        cache_hits=row["cache_hits"],
        **{k: row[k] for k in _TIMESTAMPS},
    )


def _result(row: sqlite3.Row) -> ResultRow:
    response = json.loads(row["line"]).get("response") or {}
    return ResultRow(
        seq=row["seq"],
        custom_id=row["custom_id"],
        ok=bool(row["ok"]),
        status_code=row["status_code"],
        body=response.get("body"),
        error=BatchItemError.model_validate_json(row["error"]) if row["error"] else None,
        request_id=response.get("request_id"),
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        line=row["line"],
        cached=bool(row["cached"]),
    )


def open_private(path: Path) -> IO[bytes]:
    """``path`` opened for writing (``"wb"``), readable by its owner only (0600)."""
    f = open(path, "wb", opener=lambda p, flags: os.open(p, flags, 0o600))  # noqa: SIM115
    os.fchmod(f.fileno(), 0o600)  # a file that already existed keeps its mode otherwise
    return f


def default_state_dir() -> Path:
    """``$BATCHCLIENT_STATE_DIR`` if set, else the user data directory for ``batchclient``
    (platformdirs; e.g. ``~/.local/share/batchclient`` on Linux)."""
    env = os.environ.get("BATCHCLIENT_STATE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("batchclient"))
