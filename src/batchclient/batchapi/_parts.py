"""The remote batches ("parts") of one local job: their records (:class:`RemoteIds`, schema
``batchapi`` in the jobs' database: :class:`Part` and :class:`RemoteCall` rows), and their
input files, written from the job's input (their results come back through :mod:`._collect`).

A part covers a range of the job's input lines (``first_seq .. first_seq + count - 1``, at most
``max_lines`` long) and holds the lines of that range that were not finished when it was written,
in input order, up to ``max_bytes``. The same range and the same finished set always give the same
lines, so a part's file can be written again after a crash, and a remote error's 1-based ``line``
maps back to its input line.

Everything here is blocking (run it through ``anyio.to_thread``) and streams.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from .._core.decode import classify_http
from .._core.request import Result, failed
from .._state import Connection, Database, Migration, Schema, add_columns, record
from ..errors import ErrorCode
from ..jobs._output import request_for, row_for
from ..jobs._store import ResultRow, Store
from ..jobs._validate import RequestLine, iter_requests
from ..types import Endpoint

_COMMIT_EVERY = 512


@dataclass
class Part:
    """One remote batch of a job (a ``remote_parts`` row). ``state``: ``planned`` (range chosen),
    ``uploaded`` (its file is where a create can name it: ``input_file_id``, None for a
    backend whose create carries the requests), ``submitted`` (``batch_id`` known),
    ``collected`` (its results are committed). ``sent_at``: when its create first went out
    (Unix seconds; None: never), so a create whose answer was lost is looked for, not
    repeated. ``completed`` / ``failed``: the remote request counts last seen."""

    job_id: str
    part: int
    first_seq: int
    count: int
    attempt: int = 1
    state: str = "planned"
    input_file_id: str | None = None
    batch_id: str | None = None
    remote_status: str | None = None
    completed: int = 0
    failed: int = 0
    sent_at: float | None = None


@dataclass(frozen=True)
class RemoteCall:
    """A ``remote_calls`` row: the job behind a call's content key, and whether the call's
    answer was given to its caller."""

    call_key: str
    job_id: str
    delivered: bool


def _sent_at(db: Connection) -> None:
    """``sent_at``; parts caught between upload and create keep their meaning: an OpenAI part
    ``uploaded`` may have had its create sent (look first), and the other backends kept the
    time in ``input_file_id`` as ``create@<unix time>``."""
    add_columns("remote_parts", "sent_at REAL")(db)
    db.execute(
        "UPDATE remote_parts SET sent_at = CAST(substr(input_file_id, 8) AS REAL), "
        "input_file_id = NULL WHERE input_file_id LIKE 'create@%'"
    )
    db.execute("UPDATE remote_parts SET sent_at = 0 WHERE state = 'uploaded' AND sent_at IS NULL")


SCHEMA = Schema(
    "batchapi",
    (
        Migration(
            1,
            """
CREATE TABLE IF NOT EXISTS remote_parts(
    job_id TEXT NOT NULL, part INTEGER NOT NULL, first_seq INTEGER NOT NULL,
    count INTEGER NOT NULL, attempt INTEGER NOT NULL DEFAULT 1, state TEXT NOT NULL,
    input_file_id TEXT, batch_id TEXT, remote_status TEXT,
    completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(job_id, part));
CREATE TABLE IF NOT EXISTS remote_calls(
    call_key TEXT PRIMARY KEY, job_id TEXT NOT NULL, delivered INTEGER NOT NULL DEFAULT 0)
