"""Helpers shared by the job tests: request lines as the cases write them, and polling."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from batchclient.remote import RetryPolicy
from batchclient.testing import StubServer

FAST: dict[str, Any] = {"retry": RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)}


def line(cid: str, text: str, **body: Any) -> str:
    """Case notation ``line(cid, text, **body)``: one request line for model ``smollm2``."""
    return json.dumps(
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": body.pop("model", "smollm2"),
                "messages": [{"role": "user", "content": text}],
                "max_tokens": body.pop("max_tokens", 16),
                **body,
            },
        }
    )


def jsonl(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Parse a JSONL file, ignoring at most one torn last line."""
    text = path.read_text() if path.exists() else ""
    rows = []
    for i, raw in enumerate(text.splitlines()):
        try:
            rows.append(json.loads(raw))
        except ValueError:
            assert i == len(text.splitlines()) - 1, f"torn line {i} that is not the last"
    return rows


async def until(check: Callable[[], Any], *, within: float = 30.0, every: float = 0.05) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; return that."""
    with anyio.fail_after(within):
        while True:
            value = check()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await anyio.sleep(every)


def wait_sync(check: Callable[[], Any], *, timeout: float = 60.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"condition not met within {timeout} s")


def done_in_db(state: Path) -> int:
    """Finished results committed so far (read straight from the SQLite file)."""
    db = state / "batchclient.sqlite3"
    if not db.exists():
        return 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        try:
            row = conn.execute("SELECT coalesce(sum(completed + failed), 0) FROM jobs").fetchone()
        except sqlite3.OperationalError:
            return 0
    return int(row[0])


@asynccontextmanager
async def output_folder_blocked(stub: StubServer, files: Path) -> AsyncIterator[None]:
    """While inside, a file stands where the folder of output files (``files``) should be: put
    there once ``stub`` got the batch's first request (its input file is open by then), the
    folder put back on leaving."""
    with anyio.fail_after(30):
        while stub.stats.requests == 0:
            await anyio.sleep(0.01)
    moved = files.with_name(files.name + ".moved")
    _swap(files, moved, "a file where the folder of output files should be")
    try:
        yield
    finally:
        _swap(moved, files, None)


def _swap(folder: Path, to: Path, blocker: str | None) -> None:
    """Move ``folder`` to ``to``; leave a file saying ``blocker`` in its place, or (None) take
    the file at ``to`` away first."""
    if blocker is None:
        to.unlink()
    folder.rename(to)
    if blocker is not None:
        folder.write_text(blocker)
