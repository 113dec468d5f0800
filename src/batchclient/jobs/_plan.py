"""Which lines of a batch file are sent as they are.

Identical deterministic lines (same endpoint and canonical body, ``temperature`` 0 or an
embeddings request) are sent once: every later copy is *merged* into the first (``same_as``)
and gets its answer, the same request from the same server at the same moment. Identical
sampled lines are never merged; each gets a repeat index (0, 1, 2, ...) so the result cache
keeps ``k`` answers for ``k`` samples of one prompt.

The digests seen so far live in a private temporary on-disk SQLite database (as the validator's
custom ids do), so memory stays flat whatever the size of the file.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from ..cache._key import is_deterministic, request_digest
from ._store import Store
from ._validate import RequestLine

_FLUSH = 1000


@dataclass(frozen=True, slots=True)
class LinePlan:
    """How one line is sent: ``same_as`` the seq of the identical line it is merged into (None:
    it is sent), ``repeat`` its repeat index, ``digest`` its request digest."""

    digest: bytes
    same_as: int | None
    repeat: int


class LinePlanner:
    """Plans lines in file order (:meth:`add`). Close it (or use ``with``) when done."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.merged = 0
        self._db = sqlite3.connect("")  # "" = private temporary on-disk database
        self._db.execute(
            "CREATE TABLE seen(digest BLOB PRIMARY KEY, first INTEGER, n INTEGER) WITHOUT ROWID"
        )

    def add(self, seq: int, body: dict[str, Any]) -> LinePlan:
        digest = request_digest(self.endpoint, body)
        first, n = self._db.execute(
            "INSERT INTO seen VALUES (?, ?, 0) ON CONFLICT(digest) DO UPDATE SET n = n + 1 "
            "RETURNING first, n",
            (digest, seq),
        ).fetchone()
        if n == 0:
            return LinePlan(digest, None, 0)
        if is_deterministic(self.endpoint, body):
            self.merged += 1
            return LinePlan(digest, int(first), 0)
        return LinePlan(digest, None, int(n))

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> LinePlanner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JobLinePlanner:
    """:class:`LinePlanner` for a job: records merged and repeated lines in the store's
    ``job_lines`` (in chunks, as validation streams the file). Pass :meth:`__call__` as the
    validator's ``on_request``; :meth:`finish` writes the rest and closes."""

    def __init__(self, store: Store, job_id: str, endpoint: str) -> None:
        self._store = store
        self._job_id = job_id
        self._planner = LinePlanner(endpoint)
        self._pending: list[tuple[int, str, int | None, int]] = []

    def __call__(self, line: RequestLine) -> None:
        plan = self._planner.add(line.seq, line.body)
        if plan.same_as is not None or plan.repeat:
            self._pending.append((line.seq, line.custom_id, plan.same_as, plan.repeat))
            if len(self._pending) >= _FLUSH:
                self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._store.add_job_lines(self._job_id, self._pending)
            self._pending = []

    def finish(self, keep: bool) -> None:
        """Write what is left (``keep``) and close."""
        try:
            if keep:
                self._flush()
        finally:
            self._planner.close()
