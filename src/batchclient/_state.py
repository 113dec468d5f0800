"""The library's databases: SQLite files by default, or one shared PostgreSQL; schema migrations.

Every durable table of batchclient lives in a database opened here: the jobs' files, jobs and
results (:mod:`batchclient.jobs`), the remote Batch API's parts and calls
(:mod:`batchclient.batchapi`), the result cache (:mod:`batchclient.cache`, also used by the
lm-eval model) and the server's webhook outbox (:mod:`batchclient.server._webhooks`) in the
state directory's ``batchclient.sqlite3``, and the server's idempotency keys in each tenant's
``server.sqlite3``.

Rules of a SQLite :class:`Database`: the parent directory and any missing folder above it are
created ``0700`` (one that exists keeps its mode), the file is created ``0600`` before SQLite
opens it (SQLite gives its ``-wal`` and ``-shm`` files the database's mode), WAL with
``synchronous=NORMAL`` (a commit survives the death of the process, not a power cut), a
30-second busy timeout (other processes read and write the same file), and autocommit: writes
go through :meth:`Database.transaction` (``BEGIN IMMEDIATE`` .. ``COMMIT``).

PostgreSQL: a state directory bound to a ``postgresql://`` URL (:func:`bind`, done by a job
manager or server given ``database=``) keeps every database file under it in one PostgreSQL
schema instead (``batchclient`` by default; a tenant of the server gets its own), so that
processes on any hosts share them. The stores write one SQL for both: the common subset
(``INSERT .. ON CONFLICT``, row values, partial indexes), with ``?`` placeholders; the
:class:`_PgConnection` rewrites the few SQLite spellings left (``?``, ``INSERT OR IGNORE``,
``INDEXED BY``, ``IS ?``, ``json_extract``, and in DDL the types, ``WITHOUT ROWID`` and the
implicit ``rowid``, made an explicit ``BIGSERIAL`` column). Transactions keep SQLite's meaning:
each write transaction first takes a transaction-level advisory lock of its schema
(``pg_advisory_xact_lock``), so writers of one schema run one at a time, as ``BEGIN IMMEDIATE``
makes them on a SQLite file, and every read-then-write the stores do stays correct with no
change; readers never wait. A migration holds the same lock, so it runs once, in whichever
process starts first. Store code that must differ (triggers) asks :attr:`Connection.dialect`.

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
import functools
import hashlib
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from .errors import BatchClientError, ConfigurationError

__all__ = [
    "DB_ERRORS",
    "STORAGE_ERRORS",
    "Connection",
    "Database",
    "Migration",
    "Schema",
    "StateVersionError",
    "add_columns",
    "bind",
    "bound",
    "exists",
    "record",
    "touch_private",
]

BUSY_TIMEOUT_S = 30.0
"""How long a statement waits for another connection's write lock before failing."""
DATABASE_ENV = "BATCHCLIENT_DATABASE_URL"
"""The environment variable read where no ``database=`` is given."""
IDLE_IN_TRANSACTION_S = 5
"""PostgreSQL ends a connection of ours left idle inside a transaction this long (seconds): a
process frozen or cut off mid-transaction would otherwise hold its schema's write lock, and
stop every other process's writes, for as long as it stays so."""
DEFAULT_SCHEMA = "batchclient"
"""The PostgreSQL schema of a state directory bound without one."""

_VERSIONS = (
    "CREATE TABLE IF NOT EXISTS schema_versions("
    "name TEXT PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID"
)

Dialect = Literal["sqlite", "postgresql"]
R = TypeVar("R")


class Connection(Protocol):
    """What a store's SQL runs on: a SQLite connection or :class:`_PgConnection`. Rows read
    both by column name and by index."""

    dialect: Dialect

    def execute(self, sql: str, args: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, sql: str, args: Iterable[Sequence[Any]], /) -> Any: ...


Step = Callable[[Any], None]  # given a Connection


def _errors() -> tuple[type[Exception], ...]:
    try:
        import psycopg
    except ImportError:
        return (sqlite3.Error,)
    return (sqlite3.Error, psycopg.Error)


