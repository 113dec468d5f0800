"""The remote batches ("parts") of one local job: their records, writing their input files from
the job's input, and turning their output and error files back into result rows.

Records (:class:`RemoteIds`, schema ``batchapi`` in the jobs' database): ``remote_parts`` (each
remote batch a job owns: its range of input lines, remote file and batch ids, last seen status
and request counts) and ``remote_calls`` (the job behind each call, by content key, so a
repeated call re-attaches).

A part covers a range of the job's input lines (``first_seq .. first_seq + count - 1``, at most
``max_lines`` long) and holds the lines of that range that were not finished when it was written,
in input order, up to ``max_bytes``. The same range and the same finished set always give the same
lines, so a part's file can be written again after a crash, and a remote error's 1-based ``line``
maps back to its input line.

Everything here is blocking (run it through ``anyio.to_thread``) and streams: a part file is
written line by line, and collecting an output file keeps only an index of ``custom_id`` -> byte
offset in memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from .._core.decode import classify_http, http_error
from .._core.request import Result, failed, item_error
from .._state import Database, Migration, Schema, record
from ..errors import ErrorCode
from ..jobs import RequestLine, ResultRow, Store, iter_requests, request_for, row_for
from ..types import Endpoint
from ._api import RemoteError

_COMMIT_EVERY = 512
UNFINISHED_CODES = frozenset({"batch_expired", "batch_cancelled"})
"""Error-file codes that mean "not run": such lines stay unfinished (to be re-run or filled)."""


@dataclass
class Part:
    """One remote batch of a job (a ``remote_parts`` row). ``state``: ``planned`` (range chosen),
    ``uploaded`` (``input_file_id`` known), ``submitted`` (``batch_id`` known), ``collected``
    (its results are committed). ``completed`` / ``failed``: the remote request counts last
    seen."""

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


@dataclass(frozen=True)
class RemoteCall:
    """A ``remote_calls`` row: the job behind a call's content key, and whether the call's
    answer was given to its caller."""

    call_key: str
    job_id: str
    delivered: bool


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
            "INSERT OR REPLACE INTO remote_calls VALUES (?, ?, ?)",
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


def openai_line(line: RequestLine, endpoint: str) -> bytes:
    """The OpenAI Batch API's encoder: the line as it came, under its own ``custom_id``."""
    return batch_line(line.custom_id, endpoint, line.body)


class LineCursor:
    """The request lines of a job's input file from ``start``, with one line of look-ahead."""

    def __init__(self, path: Path, start: int = 0) -> None:
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
    first_seq: int
    count: int
    lines: int
    bytes: int


def write_part(
    cursor: LineCursor,
    store: Store,
    job_id: str,
    endpoint: str,
    limits: Limits,
    path: Path,
    encode: Encoder = openai_line,
) -> PartPlan | None:
    """Write the next part from ``cursor`` to ``path``; None when the input is exhausted. A
    line that alone exceeds ``max_bytes``, or that ``encode`` refuses, is committed at once as
    a per-item error."""
    first = cursor.peek()
    if first is None:
        return None
    lo = first.seq
    hi = lo + limits.max_lines - 1
    done = store.finished_seqs(job_id, lo, hi)
    lines = size = 0
    last = lo - 1
    too_big: list[ResultRow] = []
    with private_file(path) as out:
        while (line := cursor.peek()) is not None and line.seq <= hi:
            if line.seq not in done:
                data = encode(line, endpoint)
                if isinstance(data, Result):
                    too_big.append(_row(job_id, line, data, Endpoint(endpoint)))
                elif len(data) > limits.max_bytes:
                    result = failed(
                        ErrorCode.invalid_request,
                        f"the request line is {len(data)} bytes, over the remote batch limit of "
                        f"{limits.max_bytes} bytes (max_bytes)",
                    )
                    too_big.append(_row(job_id, line, result, Endpoint(endpoint)))
                else:
                    if size + len(data) > limits.max_bytes:
                        break
                    out.write(data)
                    size += len(data)
                    lines += 1
            last = line.seq
            cursor.advance()
    if too_big:
        store.commit_results(job_id, too_big)
    return PartPlan(first_seq=lo, count=last - lo + 1, lines=lines, bytes=size)


