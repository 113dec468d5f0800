"""The durable state of files and jobs: one SQLite database (stdlib ``sqlite3``, WAL) in the state
directory, plus the files themselves under ``files/``.

Tables: ``files`` (the OpenAI file records and each file's SHA-256), ``jobs`` (the OpenAI batch
record, the provider identity that may resume it, and a lease: ``owner`` + ``heartbeat_at`` +
``owner_kernel``, see :mod:`._lease`),
``results`` (one row per finished request line, keyed by ``(job_id, seq)``, holding the line of
the output or error file it becomes, serialised once when it is committed, so that writing the
files at the end only concatenates text) and ``job_lines`` (the lines of a job that are not sent
as they are: ``same_as`` an identical greedy line earlier in the file, whose answer they get, or
a ``repeat`` index > 0 for the k-th identical sampled line). Jobs run on a remote Batch API
add their own tables to the same database (:mod:`batchclient.batchapi`), and so does the result
cache (:mod:`batchclient.cache`). The database is opened and migrated by
:class:`batchclient._state.Database` (schema ``jobs``, :data:`SCHEMA`).

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
import secrets
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .._state import Database, Migration, Schema, add_columns, exists, private_dirs, record
from ..errors import BatchClientError, FileNotFoundInStoreError, JobNotFoundError
from ..types import (
    Batch,
    BatchError,
    BatchErrors,
    BatchItemError,
    BatchRequestCounts,
    BatchStatus,
    BatchUsage,
    FileObject,
    InputTokensDetails,
    OutputTokensDetails,
)
from ._lease import kernel_boot_id

DB_NAME = "batchclient.sqlite3"
_CLASS_COLUMNS = (
    "cached_tokens INTEGER NOT NULL DEFAULT 0",
    "cache_write_tokens INTEGER NOT NULL DEFAULT 0",
    "reasoning_tokens INTEGER NOT NULL DEFAULT 0",
)


def _expiring_files(db: Any) -> None:
    add_columns("files", "expires_at INTEGER")(db)
    add_columns("jobs", "output_expires_s INTEGER")(db)


def _token_classes(db: Any) -> None:
    for table in ("results", "jobs"):
        add_columns(table, *_CLASS_COLUMNS)(db)


SCHEMA = Schema(
    "jobs",
    (
        Migration(
            1,
            """
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
CREATE INDEX IF NOT EXISTS job_lines_same_as ON job_lines(job_id, same_as)
""",
        ),
        # the result cache: a job's own setting and hit count, and which results it gave
        Migration(2, add_columns("jobs", "cache INTEGER", "cache_hits INTEGER NOT NULL DEFAULT 0")),
        Migration(3, add_columns("results", "cached INTEGER NOT NULL DEFAULT 0")),
        # how long the request took, so a job's items carry the latency metric a call's do
        Migration(4, add_columns("results", "latency_s REAL")),
        # the kernel boot id of the lease owner's machine: its lock file is trusted only there
        Migration(5, add_columns("jobs", "owner_kernel TEXT")),
        # a process's heartbeat and recovery find its jobs by owner; listings go newest first
        Migration(
            6,
            """
CREATE INDEX IF NOT EXISTS jobs_owner ON jobs(owner);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status);
CREATE INDEX IF NOT EXISTS jobs_created_at ON jobs(created_at);
CREATE INDEX IF NOT EXISTS files_created_at ON files(created_at)
""",
        ),
        # the token classes beyond input and output: cache reads and writes, reasoning
        Migration(7, _token_classes),
        # output files that expire (OpenAI's output_expires_after)
        Migration(8, _expiring_files),
        # leases of blocks of a job's lines, so processes sharing a database share a batch
        Migration(
            9,
            """