DB_ERRORS = _errors()
"""The exceptions a database may raise (SQLite's, and PostgreSQL's where ``psycopg`` is
installed): what the stores catch where a failing database must not stop the work."""
STORAGE_ERRORS: tuple[type[Exception], ...] = (OSError, *DB_ERRORS)
""":data:`DB_ERRORS` and ``OSError`` (a full disk, a state directory removed)."""


class StateVersionError(BatchClientError, RuntimeError):
    """The database was migrated by a newer batchclient than this one."""


@dataclass(frozen=True)
class Migration:
    """Step ``version`` of a schema: SQL statements separated by ``;`` (no ``;`` inside
    them), or a function given the :class:`Connection` (inside the migration's transaction)."""

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

    def step(db: Connection) -> None:
        if db.dialect == "postgresql":
            for column in columns:
                db.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column}")
            return
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


def record(cls: type[R], row: Any) -> R:
    """The dataclass ``cls`` from a row holding (at least) a column per field."""
    return cls(**{f.name: row[f.name] for f in fields(cls)})  # type: ignore[arg-type]


# ---------------------------------------------------------------------- where a database lives


@dataclass(frozen=True)
class Shared:
    """A PostgreSQL database (``url``) and the schema a state directory's tables live in."""

    url: str
    schema: str = DEFAULT_SCHEMA


_BOUND: dict[Path, Shared] = {}
_BOUND_LOCK = threading.Lock()
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def database_url(database: str | None) -> str | None:
    """``database`` if given, else ``$BATCHCLIENT_DATABASE_URL`` (None: SQLite files). Raises
    ``ConfigurationError`` for a URL that is not ``postgresql://`` (or ``postgres://``)."""
    url = database if database is not None else os.environ.get(DATABASE_ENV) or None
    if url is None:
        return None
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigurationError(
            "database must be a postgresql:// URL (without one, state is kept in SQLite files "
            "in the state directory)"
        )
    return url


def bind(state_dir: Path, url: str, schema: str | None = None) -> Shared:
    """Keep the databases of ``state_dir`` in PostgreSQL at ``url``, in ``schema`` (a lowercase
    SQL name; default: the one it is bound to already, else ``batchclient``). Binding a folder
    again to the same URL keeps its schema unless one is given. Returns the binding."""
    if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
        raise ConfigurationError(f"not a schema name: {schema!r} (lowercase letters, digits, _)")
    key = state_dir.expanduser().resolve()
    with _BOUND_LOCK:
        have = _BOUND.get(key)
        if schema is None:
            schema = have.schema if have is not None and have.url == url else DEFAULT_SCHEMA
        shared = _BOUND[key] = Shared(url, schema)
    return shared


def bound(state_dir: Path) -> Shared | None:
    """The PostgreSQL database ``state_dir`` is bound to, or None (SQLite files)."""
    return _BOUND.get(state_dir.expanduser().resolve())


def exists(path: Path) -> bool:
    """Whether the database at ``path`` may hold tables already: its file exists, or its
    folder is bound to PostgreSQL."""
    return path.exists() or bound(path.parent) is not None


# ---------------------------------------------------------------------- PostgreSQL


@functools.lru_cache(maxsize=1024)
def _translate(sql: str, has_args: bool) -> str:
    """A statement of the stores' SQL as PostgreSQL runs it (see the module docstring)."""
    head = sql.lstrip()[:24].upper()
    if head.startswith(("CREATE TABLE", "ALTER TABLE")):
        sql = re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)
        sql = re.sub(r"\bBLOB\b", "BYTEA", sql)
        sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
        if head.startswith("CREATE TABLE"):
            if "WITHOUT ROWID" in sql:
                sql = sql.replace("WITHOUT ROWID", "")
            else:  # SQLite's implicit rowid (insertion order), explicit here
                sql = sql[: sql.rindex(")")] + ", rowid BIGSERIAL)" + sql[sql.rindex(")") + 1 :]
    if "INSERT OR IGNORE" in sql:
        sql = sql.replace("INSERT OR IGNORE", "INSERT") + " ON CONFLICT DO NOTHING"
    sql = re.sub(r"\s+INDEXED BY \w+", "", sql)
    sql = re.sub(r"json_extract\((\w+), '\$\.(\w+)'\)", r"(\1::jsonb ->> '\2')", sql)
    if has_args:
        sql = sql.replace("%", "%%").replace(" IS ?", " IS NOT DISTINCT FROM ?")
        sql = sql.replace("?", "%s")
    return sql