""",
        ),
        Migration(2, _sent_at),
    ),
)


class RemoteIds:
    """The remote parts and calls in ``store``'s database. Its methods are blocking and
    thread-safe (the store's connection and lock); the first one makes the tables."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def _db(self) -> Database:
        db = self._store.db
        db.migrate(SCHEMA)  # once per connection
        return db

    def add_part(self, job_id: str, part: int, first_seq: int, count: int, attempt: int) -> None:
        """Record a planned remote batch covering input lines ``first_seq .. +count``."""
        self._db().write(
            "INSERT INTO remote_parts (job_id, part, first_seq, count, attempt, state) "
            "VALUES (?, ?, ?, ?, ?, 'planned')",
            (job_id, part, first_seq, count, attempt),
        )

    def update_part(self, job_id: str, part: int, **fields: Any) -> None:
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._db().write(
            f"UPDATE remote_parts SET {sets} WHERE job_id = ? AND part = ?",
            [*fields.values(), job_id, part],
        )

    def parts(self, job_id: str) -> list[Part]:
        """The job's remote batches, in part order."""
        sql = "SELECT * FROM remote_parts WHERE job_id = ? ORDER BY part"
        return [record(Part, r) for r in self._db().all(sql, (job_id,))]

    def call(self, call_key: str) -> RemoteCall | None:
        row = self._db().one("SELECT * FROM remote_calls WHERE call_key = ?", (call_key,))
        if row is None:
            return None
        return RemoteCall(str(row["call_key"]), str(row["job_id"]), bool(row["delivered"]))

    def set_call(self, call_key: str, job_id: str, *, delivered: bool = False) -> None:
        self._db().write(
            "INSERT INTO remote_calls (call_key, job_id, delivered) VALUES (?, ?, ?) "
            "ON CONFLICT (call_key) DO UPDATE SET job_id = excluded.job_id, "
            "delivered = excluded.delivered",
            (call_key, job_id, int(delivered)),
        )


@dataclass(frozen=True)
class Limits:
    """Split limits of one remote batch: lines and bytes of its input file."""

    max_lines: int
    max_bytes: int


def private_file(path: Path) -> IO[bytes]:
    """Open ``path`` for writing, readable by this user only (mode 0600): it holds prompts."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")


def batch_line(custom_id: str, endpoint: str, body: dict[str, Any]) -> bytes:
    """One line of an OpenAI batch input file."""
    line = {"custom_id": custom_id, "method": "POST", "url": endpoint, "body": body}
    return orjson.dumps(line) + b"\n"


Encoder = Callable[[RequestLine, str], bytes | Result]
"""How a job's input line (and the job's endpoint) becomes one line of a part's file: its
bytes, or a failed :class:`Result` for a request the remote API cannot take (committed as that
line's per-item error; the line is not sent)."""


class LineCursor:
    """The request lines of a job's input file from ``start``, with one line of look-ahead."""

    def __init__(self, path: Path, start: int) -> None:
        self._file: IO[bytes] = path.open("rb")
        self._lines = iter_requests(self._file)
        self._next: RequestLine | None = None
        while (line := self.peek()) is not None and line.seq < start:
            self.advance()

    def peek(self) -> RequestLine | None:
        if self._next is None:
            self._next = next(self._lines, None)
        return self._next

    def advance(self) -> None:
        self._next = None

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class PartPlan:
    """A part as written: input lines ``first_seq .. first_seq + count - 1``, ``lines`` of
    them in its file."""

    first_seq: int
    count: int
    lines: int


def write_part(
    cursor: LineCursor,
    store: Store,
    job_id: str,
    endpoint: str,
    limits: Limits,
    path: Path,
    encode: Encoder,
    *,
    whole: bool = False,
) -> PartPlan | None:
    """Write the unfinished lines among the next ``max_lines`` of ``cursor`` to ``path``,
    stopping before the line that would take the file over ``max_bytes`` (unless ``whole``: a
    part written again, whose lines fitted before); None when the input is exhausted. A line
    that ``encode`` refuses, or that alone exceeds ``max_bytes``, is committed at once as its
    per-item error."""
    first = cursor.peek()
    if first is None:
        return None
    lo = first.seq
    hi = lo + limits.max_lines - 1
    done = store.finished_seqs(job_id, lo, hi)
    lines = size = 0
    last = lo - 1
    sink = Committer(store, job_id)
    with private_file(path) as out:
        while (line := cursor.peek()) is not None and line.seq <= hi:
            if line.seq not in done:
                data = encode(line, endpoint)
                if isinstance(data, bytes) and len(data) > limits.max_bytes:
                    data = failed(
                        ErrorCode.invalid_request,
                        f"the request line is {len(data)} bytes, over the remote batch limit "
                        f"of {limits.max_bytes} bytes (max_bytes)",
                    )
                if isinstance(data, Result):
                    sink.add(line, data)
                elif size + len(data) > limits.max_bytes and not whole:
                    break
                else:
                    out.write(data)
                    size += len(data)
                    lines += 1
            last = line.seq
            cursor.advance()
    sink.flush()
    return PartPlan(first_seq=lo, count=last - lo + 1, lines=lines)


def rewrite_part(
    store: Store, job_id: str, input_path: Path, part: Part, endpoint: str, path: Path,
    encode: Encoder, max_bytes: int,
) -> int:  # fmt: skip
    """Write a part's file again (after a crash before its upload, or to resubmit what is
    left of it) as :func:`write_part` does; the number of lines."""
    with closing(LineCursor(input_path, part.first_seq)) as cursor:
        limits = Limits(part.count, max_bytes)
        plan = write_part(cursor, store, job_id, endpoint, limits, path, encode, whole=True)
    return 0 if plan is None else plan.lines


def part_lines(store: Store, job_id: str, input_path: Path, part: Part) -> Iterator[RequestLine]:
    """The lines a part holds (its range less what was finished before it was written)."""
    done = store.finished_seqs(job_id, part.first_seq, part.first_seq + part.count - 1)
    with closing(LineCursor(input_path, part.first_seq)) as cursor:
        while (line := cursor.peek()) is not None and line.seq < part.first_seq + part.count:
            cursor.advance()
            if line.seq not in done:
                yield line


class Committer:
    """A job's result rows, committed ``_COMMIT_EVERY`` at a time (and by :meth:`flush`)."""

    def __init__(self, store: Store, job_id: str) -> None:
        self.store, self.job_id, self.rows = store, job_id, list[ResultRow]()
        self.endpoint = Endpoint(store.job_row(job_id).endpoint)

    def add(self, line: RequestLine, result: Result) -> None:
        # the job's endpoint decides how an answer is checked (a completion has no message)
        request = request_for(line.seq, line.custom_id, line.body, self.endpoint)
        self.rows.append(row_for(self.job_id, request, result))
        if len(self.rows) >= _COMMIT_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.store.commit_results(self.job_id, self.rows)
            self.rows = []


def fail_part(
    store: Store, job_id: str, input_path: Path, part: Part, message: str, status: int | None
) -> None:
    """Every unfinished line of a part fails (its file could not be uploaded, its batch not
    created, polled or downloaded)."""
    code = ErrorCode.endpoint_unavailable if status is None else classify_http(status, message)
    sink = Committer(store, job_id)
    for line in part_lines(store, job_id, input_path, part):
        sink.add(line, failed(code, message, status_code=status))
    sink.flush()