def part_lines(store: Store, job_id: str, input_path: Path, part: Part) -> Iterator[RequestLine]:
    """The lines a part holds (its range less what was finished before it was written)."""
    done = store.finished_seqs(job_id, part.first_seq, part.first_seq + part.count - 1)
    cursor = LineCursor(input_path, part.first_seq)
    try:
        while (line := cursor.peek()) is not None and line.seq < part.first_seq + part.count:
            cursor.advance()
            if line.seq not in done:
                yield line
    finally:
        cursor.close()


def rewrite_part(
    store: Store,
    job_id: str,
    input_path: Path,
    part: Part,
    endpoint: str,
    path: Path,
    encode: Encoder = openai_line,
) -> int:
    """Write a part's file again (after a crash before its upload, or to resubmit what is
    left of it); the number of lines. A line ``encode`` refuses is committed as its error."""
    n = 0
    sink = _Committer(store, job_id)
    with private_file(path) as out:
        for line in part_lines(store, job_id, input_path, part):
            data = encode(line, endpoint)
            if isinstance(data, Result):
                sink.add(line, data)
                continue
            out.write(data)
            n += 1
    sink.flush()
    return n


def _row(job_id: str, line: RequestLine, result: Result, endpoint: Endpoint) -> ResultRow:
    # the line's endpoint decides how its answer is checked (a completion has no message)
    return row_for(job_id, request_for(line.seq, line.custom_id, line.body, endpoint), result)


class _Committer:
    def __init__(self, store: Store, job_id: str) -> None:
        self.store, self.job_id, self.rows = store, job_id, list[ResultRow]()
        self.endpoint = Endpoint(store.job_row(job_id).endpoint)

    def add(self, line: RequestLine, result: Result) -> None:
        self.rows.append(_row(self.job_id, line, result, self.endpoint))
        if len(self.rows) >= _COMMIT_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.store.commit_results(self.job_id, self.rows)
            self.rows = []


# ---------------------------------------------------------------------------- output -> results


def line_result(obj: Any) -> Result | None:
    """The result of one remote output or error line; None for a request the batch did not run
    (``batch_expired`` / ``batch_cancelled``)."""
    if not isinstance(obj, dict):
        return _bad("the remote output line is not a JSON object")
    response, error = obj.get("response"), obj.get("error")
    if isinstance(response, dict) and isinstance(response.get("status_code"), int):
        status, body = response["status_code"], response.get("body")
        if 200 <= status < 300:
            if not isinstance(body, dict):
                result = _bad(f"HTTP {status} answer without a JSON object body", status)
            else:
                result = Result(status_code=status, body=body)
        else:
            result = http_error(status, json.dumps(body) if body is not None else None)
        request_id = response.get("request_id")
        result.request_id = request_id if isinstance(request_id, str) else None
        return result
    if isinstance(error, dict):
        code = str(error.get("code") or ErrorCode.server_error.value)
        if code in UNFINISHED_CODES:
            return None
        message = str(error.get("message") or "the remote batch reported an error")
        return Result(status_code=None, body=None, error=item_error(code, message))
    return _bad("the remote output line has neither a response nor an error")


def _bad(message: str, status: int | None = None) -> Result:
    result = failed(ErrorCode.bad_upstream_response, message)
    if result.error is not None:
        result.error.status_code = status
    return result


def _retryable(obj: Any) -> bool:
    error = obj.get("error") if isinstance(obj, dict) else None
    return isinstance(error, dict) and error.get("retryable") is True