def _advisory_key(schema: str) -> int:
    """A signed 64-bit key naming ``schema``'s write lock."""
    digest = hashlib.sha256(f"batchclient:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@functools.lru_cache(maxsize=256)
def _row_class(names: tuple[str, ...]) -> type[tuple[Any, ...]]:
    index = {name: i for i, name in enumerate(names)}

    class Row(tuple):  # type: ignore[type-arg]
        """A row read by column name or by index, like ``sqlite3.Row``."""

        __slots__ = ()

        def __getitem__(self, key: Any) -> Any:
            if isinstance(key, str):
                return tuple.__getitem__(self, index[key])
            return tuple.__getitem__(self, key)

        def keys(self) -> list[str]:
            return list(names)

    return Row


class _PgConnection:
    """One ``psycopg`` connection (autocommit, ``search_path`` = the schema) speaking the
    stores' SQL. Reconnects on the next use after the connection broke (a database restart);
    the statement that found it broken fails."""

    dialect: Dialect = "postgresql"

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.lock_key = _advisory_key(shared.schema)
        self._conn: Any = None
        self.clock_offset = 0.0
        """The database server's clock minus this host's, seconds (measured at connect, half
        a round trip off at most)."""
        self._connect()

    def _connect(self) -> None:
        try:
            import psycopg
            from psycopg.adapt import Dumper, Loader
        except ImportError as exc:  # pragma: no cover - an install without the extra
            raise ConfigurationError(
                "a postgresql:// database needs psycopg: pip install 'batchclient[postgres]'"
            ) from exc

        class _BoolAsInt(Dumper):  # SQLite has no booleans: the stores write 0 and 1
            oid = psycopg.postgres.types["int8"].oid

            def dump(self, obj: Any) -> bytes:
                return b"1" if obj else b"0"

        class _Number(Loader):  # sum() is numeric: give ints and floats, as SQLite does
            def load(self, data: Any) -> Any:
                text = bytes(data)
                return int(text) if text.lstrip(b"-").isdigit() else float(text)

        def rows(cursor: Any) -> Callable[[Sequence[Any]], Any]:
            cls = _row_class(tuple(c.name for c in cursor.description or ()))
            return cls

        conn = psycopg.connect(self.shared.url, autocommit=True, row_factory=rows)
        conn.adapters.register_dumper(bool, _BoolAsInt)
        conn.adapters.register_loader("numeric", _Number)
        schema = self.shared.schema
        try:
            # CREATE SCHEMA IF NOT EXISTS races with itself in other processes: under the lock
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self.lock_key,))
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            conn.execute(f'SET search_path TO "{schema}"')
            before = time.time()
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
            assert row is not None
            self.clock_offset = float(row[0]) - (before + time.time()) / 2
            conn.execute(
                f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_S * 1000}"
            )
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _live(self) -> Any:
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
            self._conn = None
            self._connect()
        return self._conn

    @property
    def in_transaction(self) -> bool:
        import psycopg

        conn = self._conn
        return (
            conn is not None
            and not conn.closed
            and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        )

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> Any:
        args = tuple(args)
        return self._live().execute(_translate(sql, bool(args)), args or None)

    def executemany(self, sql: str, args: Iterable[Sequence[Any]], /) -> Any:
        cursor = self._live().cursor()
        cursor.executemany(_translate(sql, True), [tuple(a) for a in args])
        return cursor

    def begin(self, *, exclusive: bool = True) -> None:
        if not exclusive:
            self._live().execute("BEGIN")
            return
        # one round trip (the simple query protocol takes both statements)
        self._live().execute(f"BEGIN; SELECT pg_advisory_xact_lock({int(self.lock_key)})")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class _SqliteConnection(sqlite3.Connection):
    dialect: Dialect = "sqlite"