CREATE TABLE IF NOT EXISTS job_blocks(
    job_id TEXT NOT NULL, block INTEGER NOT NULL, owner TEXT NOT NULL,
    heartbeat_at REAL NOT NULL, PRIMARY KEY(job_id, block)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS job_blocks_owner ON job_blocks(owner)
""",
        ),
    ),
)
"""The tables of files, jobs and results (the remote Batch API's are ``batchapi``'s own)."""
FILE_BYTES = Schema(
    "file_bytes",
    (
        Migration(
            1,
            "CREATE TABLE IF NOT EXISTS file_bytes(file_id TEXT NOT NULL, part INTEGER NOT NULL, "
            "data BLOB NOT NULL, PRIMARY KEY(file_id, part)) WITHOUT ROWID",
        ),
    ),
)
"""The files' bytes, in a database shared by processes on several hosts (a SQLite state keeps
them in ``files/`` only)."""
FILE_PART_BYTES = 4 * 1024 * 1024
"""The size of one ``file_bytes`` row."""
_RESULT_COLUMNS = (
    "job_id, seq, custom_id, ok, status_code, error, line, input_tokens, output_tokens, cached, "
    "latency_s, cached_tokens, cache_write_tokens, reasoning_tokens"
)
_RESULT_MARKS = "(" + ", ".join("?" * 14) + ")"
_ROWS_PER_INSERT = 500  # 7,000 bound values per statement (PostgreSQL allows 65,535)
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
ACTIVE = tuple(sorted(BatchStatus.ACTIVE))  # for SQL: ``status IN {ACTIVE}``
_CHUNK = 1000
KERNEL = kernel_boot_id()
"""This machine's kernel boot id, recorded with every lease this process takes."""


class LeaseLostError(BatchClientError, RuntimeError):
    """Another process holds the lease of a job this process was running (it took the job over
    after this one looked gone): this one stops it and publishes no result of it."""

    def __init__(self, job_id: str, owner: str) -> None:
        super().__init__(f"batch {job_id}: its lease was taken over from {owner}")
        self.job_id = job_id


def now() -> int:
    return int(time.time())


@dataclass(slots=True)
class ResultRow:
    """One finished request line. ``ok`` is the verdict counted in ``request_counts``;
    ``line`` the JSON text of its output/error file line (set before committing); ``cached``
    whether the result cache gave it; ``merged`` (not stored) that it is the answer of an
    identical line, so it is not counted again in the job's ``cache_hits``. Tokens count what
    was generated for this job (0 for a cache hit or a copy of an identical line's answer):
    ``input_tokens`` all of the prompt, ``cached_tokens`` and ``cache_write_tokens`` the parts of
    it read from and written to a prompt cache, ``reasoning_tokens`` the part of
    ``output_tokens`` spent reasoning (``batchclient._core.usage``).
    ``latency_s`` is the answer's latency (seconds from dispatch), the ``latency`` metric of
    its item in ``job_result``; None when unknown (a cache hit, a remote Batch API)."""

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
    latency_s: float | None = None
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(slots=True)
class JobRow:
    """A ``jobs`` row as stored: the batch record's fields (timestamps in unix seconds,
    ``metadata`` and ``errors`` as JSON text), the provider ``identity`` that may resume it,
    the job it was seeded from, its lease (``owner``, ``heartbeat_at``, ``owner_kernel``: see
    :mod:`._lease`) and its cache setting (``cache``: None = the client's)."""

    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    status: str
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    total: int
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    metadata: str | None
    errors: str | None
    output_file_id: str | None
    error_file_id: str | None
    model: str | None
    identity: str
    seed_job_id: str | None
    owner: str | None
    heartbeat_at: float | None
    cache: int | None
    cache_hits: int
    owner_kernel: str | None
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    output_expires_s: int | None = None


