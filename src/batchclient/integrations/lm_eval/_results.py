"""The lm-eval model's durable results: one SQLite row per answered request.

A request's key is the SHA-256 of what decides its answer: the kind of request
(``loglikelihood``, ``loglikelihood_rolling``, ``generate_until``), the provider's identity
(``Provider.identity()``: remote base URL, inline model), the model name, the tokenizer the
scores were cut with, and the request's own arguments. A re-run of the same eval finds every
answer here and sends nothing; an interrupted one sends only what is missing. Rows are
committed in small groups as answers arrive (at most :data:`COMMIT_EVERY` answers or
:data:`COMMIT_S` seconds are lost by a crash). The file is private to its owner: the folder
``0700``, the database ``0600``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

DB_NAME = "lm_eval.sqlite3"
COMMIT_EVERY = 64
"""Answers buffered before a commit."""
COMMIT_S = 1.0
"""Seconds after which buffered answers are committed anyway (at the next answer)."""


def request_key(scope: Any, kind: str, args: Any) -> str:
    """The key of one request: ``scope`` (provider identity, model, tokenizer) + kind + args,
    as canonical JSON, hashed."""
    text = json.dumps([scope, kind, args], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class ResultStore:
    """Answers by key in ``<state_dir>/lm_eval.sqlite3``. Thread-safe (one connection behind a
    lock): looked up from lm-eval's thread, written from the client's event loop."""

    def __init__(self, state_dir: Path) -> None:
        if not state_dir.exists():
            state_dir.mkdir(parents=True, mode=0o700)
        path = state_dir / DB_NAME
        fresh = not path.exists()
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=30)
        if fresh:
            with contextlib.suppress(OSError):
                os.chmod(path, 0o600)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
        )
        self._db.commit()
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str]] = []
        self._last_commit = time.monotonic()

    def get_many(self, keys: Sequence[str]) -> dict[str, Any]:
        """The stored answers of those keys that have one."""
        found: dict[str, Any] = {}
        with self._lock:
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT key, value FROM answers WHERE key IN ({marks})", chunk
                ).fetchall()
                found.update((k, json.loads(v)) for k, v in rows)
        return found

    def put(self, key: str, value: Any) -> None:
        """Buffer one answer; commit the buffer when it is full or old enough."""
        with self._lock:
            self._pending.append((key, json.dumps(value)))
            due = time.monotonic() - self._last_commit >= COMMIT_S
            if len(self._pending) >= COMMIT_EVERY or due:
                self._commit()

    def put_many(self, items: Iterable[tuple[str, Any]]) -> None:
        with self._lock:
            self._pending.extend((k, json.dumps(v)) for k, v in items)
            self._commit()

    def flush(self) -> None:
        """Commit every buffered answer."""
        with self._lock:
            self._commit()

    def _commit(self) -> None:
        if self._pending:
            self._db.executemany(
                "INSERT OR REPLACE INTO answers (key, value) VALUES (?, ?)", self._pending
            )
            self._db.commit()
            self._pending.clear()
        self._last_commit = time.monotonic()

    def close(self) -> None:
        with self._lock:
            self._commit()
            self._db.close()
