"""The result cache's table, in the state directory's SQLite database (next to the jobs; opened
and migrated by :mod:`batchclient._state`, schema ``result_cache``).

One row per cached answer: ``key`` (:func:`~batchclient.cache.cache_key`), the endpoint and
model it answered (for ``batchclient cache stats`` / ``clear --model``), the HTTP status and
the response body, when it was stored, and how often it was used.

Writes are best-effort and grouped: new entries and hit counts are queued and written in one
transaction when 32 are queued or a quarter second has passed, and on :meth:`ResultCache.close`.
A write that fails (a full disk, a read-only state directory) is logged and dropped: the cache
never fails a request. Reads take the primary key, tens of microseconds, so they run in the
event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .._state import DB_ERRORS, Database, Migration, Schema

__all__ = ["CacheStats", "CachedAnswer", "ModelCacheStats", "ResultCache"]

log = logging.getLogger("batchclient.cache")

SCHEMA = Schema(
    "result_cache",
    (
        Migration(
            1,
            """
CREATE TABLE IF NOT EXISTS result_cache(
    key TEXT PRIMARY KEY, endpoint TEXT NOT NULL, model TEXT NOT NULL,
    status_code INTEGER NOT NULL, body BLOB NOT NULL, created_at REAL NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0, hit_at REAL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS result_cache_model ON result_cache(model, created_at);
CREATE INDEX IF NOT EXISTS result_cache_created ON result_cache(created_at)
""",
        ),
    ),
)
_FLUSH_EVERY = 32
_FLUSH_AFTER_S = 0.25


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """A cached successful answer: its HTTP-like status and response body."""

    status_code: int
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelCacheStats:
    """Entries, stored body bytes and hits of one model."""

    model: str
    entries: int
    bytes: int
    hits: int


@dataclass(frozen=True, slots=True)
class CacheStats:
    """The whole cache: ``entries``, ``bytes`` of stored bodies, ``hits`` (answers served from
    it), the oldest and newest entry (unix seconds, None when empty) and the same per model."""

    entries: int
    bytes: int
    hits: int
    oldest: float | None
    newest: float | None
    models: list[ModelCacheStats] = field(default_factory=list)


class ResultCache:
    """The cache table of one SQLite database (``<state_dir>/batchclient.sqlite3``), opened on
    its own connection. Thread-safe; every method is blocking but short (see the module's
    docstring). Use :meth:`close` when done (it writes what is queued)."""

    def __init__(self, db_path: Path) -> None:
        self.path = db_path
        self._state = Database(db_path, [SCHEMA])
        self._lock = self._state.lock
        self._db = self._state.conn
        self._puts: dict[str, tuple[str, str, int, bytes, float]] = {}
        self._hits: dict[str, int] = {}
        self._flushed = time.monotonic()

    # ------------------------------------------------------------------ requests

    def get(self, key: str, *, count_hit: bool = True) -> CachedAnswer | None:
        """The cached answer under ``key``, or None. A failed read is a miss."""
        with self._lock:
            queued = self._puts.get(key)
            if queued is not None:
                row: tuple[int, bytes] | None = (queued[2], queued[3])
            else:
                try:
                    row = self._db.execute(
                        "SELECT status_code, body FROM result_cache WHERE key = ?", (key,)
                    ).fetchone()
                except DB_ERRORS as exc:
                    log.warning("result cache read failed (%s); treated as a miss", exc)
                    return None
            if row is None:
                return None
            if count_hit:
                self._hits[key] = self._hits.get(key, 0) + 1
                self._maybe_flush()
        return CachedAnswer(status_code=int(row[0]), body=orjson.loads(row[1]))

    def contains(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` are cached (no hit is counted)."""
        with self._lock:
            found = {k for k in keys if k in self._puts}
            for chunk in _chunks(keys):
                marks = ", ".join("?" for _ in chunk)
                rows = self._db.execute(
                    f"SELECT key FROM result_cache WHERE key IN ({marks})", chunk
                ).fetchall()
                found.update(str(r[0]) for r in rows)
        return found

    def get_many(self, keys: Sequence[str], *, count_hit: bool = True) -> dict[str, CachedAnswer]:
        """The cached answers of those ``keys`` that have one (a failed read: none)."""
        found: dict[str, tuple[int, bytes]] = {}
        with self._lock:
            for key in keys:
                if (queued := self._puts.get(key)) is not None:
                    found[key] = (queued[2], queued[3])
            try:
                for chunk in _chunks([k for k in keys if k not in found]):
                    marks = ", ".join("?" for _ in chunk)
                    rows = self._db.execute(
                        f"SELECT key, status_code, body FROM result_cache WHERE key IN ({marks})",
                        chunk,
                    ).fetchall()
                    found.update((str(r[0]), (int(r[1]), r[2])) for r in rows)
            except DB_ERRORS as exc:
                log.warning("result cache read failed (%s); treated as misses", exc)
                return {}
            if count_hit and found:
                for key in found:
                    self._hits[key] = self._hits.get(key, 0) + 1
                self._maybe_flush()
        return {k: CachedAnswer(status_code=s, body=orjson.loads(b)) for k, (s, b) in found.items()}

    def put(
        self, key: str, *, endpoint: str, model: str, status_code: int, body: dict[str, Any]
    ) -> None:
        """Queue a successful answer under ``key`` (replacing an older one)."""
        data = orjson.dumps(body)
        with self._lock:
            self._puts[key] = (endpoint, model, status_code, data, time.time())
            self._maybe_flush()

    def _maybe_flush(self) -> None:
        pending = len(self._puts) + len(self._hits)
        if pending >= _FLUSH_EVERY or time.monotonic() - self._flushed >= _FLUSH_AFTER_S:
            self._flush()

    def _flush(self) -> None:
        """Write what is queued in one transaction (the lock is held)."""
        self._flushed = time.monotonic()
        puts, hits = self._puts, self._hits
        if not puts and not hits:
            return
        self._puts, self._hits = {}, {}
        now = time.time()
        try:
            with self._state.transaction() as db:
                db.executemany(
                    "INSERT INTO result_cache(key, endpoint, model, status_code, body, "
                    "created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                    "endpoint = excluded.endpoint, model = excluded.model, "
                    "status_code = excluded.status_code, body = excluded.body, "
                    "created_at = excluded.created_at",
                    [(k, *v) for k, v in puts.items()],
                )
                db.executemany(
                    "UPDATE result_cache SET hits = hits + ?, hit_at = ? WHERE key = ?",
                    [(n, now, k) for k, n in hits.items()],
                )
        except DB_ERRORS as exc:
            log.warning(
                "result cache: %d new entries and %d hit counts not written to %s: %s",
                len(puts),
                len(hits),
                self.path,
                exc,
            )

    def flush(self) -> None:
        """Write every queued entry and hit count now."""
        with self._lock:
            self._flush()

    def close(self) -> None:
        """Write what is queued and close the connection."""
        with self._lock:
            self._flush()
            self._state.close()

    # ------------------------------------------------------------------ maintenance

    def stats(self) -> CacheStats:
        """Entries, stored bytes and hits, overall and per model."""
        self.flush()
        with self._lock:
            total = self._db.execute(
                "SELECT count(*), coalesce(sum(length(body)), 0), coalesce(sum(hits), 0), "
                "min(created_at), max(created_at) FROM result_cache"
            ).fetchone()
            per_model = self._db.execute(
                "SELECT model, count(*), coalesce(sum(length(body)), 0), coalesce(sum(hits), 0) "
                "FROM result_cache GROUP BY model ORDER BY count(*) DESC, model"
            ).fetchall()
        return CacheStats(
            entries=int(total[0]),
            bytes=int(total[1]),
            hits=int(total[2]),
            oldest=total[3],
            newest=total[4],
            models=[ModelCacheStats(str(m), int(n), int(b), int(h)) for m, n, b, h in per_model],
        )

    def clear(self, *, older_than_s: float | None = None, model: str | None = None) -> int:
        """Delete entries (all of them, those stored more than ``older_than_s`` seconds ago,
        those of ``model``, or both conditions at once); return how many were deleted."""
        self.flush()
        sql, args = "DELETE FROM result_cache", list[Any]()
        conditions = []
        if older_than_s is not None:
            conditions.append("created_at < ?")
            args.append(time.time() - older_than_s)
        if model is not None:
            conditions.append("model = ?")
            args.append(model)
        if conditions:
            sql += " WHERE " + " AND ".join(conditions)
        with self._lock:
            return int(self._db.execute(sql, args).rowcount)


def _chunks(keys: list[str], size: int = 500) -> list[list[str]]:
    """``keys`` in groups small enough for one ``IN (...)`` (SQLite's variable limit)."""
    return [keys[i : i + size] for i in range(0, len(keys), size)]
