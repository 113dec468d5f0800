"""``Idempotency-Key`` for ``POST /v1/batches``: the same key with the same body returns the
batch the first request created, also after a restart; the same key with another body is
refused (HTTP 422, as the IETF draft "The Idempotency-Key HTTP Header Field",
draft-ietf-httpapi-idempotency-key-header, says). Keys are kept 24 hours (as Stripe's, whose
header OpenAI's SDKs copy).

One small SQLite database per tenant, ``server.sqlite3`` in its state directory, created on the
first key (opened and migrated by :mod:`batchclient._state`, schema ``idempotency``). The key is
stored as its SHA-256 (it is the client's, and may be anything up to 255 characters); the body
as the SHA-256 of the canonical JSON of the validated request, defaults filled in (the same
request with and without ``"completion_window": "24h"`` is the same request).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from .._state import Database, Migration, Schema, exists

TTL_S = 24 * 3600.0
MAX_KEY_LENGTH = 255
DB_NAME = "server.sqlite3"
SCHEMA = Schema(
    "idempotency",
    (
        Migration(
            1,
            "CREATE TABLE IF NOT EXISTS idempotency(key TEXT PRIMARY KEY, "
            "body TEXT NOT NULL, batch_id TEXT NOT NULL, created_at REAL NOT NULL)",
        ),
    ),
)


class KeyReused(Exception):
    """The key was used with another body."""


def body_digest(body: dict[str, Any]) -> str:
    """SHA-256 of the body's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class IdempotencyKeys:
    """The keys of one tenant. Blocking and thread-safe (call through ``anyio.to_thread``)."""

    def __init__(self, state_dir: Path) -> None:
        self._path = state_dir / DB_NAME
        self._lock = threading.Lock()
        self._db: Database | None = None

    def _conn(self) -> Database:
        if self._db is None:
            self._db = Database(self._path, [SCHEMA])
        return self._db

    def lookup(self, key: str, body: str) -> str | None:
        """The batch created with ``key`` in the last 24 h, or None. Raises :class:`KeyReused`
        when that request had another body."""
        with self._lock:
            if self._db is None and not exists(self._path):
                return None
            row = self._conn().one(
                "SELECT body, batch_id FROM idempotency WHERE key = ? AND created_at > ?",
                (_hash(key), time.time() - TTL_S),
            )
        if row is None:
            return None
        if row[0] != body:
            raise KeyReused(key)
        return str(row[1])

    def record(self, key: str, body: str, batch_id: str) -> None:
        with self._lock:
            self._conn().write(
                "INSERT INTO idempotency (key, body, batch_id, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET body = excluded.body, "
                "batch_id = excluded.batch_id, created_at = excluded.created_at",
                (_hash(key), body, batch_id, time.time()),
            )

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