class Store:
    """The SQLite database of one state directory. Thread-safe; every method is blocking
    (call it through ``anyio.to_thread`` from async code). Other stores add their tables to
    the same database through :attr:`db` (``Database.migrate``)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.files_dir = state_dir / "files"
        private_dirs(state_dir)  # opened first by a server's webhook outbox, say
        self.files_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.files_dir, 0o700)
        self.db = Database(state_dir / DB_NAME, [SCHEMA])
        self.shared = self.db.shared is not None
        """Whether the database is a PostgreSQL shared with other processes: the files' bytes
        are kept in it too, and ``files/`` only caches them."""
        if self.shared:
            self.db.migrate(FILE_BYTES)
        self._opened = _file_id(state_dir / DB_NAME)
        self.lease_s = 10.0
        """How long a silent holder keeps a block lease (the job manager's ``lease_s``)."""
        self.owner: str | None = None
        """The lease owner results are committed for (set by the job manager): a commit for a
        job another owner has taken over is refused (:class:`LeaseLostError`)."""
        self.kernel: str | None = None
        """Recorded with the leases taken through this store: :data:`KERNEL` once its owner
        holds its lock file (:mod:`._lease`), so that the file's absence means it is gone."""

    @staticmethod
    def exists(state_dir: Path) -> bool:
        return exists(state_dir / DB_NAME)

    def check_in_place(self) -> None:
        """Raise ``FileNotFoundError`` when the database this store has open is no longer the
        file at its path (the state directory was moved, removed or replaced under it: what
        is written now would be seen by no other process)."""
        path = self.state_dir / DB_NAME
        if not self.shared and _file_id(path) != self._opened:
            raise FileNotFoundError(
                errno.ENOENT, "the database open here is no longer at this path", str(path)
            )

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ files

    def file_path(self, file_id: str) -> Path:
        """Where the file's bytes are on this machine. In a shared database they are copied
        from it first, unless this process has them already."""
        path = self.files_dir / file_id
        if self.shared:
            self._fetch(file_id, path)
        return path

    def _fetch(self, file_id: str, path: Path) -> None:
        row = self.db.one("SELECT bytes FROM files WHERE id = ?", (file_id,))
        if row is None:
            return  # a file being written here, or no file at all
        with contextlib.suppress(OSError):
            if path.stat().st_size == row["bytes"]:
                return
        tmp = path.with_name(f".{file_id}.{secrets.token_hex(4)}.tmp")
        try:
            with open_private(tmp) as f:
                part = 0
                while (
                    chunk := self.db.one(
                        "SELECT data FROM file_bytes WHERE file_id = ? AND part = ?",
                        (file_id, part),
                    )
                ) is not None:
                    f.write(chunk["data"])
                    part += 1
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def add_file(self, record: FileObject, sha256: str) -> None:
        """Record a file whose bytes are at :meth:`file_path` (and, in a shared database,
        store them there in the same transaction: one that inserts a new id only, so it runs
        beside other writers, not before them)."""
        with self.db.transaction(exclusive=False) as db:
            db.execute(
                "INSERT INTO files (id, filename, bytes, created_at, purpose, sha256, "
                "expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.filename,
                    record.bytes,
                    record.created_at,
                    record.purpose,
                    sha256,
                    record.expires_at,
                ),
            )
            if self.shared:
                with open(self.files_dir / record.id, "rb") as f:
                    for part, chunk in enumerate(iter(lambda: f.read(FILE_PART_BYTES), b"")):
                        db.execute(
                            "INSERT INTO file_bytes (file_id, part, data) VALUES (?, ?, ?)",
                            (record.id, part, chunk),
                        )

    def _forget_bytes(self, db: Any, file_id: str) -> None:
        if self.shared:
            db.execute("DELETE FROM file_bytes WHERE file_id = ?", (file_id,))

    def get_file(self, file_id: str) -> FileObject:
        """The file's record. An expired file is deleted here and reported missing."""
        row = self.db.one("SELECT * FROM files WHERE id = ?", (file_id,))
        if row is not None and _expired(row):
            self._drop_expired(file_id)
            row = None
        if row is None:
            if self.shared:  # deleted through another process: drop this one's copy too
                (self.files_dir / file_id).unlink(missing_ok=True)
            raise FileNotFoundInStoreError(f"no file {file_id!r} in {self.state_dir}")
        return _file(row)

    def _drop_expired(self, file_id: str) -> None:
        with self.db.transaction() as db:
            sql = "DELETE FROM files WHERE id = ? AND expires_at <= ?"
            if not db.execute(sql, (file_id, now())).rowcount:
                return
            self._forget_bytes(db, file_id)
        (self.files_dir / file_id).unlink(missing_ok=True)

    def file_sha256(self, file_id: str) -> str:
        row = self.db.one("SELECT sha256 FROM files WHERE id = ?", (file_id,))
        if row is None:
            raise FileNotFoundInStoreError(f"no file {file_id!r} in {self.state_dir}")
        return str(row["sha256"])

    def find_files(self, sha256: str, purpose: str) -> list[FileObject]:
        rows = self.db.all(
            "SELECT * FROM files WHERE sha256 = ? AND purpose = ? ORDER BY created_at DESC",
            (sha256, purpose),
        )
        return [_file(r) for r in rows]

    def list_files(self, purpose: str | None = None) -> list[FileObject]:
        if purpose is None:
            rows = self.db.all("SELECT * FROM files ORDER BY created_at DESC, rowid DESC")
        else:
            rows = self.db.all(
                "SELECT * FROM files WHERE purpose = ? ORDER BY created_at DESC, rowid DESC",
                (purpose,),
            )
        for row in rows:
            if _expired(row):
                self._drop_expired(row["id"])
        return [_file(r) for r in rows if not _expired(r)]

    def delete_file(self, file_id: str) -> None:
        with self.db.transaction() as db:
            if not db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount:
                raise FileNotFoundInStoreError(f"no file {file_id!r} in {self.state_dir}")
            self._forget_bytes(db, file_id)
        (self.files_dir / file_id).unlink(missing_ok=True)

    def delete_unused_file(self, file_id: str) -> list[str]:
        """Delete a file unless unfinished jobs read it; return those jobs (nothing deleted
        then). One transaction, so a job created meanwhile either finds no file or keeps it."""
        with self.db.transaction() as db:
            users = [
                str(r[0])
                for r in db.execute(
                    f"SELECT id FROM jobs WHERE input_file_id = ? AND status IN {ACTIVE}",
                    (file_id,),
                )
            ]
            if users:
                return users
            if not db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount:
                raise FileNotFoundInStoreError(f"no file {file_id!r} in {self.state_dir}")
            self._forget_bytes(db, file_id)
        (self.files_dir / file_id).unlink(missing_ok=True)
        return []

    def jobs_using_file(self, file_id: str) -> list[str]:
        rows = self.db.all(
            f"SELECT id FROM jobs WHERE input_file_id = ? AND status IN {ACTIVE}", (file_id,)
        )
        return [str(r["id"]) for r in rows]

    # ------------------------------------------------------------------ jobs

    def insert_job(self, fields: dict[str, Any]) -> None:
        """Raises ``FileNotFoundInStoreError`` when the input file is gone: the check and the
        insert are one statement, so a concurrent :meth:`delete_unused_file` comes wholly
        before (no job) or after (refused: the job uses the file)."""
        names = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        file_id = fields["input_file_id"]
        inserted = self.db.write(
            f"INSERT INTO jobs ({names}) SELECT {marks} "
            "WHERE EXISTS (SELECT 1 FROM files WHERE id = ?)",
            [*fields.values(), file_id],
        )
        if not inserted:
            raise FileNotFoundInStoreError(f"no file {file_id!r} in {self.state_dir}")

    def job_row(self, job_id: str) -> JobRow:
        row = self.db.one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if row is None:
            raise JobNotFoundError(f"no job {job_id!r} in {self.state_dir}")
        return record(JobRow, row)

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
        rows = self.db.all(sql + (f" LIMIT {int(limit)}" if limit else ""), args)
        return [_job(record(JobRow, r)) for r in rows]

    def update_job(
        self,
        job_id: str,
        *,
        where_status: Iterable[str] = (),
        where_owner: str | None = None,
        **fields: Any,
    ) -> bool:
        """Set ``fields``; with ``where_status``, only if the job is in one of those states;
        with ``where_owner``, only if its lease is free or that owner's. Returns whether the job
        was updated."""
        sets = ", ".join(f"{k} = ?" for k in fields)
        args: list[Any] = [_encode(k, v) for k, v in fields.items()]
        sql = f"UPDATE jobs SET {sets} WHERE id = ?"
        args.append(job_id)
        states = tuple(where_status)
        if states:
            sql += f" AND status IN ({', '.join('?' for _ in states)})"
            args += states
        if where_owner is not None:
            sql += " AND (owner IS NULL OR owner = ?)"
            args.append(where_owner)
        return self.db.write(sql, args) > 0

    def active_jobs(self) -> list[JobRow]:
        rows = self.db.all(f"SELECT * FROM jobs WHERE status IN {ACTIVE} ORDER BY created_at")
        return [record(JobRow, r) for r in rows]

    def claim(self, job_id: str, owner: str | None, expected: str | None) -> bool:
        """Take the job's lease for ``owner`` (None: leave it free) if its owner is still
        ``expected`` (compare-and-swap)."""
        kernel = None if owner is None else self.kernel
        return (
            self.db.write(
                "UPDATE jobs SET owner = ?, heartbeat_at = ?, owner_kernel = ? "
                "WHERE id = ? AND owner IS ?",
                (owner, self.db.now(), kernel, job_id, expected),
            )
            > 0
        )

    def heartbeat(self, owner: str) -> list[tuple[str, str]]:
        """Refresh the leases of ``owner`` (jobs, and in a shared database blocks of lines);
        return ``(job id, status)`` of the jobs it holds."""
        with self.db.transaction() as db:
            db.execute("UPDATE jobs SET heartbeat_at = ? WHERE owner = ?", (self.db.now(), owner))
            if self.shared:
                sql = "UPDATE job_blocks SET heartbeat_at = ? WHERE owner = ?"
                db.execute(sql, (self.db.now(), owner))
            rows = db.execute("SELECT id, status FROM jobs WHERE owner = ?", (owner,))
            return [(str(r["id"]), str(r["status"])) for r in rows.fetchall()]

    def statuses(self, job_ids: Collection[str]) -> dict[str, str]:
        """``{job id: status}`` of those jobs."""
        if not job_ids:
            return {}
        marks = ", ".join("?" * len(job_ids))
        rows = self.db.all(f"SELECT id, status FROM jobs WHERE id IN ({marks})", tuple(job_ids))
        return {str(r["id"]): str(r["status"]) for r in rows}

    def claim_block(self, job_id: str, block: int, owner: str, lease_s: float) -> bool:
        """Take the lease of the job's lines from ``block`` (the first ``seq`` of a block read
        by :class:`~._runner.RequestSource`) for ``owner``, unless another owner renewed it in
        the last ``lease_s`` seconds, and only while the job is ``in_progress`` (a cancelled
        batch gives no block out). Whether ``owner`` holds it now."""
        now_s = self.db.now()
        row = self.db.write_returning(
            "INSERT INTO job_blocks (job_id, block, owner, heartbeat_at) SELECT ?, ?, ?, ? "
            "WHERE EXISTS (SELECT 1 FROM jobs WHERE id = ? AND status = 'in_progress') "
            "ON CONFLICT (job_id, block) DO UPDATE SET owner = excluded.owner, "
            "heartbeat_at = excluded.heartbeat_at WHERE job_blocks.owner = excluded.owner "
            "OR job_blocks.heartbeat_at < ? RETURNING block",
            (job_id, block, owner, now_s, job_id, now_s - lease_s),
        )
        return row is not None

    def others_hold_blocks(self, job_id: str, owner: str, lease_s: float) -> bool:
        """Whether owners other than ``owner`` hold block leases of the job renewed in the last
        ``lease_s`` seconds."""
        row = self.db.one(
            "SELECT 1 FROM job_blocks WHERE job_id = ? AND owner <> ? AND heartbeat_at >= ? "
            "LIMIT 1",
            (job_id, owner, self.db.now() - lease_s),
        )
        return row is not None

    def release_blocks(self, job_id: str, owner: str) -> None:
        """Free ``owner``'s block leases of the job (its run here ended or paused)."""
        sql = "DELETE FROM job_blocks WHERE job_id = ? AND owner = ?"
        self.db.write(sql, (job_id, owner))

    def release(self, job_id: str, owner: str) -> None:
        self.db.write("UPDATE jobs SET owner = NULL WHERE id = ? AND owner = ?", (job_id, owner))

    # ------------------------------------------------------------------ results

    def commit_results(
        self, job_id: str, rows: list[ResultRow], blocks: Collection[int] = ()
    ) -> None:
        """Insert finished rows (a row already there is left alone) and grow the job's request
        counts and usage by exactly the rows inserted, in one transaction. Raises
        :class:`LeaseLostError` (nothing written) when another owner than :attr:`owner` holds
        the job's lease: a process whose lease was taken over publishes nothing more. With
        ``blocks`` (the block leases the rows were sent under, in a shared database) those
        leases are checked instead: processes sharing a batch each hold their own blocks."""
        ok = bad = tokens_in = tokens_out = hits = cached = written = reasoning = 0
        fence = None if blocks else self.owner  # the job's lease, where no block's is checked
        with self.db.transaction() as db:
            if blocks and self.owner is not None:
                wanted = sorted(set(blocks))
                held = db.execute(
                    "SELECT count(*) FROM job_blocks WHERE job_id = ? AND owner = ? AND block IN "
                    f"({', '.join('?' * len(wanted))})",
                    (job_id, self.owner, *wanted),
                ).fetchone()[0]
                if held != len(wanted):
                    raise LeaseLostError(job_id, self.owner)
            inserted = self._insert_results(db, job_id, rows)
            for row in rows:
                if row.seq in inserted:
                    inserted.discard(row.seq)  # the same seq twice in one call counts once
                    ok += row.ok
                    bad += not row.ok
                    tokens_in += row.input_tokens
                    tokens_out += row.output_tokens
                    hits += row.cached and not row.merged
                    cached += row.cached_tokens
                    written += row.cache_write_tokens
                    reasoning += row.reasoning_tokens
            counted = db.execute(
                "UPDATE jobs SET completed = completed + ?, failed = failed + ?, "
                "input_tokens = input_tokens + ?, output_tokens = output_tokens + ?, "
                "cache_hits = cache_hits + ?, cached_tokens = cached_tokens + ?, "
                "cache_write_tokens = cache_write_tokens + ?, "
                "reasoning_tokens = reasoning_tokens + ? WHERE id = ?"
                + ("" if fence is None else " AND (owner IS NULL OR owner = ?)"),
                (ok, bad, tokens_in, tokens_out, hits, cached, written, reasoning, job_id)
                + (() if fence is None else (fence,)),
            )
            if not counted.rowcount and fence is not None:
                raise LeaseLostError(job_id, fence)  # rolls the inserts back

    def _insert_results(self, db: Any, job_id: str, rows: list[ResultRow]) -> set[int]:
        """Insert the rows not there yet; the ``seq`` of those inserted."""
        inserted: set[int] = set()
        if not self.shared:  # in-process: one prepared statement, row by row, is fastest
            for row in rows:
                sql = f"INSERT INTO results ({_RESULT_COLUMNS}) VALUES {_RESULT_MARKS} "
                if db.execute(sql + "ON CONFLICT DO NOTHING", _result_args(job_id, row)).rowcount:
                    inserted.add(row.seq)
            return inserted
        for i in range(0, len(rows), _ROWS_PER_INSERT):
            # one statement (one round trip) per chunk; RETURNING names the rows inserted
            chunk = rows[i : i + _ROWS_PER_INSERT]
            values = ", ".join([_RESULT_MARKS] * len(chunk))
            cur = db.execute(
                f"INSERT INTO results ({_RESULT_COLUMNS}) VALUES {values} "
                "ON CONFLICT DO NOTHING RETURNING seq",
                [a for row in chunk for a in _result_args(job_id, row)],
            )
            inserted.update(int(r[0]) for r in cur.fetchall())
        return inserted

    def finished_seqs(self, job_id: str, lo: int, hi: int) -> set[int]:
        """The finished ``seq``s of the job in ``lo..hi`` (inclusive)."""
        rows = self.db.all(
            "SELECT seq FROM results WHERE job_id = ? AND seq BETWEEN ? AND ?", (job_id, lo, hi)
        )
        return {int(r["seq"]) for r in rows}

    def _chunked(self, job_id: str, columns: str, ok: bool | None) -> Iterator[Any]:
        """Rows of the job's results in ``seq`` order, read in chunks (memory flat; the lock is
        not held between chunks, so writers are not blocked)."""
        after = -1
        extra = "" if ok is None else f" AND ok = {int(ok)}"
        while True:
            rows = self.db.all(
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

    def count_failed(self, job_id: str, codes: Collection[str]) -> int:
        """How many of the job's lines failed with one of the error ``codes`` (e.g.
        ``batch_cancelled`` and ``batch_expired``: the lines a cancelled or expired batch never
        ran)."""
        marks = ", ".join("?" * len(codes))
        row = self.db.one(
            "SELECT count(*) FROM results WHERE job_id = ? AND ok = 0 AND "
            f"json_extract(error, '$.code') IN ({marks})",
            (job_id, *codes),
        )
        return int(row[0]) if row is not None else 0

    def iter_lines(self, job_id: str, *, ok: bool | None = None) -> Iterator[str]:
        """The stored output/error file lines in ``seq`` order, without decoding them."""
        return (str(r["line"]) for r in self._chunked(job_id, "seq, line", ok))

    def copy_successes(self, src_job: str, dst_job: str) -> None:
        """Seed ``dst_job`` with the successful rows of ``src_job`` (same input content). The
        copies carry no tokens: ``usage`` counts what was generated for ``dst_job``."""
        with self.db.transaction() as db:
            db.execute(
                f"INSERT OR IGNORE INTO results ({_RESULT_COLUMNS}) SELECT ?, seq, custom_id, "
                "ok, status_code, error, line, 0, 0, 0, latency_s, 0, 0, 0 FROM results "
                "WHERE job_id = ? AND ok = 1",
                (dst_job, src_job),
            )
            db.execute(
                "UPDATE jobs SET (completed, input_tokens, output_tokens, cached_tokens, "
                "cache_write_tokens, reasoning_tokens) = (SELECT count(*), "
                "coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0), "
                "coalesce(sum(cached_tokens), 0), coalesce(sum(cache_write_tokens), 0), "
                "coalesce(sum(reasoning_tokens), 0) FROM results WHERE job_id = ?) WHERE id = ?",
                (dst_job, dst_job),
            )

    def delete_results(self, job_id: str) -> None:
        with self.db.transaction() as db:
            db.execute("DELETE FROM results WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM job_lines WHERE job_id = ?", (job_id,))

    def result_row(self, job_id: str, seq: int) -> ResultRow | None:
        row = self.db.one("SELECT * FROM results WHERE job_id = ? AND seq = ?", (job_id, seq))
        return None if row is None else _result(row)

    # ------------------------------------------------------------------ lines not sent as is

    def add_job_lines(self, job_id: str, lines: list[tuple[int, str, int | None, int]]) -> None:
        """Record ``(seq, custom_id, same_as, repeat)`` of lines merged into an earlier
        identical one (``same_as``) or repeating an earlier sampled one (``repeat`` > 0)."""
        with self.db.transaction() as db:
            db.executemany(
                "INSERT INTO job_lines (job_id, seq, custom_id, same_as, repeat) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (job_id, seq) DO UPDATE SET "
                "custom_id = excluded.custom_id, same_as = excluded.same_as, "
                "repeat = excluded.repeat",
                [(job_id, *line) for line in lines],
            )

    def job_lines(self, job_id: str, lo: int, hi: int) -> dict[int, tuple[int | None, int]]:
        """``{seq: (same_as, repeat)}`` of the recorded lines in ``lo..hi``."""
        rows = self.db.all(
            "SELECT seq, same_as, repeat FROM job_lines WHERE job_id = ? AND seq BETWEEN ? AND ?",
            (job_id, lo, hi),
        )
        return {int(r["seq"]): (r["same_as"], int(r["repeat"])) for r in rows}

    def merged_into(
        self, job_id: str, lo: int, hi: int, most: int
    ) -> dict[int, list[tuple[int, str]] | None]:
        """``{seq: [(seq, custom_id) of the lines merged into it]}`` for ``seq`` in ``lo..hi``;
        ``None`` for a line with more than ``most`` merged into it (read them with
        :meth:`merged_lines`, a chunk at a time)."""
        counts = self.db.all(
            "SELECT same_as, count(*) AS n FROM job_lines INDEXED BY job_lines_same_as "
            "WHERE job_id = ? AND same_as BETWEEN ? AND ? GROUP BY same_as",
            (job_id, lo, hi),
        )
        merged: dict[int, list[tuple[int, str]] | None] = {
            int(r["same_as"]): None for r in counts if r["n"] > most
        }
        few = [int(r["same_as"]) for r in counts if r["n"] <= most]
        if few:
            rows = self.db.all(
                "SELECT same_as, seq, custom_id FROM job_lines INDEXED BY job_lines_same_as "
                f"WHERE job_id = ? AND same_as IN ({', '.join('?' * len(few))}) "
                "ORDER BY same_as, seq",
                (job_id, *few),
            )
            for r in rows:
                lines = merged.setdefault(int(r["same_as"]), [])
                assert lines is not None
                lines.append((int(r["seq"]), str(r["custom_id"])))
        return merged

    def merged_lines(
        self, job_id: str, same_as: int, after: int, limit: int
    ) -> list[tuple[int, str]]:
        """``(seq, custom_id)`` of up to ``limit`` lines merged into ``same_as``, past ``after``
        in ``seq`` order."""
        rows = self.db.all(
            "SELECT seq, custom_id FROM job_lines INDEXED BY job_lines_same_as "
            "WHERE job_id = ? AND same_as = ? AND seq > ? ORDER BY seq LIMIT ?",
            (job_id, same_as, after, limit),
        )
        return [(int(r["seq"]), str(r["custom_id"])) for r in rows]

    def unanswered_merged(self, job_id: str, after: int, limit: int) -> list[tuple[int, str, int]]:
        """``(seq, custom_id, same_as)`` of up to ``limit`` merged lines past ``after`` (in
        ``seq`` order) without a result whose line has one (left by results copied from an
        earlier job that did not merge them, or by a crash between a line's result and its
        merged lines')."""
        rows = self.db.all(
            "SELECT l.seq, l.custom_id, l.same_as FROM job_lines l "
            "JOIN results r ON r.job_id = l.job_id AND r.seq = l.same_as "
            "WHERE l.job_id = ? AND l.seq > ? AND NOT EXISTS "
            "(SELECT 1 FROM results x WHERE x.job_id = l.job_id AND x.seq = l.seq) "
            "ORDER BY l.seq LIMIT ?",
            (job_id, after, limit),
        )
        return [(int(r["seq"]), str(r["custom_id"]), int(r["same_as"])) for r in rows]

    def result_rows(self, job_id: str, seqs: Iterable[int]) -> dict[int, ResultRow]:
        """``{seq: row}`` of the finished lines among ``seqs``."""
        wanted = sorted(set(seqs))
        found: dict[int, ResultRow] = {}
        for i in range(0, len(wanted), 500):  # under SQLite's bound-variable limit
            chunk = wanted[i : i + 500]
            marks = ", ".join("?" * len(chunk))
            rows = self.db.all(
                f"SELECT * FROM results WHERE job_id = ? AND seq IN ({marks})", (job_id, *chunk)
            )
            found.update((int(r["seq"]), _result(r)) for r in rows)
        return found


def _result_args(job_id: str, row: ResultRow) -> tuple[Any, ...]:
    return (
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
        row.latency_s,
        row.cached_tokens,
        row.cache_write_tokens,
        row.reasoning_tokens,
    )


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


def _file(row: Any) -> FileObject:
    return FileObject(
        id=row["id"],
        bytes=row["bytes"],
        created_at=row["created_at"],
        filename=row["filename"],
        purpose=row["purpose"],
        expires_at=row["expires_at"],
    )


def _expired(row: Any) -> bool:
    expires = row["expires_at"]
    return expires is not None and expires <= now()


def _job(row: JobRow) -> Batch:
    errors = json.loads(row.errors) if row.errors else None
    return Batch(
        id=row.id,
        endpoint=row.endpoint,
        errors=(
            BatchErrors(data=[BatchError.model_validate(e) for e in errors]) if errors else None
        ),
        input_file_id=row.input_file_id,
        completion_window=row.completion_window,
        status=row.status,
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        created_at=row.created_at,
        request_counts=BatchRequestCounts(
            total=row.total, completed=row.completed, failed=row.failed
        ),
        metadata=json.loads(row.metadata) if row.metadata else None,
        usage=BatchUsage(
            input_tokens=row.input_tokens,
            input_tokens_details=InputTokensDetails(
                cached_tokens=row.cached_tokens, cache_write_tokens=row.cache_write_tokens
            ),
            output_tokens=row.output_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=row.reasoning_tokens),
            total_tokens=row.input_tokens + row.output_tokens,
        ),
        model=row.model,
        cache_hits=row.cache_hits,
        **{k: getattr(row, k) for k in _TIMESTAMPS},
    )


def _result(row: Any) -> ResultRow:
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
        latency_s=row["latency_s"],
        cached_tokens=row["cached_tokens"],
        cache_write_tokens=row["cache_write_tokens"],
        reasoning_tokens=row["reasoning_tokens"],
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
