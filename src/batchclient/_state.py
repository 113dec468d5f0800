"""SQLite for the whole library: opening a database with its rules, and schema migrations.

Every durable table of batchclient lives in a database opened here: the jobs' files, jobs and
results (:mod:`batchclient.jobs`), the remote Batch API's parts and calls
(:mod:`batchclient.batchapi`), the result cache (:mod:`batchclient.cache`, also used by the
lm-eval model) and the server's webhook outbox (:mod:`batchclient.server._webhooks`) in the
state directory's ``batchclient.sqlite3``, and the server's idempotency keys in each tenant's
``server.sqlite3``.

Rules of :class:`Database`: the parent directory and any missing folder above it are created
``0700`` (one that exists keeps its mode), the file is created ``0600`` before SQLite opens it
(SQLite gives its ``-wal`` and ``-shm`` files the database's mode), WAL with
``synchronous=NORMAL`` (a commit survives the death of the process, not a power cut), a
30-second busy timeout (other processes read and write the same file), and autocommit: writes
go through :meth:`Database.transaction` (``BEGIN IMMEDIATE`` .. ``COMMIT``).

Migrations: each store describes its tables as a :class:`Schema`, a name and numbered
:class:`Migration` steps. :meth:`Database.migrate` applies the steps above the version recorded
for that name in the ``schema_versions`` table, in order, in one transaction, and records the
new version; several schemas share one file without knowing of each other. A database made
before versions were recorded has no row: its first steps run again, so they are written to be
idempotent (``IF NOT EXISTS``, :func:`add_columns`). A database recorded at a version newer
than the code's is refused (:class:`StateVersionError`): older code could write rows the newer
schema does not accept.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from .errors import BatchClientError

__all__ = [
    "Database",
    "Migration",
    "Schema",
    "StateVersionError",
    "add_columns",
    "record",
    "touch_private",
]

BUSY_TIMEOUT_S = 30.0
"""How long a statement waits for another connection's write lock before failing."""

_VERSIONS = (
    "CREATE TABLE IF NOT EXISTS schema_versions("
    "name TEXT PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID"
)

Step = Callable[[sqlite3.Connection], None]
R = TypeVar("R")


class StateVersionError(BatchClientError, RuntimeError):
    """The database was migrated by a newer batchclient than this one."""


@dataclass(frozen=True)
class Migration:
    """Step ``version`` of a schema: SQL statements separated by ``;`` (no ``;`` inside
    them), or a function given the connection (inside the migration's transaction)."""

    version: int
    apply: str | Step


@dataclass(frozen=True)
class Schema:
    """The tables of one store: ``name`` (its row in ``schema_versions``) and its migrations,
    numbered 1, 2, ... in order."""

    name: str
    migrations: tuple[Migration, ...]

    def __post_init__(self) -> None:
        numbers = [m.version for m in self.migrations]
        if numbers != list(range(1, len(numbers) + 1)):
            raise ValueError(f"schema {self.name}: migrations must be numbered 1..n, not {numbers}")

    @property
    def version(self) -> int:
        return len(self.migrations)


def add_columns(table: str, *columns: str) -> Step:
    """A step adding ``columns`` (``"name TYPE ..."``) to ``table`` where they are missing (a
    database from before versions were recorded may have them already)."""

    def step(db: sqlite3.Connection) -> None:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for column in columns:
            if column.split()[0] not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")

    return step


def private_dirs(path: Path) -> None:
    """Create ``path`` and any missing parent ``0700`` (a plain ``mkdir(parents=True)`` makes
    the parents ``0755``: readable by every user). Folders that exist keep their mode."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask


def touch_private(path: Path) -> None:
    """Create ``path`` (and its missing folders, ``0700``) if missing, and make it ``0600``."""
    private_dirs(path.parent)
    # Never open a file SQLite may hold: closing any descriptor of a file drops every POSIX lock
    # this process holds on it, and another process's connection, finding no lock, takes itself
    # for the last one and deletes the WAL under ours (sqlite.org/howtocorrupt.html, 2.2).
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    os.chmod(path, 0o600)  # a file that already existed keeps its mode otherwise


def record(cls: type[R], row: sqlite3.Row) -> R:
    """The dataclass ``cls`` from a row holding (at least) a column per field."""
    return cls(**{f.name: row[f.name] for f in fields(cls)})  # type: ignore[arg-type]


class Database:
    """One connection to ``path``, opened with the library's rules (module docstring) and
    migrated to ``schemas``. Thread-safe: every use holds :attr:`lock` (reentrant, so a store
    may hold it across several calls). Blocking: call it through ``anyio.to_thread`` from async
    code, except reads by primary key, which are short."""

    def __init__(self, path: Path, schemas: Iterable[Schema] = ()) -> None:
        self.path = path
        touch_private(path)  # before SQLite creates it with the umask's mode
        self.lock = threading.RLock()
        self.conn = sqlite3.connect(
            path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S
        )
        self.conn.row_factory = sqlite3.Row
        self._migrated: set[str] = set()
        try:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            for schema in schemas:
                self.migrate(schema)
        except BaseException:
            self.conn.close()
            raise

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` .. ``COMMIT`` (``ROLLBACK`` on error), holding the lock."""
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self._rollback()
                raise
            try:
                self.conn.execute("COMMIT")
            except sqlite3.Error:  # e.g. a full disk: leave no transaction open behind us
                self._rollback()
                raise

    def _rollback(self) -> None:
        if self.conn.in_transaction:  # SQLite may have rolled back already (a full disk)
            with contextlib.suppress(sqlite3.Error):  # keep the error that got us here
                self.conn.execute("ROLLBACK")

    def one(self, sql: str, args: Iterable[Any] = ()) -> sqlite3.Row | None:
        with self.lock:
            row: sqlite3.Row | None = self.conn.execute(sql, tuple(args)).fetchone()
            return row

    def all(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self.lock:
            return list(self.conn.execute(sql, tuple(args)).fetchall())

    def write(self, sql: str, args: Iterable[Any] = ()) -> int:
        """Run one statement in its own transaction; the number of rows it changed."""
        with self.transaction() as db:
            return int(db.execute(sql, tuple(args)).rowcount)

    def migrate(self, schema: Schema) -> None:
        """Bring ``schema``'s tables to its newest version (once per connection; see the
        module's docstring)."""
        if schema.name in self._migrated:
            return
        with self.lock:
            if self._version(schema) == schema.version:  # the usual case: no write lock taken
                self._migrated.add(schema.name)
                return
        with self.transaction() as db:
            db.execute(_VERSIONS)
            have = self._version(schema)  # again: another process may have migrated meanwhile
            if have > schema.version:
                raise StateVersionError(
                    f"{self.path}: the {schema.name} tables are at version {have}, newer than "
                    f"this batchclient's {schema.version}: use a newer batchclient"
                )
            for migration in schema.migrations[have:]:
                if isinstance(migration.apply, str):
                    for statement in migration.apply.split(";"):
                        if statement.strip():
                            db.execute(statement)
                else:
                    migration.apply(db)
            if have < schema.version:
                db.execute(
                    "INSERT OR REPLACE INTO schema_versions VALUES (?, ?)",
                    (schema.name, schema.version),
                )
        self._migrated.add(schema.name)

    def _version(self, schema: Schema) -> int:
        try:
            row = self.conn.execute(
                "SELECT version FROM schema_versions WHERE name = ?", (schema.name,)
            ).fetchone()
        except sqlite3.OperationalError:  # no schema_versions table yet
            return 0
        return 0 if row is None else int(row[0])

    def close(self) -> None:
        with self.lock:
            self.conn.close()