class Database:
    """One connection to the database at ``path`` (a SQLite file, or the PostgreSQL schema its
    folder is bound to: module docstring), migrated to ``schemas``. Thread-safe: every use holds
    :attr:`lock` (reentrant, so a store may hold it across several calls). Blocking: call it
    through ``anyio.to_thread`` from async code, except reads by primary key, which are
    short."""

    def __init__(self, path: Path, schemas: Iterable[Schema] = ()) -> None:
        self.path = path
        self.shared = bound(path.parent)
        self.lock = threading.RLock()
        self.conn: Any
        if self.shared is not None:
            self.conn = _PgConnection(self.shared)
        else:
            touch_private(path)  # before SQLite creates it with the umask's mode
            self.conn = sqlite3.connect(
                path,
                check_same_thread=False,
                isolation_level=None,
                timeout=BUSY_TIMEOUT_S,
                factory=_SqliteConnection,
            )
            self.conn.row_factory = sqlite3.Row
        self._migrated: set[str] = set()
        try:
            if self.shared is None:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
            for schema in schemas:
                self.migrate(schema)
        except BaseException:
            self.conn.close()
            raise

    def now(self) -> float:
        """Unix seconds on the database's clock: a shared database's server clock (so processes
        on hosts whose clocks differ agree on the age of a lease), else this host's."""
        if isinstance(self.conn, _PgConnection):
            return time.time() + self.conn.clock_offset
        return time.time()

    @property
    def dialect(self) -> Dialect:
        return "sqlite" if self.shared is None else "postgresql"

    @property
    def name(self) -> str:
        """Where the database is, for messages (a PostgreSQL URL without its password)."""
        if self.shared is None:
            return str(self.path)
        return f"{_without_password(self.shared.url)} (schema {self.shared.schema})"

    @contextlib.contextmanager
    def transaction(self, *, exclusive: bool = True) -> Iterator[Any]:
        """One write transaction (``ROLLBACK`` on error), holding the lock: SQLite's
        ``BEGIN IMMEDIATE``, or PostgreSQL's ``BEGIN`` and the schema's write lock.
        ``exclusive=False``: without that lock on PostgreSQL, for a transaction that only
        inserts rows nothing reads before it commits (a new file's bytes: a long transaction
        that would hold every other writer up)."""
        with self.lock:
            if isinstance(self.conn, _PgConnection):
                self.conn.begin(exclusive=exclusive)
            else:
                self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self._rollback()
                raise
            try:
                self.conn.execute("COMMIT")
            except DB_ERRORS:  # e.g. a full disk: leave no transaction open behind us
                self._rollback()
                raise

    def _rollback(self) -> None:
        if self.conn.in_transaction:  # SQLite may have rolled back already (a full disk)
            with contextlib.suppress(*DB_ERRORS):  # keep the error that got us here
                self.conn.execute("ROLLBACK")

    def one(self, sql: str, args: Iterable[Any] = ()) -> Any:
        with self.lock:
            return self.conn.execute(sql, tuple(args)).fetchone()

    def all(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        with self.lock:
            return list(self.conn.execute(sql, tuple(args)).fetchall())

    def write(self, sql: str, args: Iterable[Any] = ()) -> int:
        """Run one statement in its own transaction; the number of rows it changed."""
        with self.transaction() as db:
            return int(db.execute(sql, tuple(args)).rowcount)

    def write_returning(self, sql: str, args: Iterable[Any] = ()) -> Any:
        """Run one statement ending in ``RETURNING`` in its own transaction; its first row (None
        when it changed no row)."""
        with self.transaction() as db:
            return db.execute(sql, tuple(args)).fetchone()

    def ping(self) -> None:
        """Raise unless the database answers (a broken PostgreSQL connection reconnects)."""
        self.one("SELECT 1")

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
                    f"{self.name}: the {schema.name} tables are at version {have}, newer than "
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
                    "INSERT INTO schema_versions (name, version) VALUES (?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET version = excluded.version",
                    (schema.name, schema.version),
                )
        self._migrated.add(schema.name)

    def _version(self, schema: Schema) -> int:
        if isinstance(self.conn, _PgConnection):
            # a missing table would abort the transaction around us: ask first
            row = self.conn.execute("SELECT to_regclass('schema_versions') IS NOT NULL").fetchone()
            if not row[0]:
                return 0
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


def _without_password(url: str) -> str:
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)