def _index(paths: list[Path]) -> dict[str, tuple[int, int]]:
    """``custom_id`` -> (file number, byte offset) of its line; the first line wins."""
    index: dict[str, tuple[int, int]] = {}
    for n, path in enumerate(paths):
        with path.open("rb") as f:
            offset = 0
            for raw in f:
                try:
                    cid = orjson.loads(raw).get("custom_id")
                except (orjson.JSONDecodeError, AttributeError):
                    cid = None
                if isinstance(cid, str) and cid not in index:
                    index[cid] = (n, offset)
                offset += len(raw)
    return index


def collect(
    store: Store,
    job_id: str,
    input_path: Path,
    part: Part,
    files: list[Path],
    *,
    complete: bool,
    wire_id: Callable[[RequestLine], str] | None = None,
    defer_retryable: bool = False,
) -> int:
    """Commit the results of a finished remote batch from its downloaded output and error
    ``files``; return how many of its lines stay unfinished. With ``complete`` (the batch
    ``completed``) a line without a result is a ``bad_upstream_response`` item; otherwise (an
    expired or cancelled batch) it stays unfinished. ``wire_id``: the id a line was sent under
    (default its ``custom_id``); ``defer_retryable``: an error line marked ``"retryable":
    true`` stays unfinished (to be submitted again) instead of being committed."""
    index = _index(files)
    handles = [p.open("rb") for p in files]
    sink = _Committer(store, job_id)
    unfinished = 0
    try:
        for line in part_lines(store, job_id, input_path, part):
            where = index.get(line.custom_id if wire_id is None else wire_id(line))
            result: Result | None
            if where is None:
                result = (
                    _bad("the remote batch completed without a result for this request")
                    if complete
                    else None
                )
            else:
                f = handles[where[0]]
                f.seek(where[1])
                try:
                    obj = orjson.loads(f.readline())
                    result = None if defer_retryable and _retryable(obj) else line_result(obj)
                except orjson.JSONDecodeError:
                    result = _bad("the remote output line is not valid JSON")
            if result is None:
                unfinished += 1
                continue
            sink.add(line, result)
        sink.flush()
    finally:
        for f in handles:
            f.close()
    return unfinished


def fail_lines(
    store: Store,
    job_id: str,
    input_path: Path,
    part: Part,
    errors: list[RemoteError],
    *,
    batch_id: str,
    fill_rest: bool,
) -> int:
    """Commit a ``failed`` remote batch's validation errors to their lines (``line`` is 1-based
    in the part's file). With ``fill_rest``, or when no error names a line, every other line fails
    too (``batch_failed``, or the batch's own error). Returns how many lines stay unfinished."""
    by_line = {e.line: e for e in errors if e.line is not None}
    general = next((e for e in errors if e.line is None), None)
    sink = _Committer(store, job_id)
    unfinished = 0
    for number, line in enumerate(part_lines(store, job_id, input_path, part), start=1):
        err = by_line.get(number)
        if err is not None:
            code = err.code or ErrorCode.invalid_request.value
            message = err.message or "the remote batch refused this line"
            sink.add(line, Result(None, None, error=item_error(code, message, param=err.param)))
        elif fill_rest or not by_line:
            first = general or (errors[0] if errors else None)
            code = general.code if general and general.code else ErrorCode.batch_failed.value
            detail = f": {first.code}: {first.message}" if first else ""
            message = f"the remote batch {batch_id} failed{detail}"
            sink.add(line, Result(None, None, error=item_error(code, message)))
        else:
            unfinished += 1
    sink.flush()
    return unfinished


def fail_part(
    store: Store, job_id: str, input_path: Path, part: Part, message: str, status: int | None
) -> None:
    """Every unfinished line of a part fails (its file could not be uploaded, its batch not
    created, polled or downloaded)."""
    code = ErrorCode.endpoint_unavailable if status is None else classify_http(status, message)
    sink = _Committer(store, job_id)
    for line in part_lines(store, job_id, input_path, part):
        sink.add(line, failed(code, message, status_code=status))
    sink.flush()
