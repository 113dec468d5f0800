"""Every statement the server runs reads through an index (SQLite's own query plans).

A server is driven through the usual life of two tenants' batches (uploads, a batch with
thousands of duplicate lines, a cancelled one, listings, downloads, a webhook, an idempotent
retry), every statement each state database runs is recorded (``sqlite3`` trace callback), and
``EXPLAIN QUERY PLAN`` of each must not read a whole table, nor a whole batch's lines where it
asked for a range of them: at a million lines, that is what stalls the server.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchclient import _state
from batchclient.testing import StubReply, StubServer
from jobs_util import jsonl, line
from server_util import KEY_A, KEY_B, sdk, served, wait_batch

PER_BATCH = ("results", "job_lines")
"""Tables with one row per line of a batch: a search by ``job_id`` alone reads them all."""

WHOLE_BATCH = (
    # meant to touch every row of one batch, once per batch (its deletion, seeding a batch
    # with an earlier one's results, the final counts)
    re.compile(r"^DELETE FROM (results|job_lines) WHERE job_id = "),
    re.compile(r"^INSERT OR IGNORE INTO results \(.*\) SELECT .* FROM results WHERE job_id = "),
    re.compile(r"^UPDATE jobs SET completed = \(SELECT count\(\*\) FROM results"),
    # the counts of /metrics: one row per batch, once per scrape
    re.compile(r"^SELECT status, COUNT\(\*\), SUM\(completed\).* FROM jobs GROUP BY status$"),
)


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, set[Path]]]:
    """``{statement as run, with its values: {database files it ran on}}``."""
    seen: dict[str, set[Path]] = {}
    lock = threading.Lock()
    original = _state.Database.__init__

    def traced(self: _state.Database, path: Path, *args: Any, **kwargs: Any) -> None:
        original(self, path, *args, **kwargs)

        def record(sql: str) -> None:
            with lock:
                seen.setdefault(sql, set()).add(Path(path))

        self.conn.set_trace_callback(record)

    monkeypatch.setattr(_state.Database, "__init__", traced)
    yield seen


def _plan(path: Path, sql: str) -> list[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [str(row[3]) for row in db.execute(f"EXPLAIN QUERY PLAN {sql}")]
    finally:
        db.close()


def _reads_too_much(sql: str, plan: list[str]) -> list[str]:
    if any(p.search(sql) for p in WHOLE_BATCH):
        return []
    bad = []
    for step in plan:
        # a listing reads an index in its order and stops at its page's end
        scan = re.match(r"SCAN (\w+)( USING (COVERING )?INDEX)?", step)
        if scan and scan.group(1) != "CONSTANT" and not scan.group(2):
            bad.append(step)
        elif re.match(rf"SEARCH ({'|'.join(PER_BATCH)}|l|r|x)\b.*\(job_id=\?\)$", step):
            bad.append(step)  # a whole batch's rows, where a few were asked for
    return bad


def _drive(url: str) -> None:
    a, b = sdk(url, KEY_A), sdk(url, KEY_B)
    lines = [line(f"same{i}", "one question", temperature=0) for i in range(300)]
    lines += [line(f"r{i}", f"question {i % 40}", temperature=0) for i in range(200)]
    big = a.files.create(file=("big.jsonl", jsonl(lines)), purpose="batch")
    batch = a.batches.create(
        input_file_id=big.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers={"Idempotency-Key": "plans-1"},
    )
    again = a.batches.create(
        input_file_id=big.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers={"Idempotency-Key": "plans-1"},
    )
    assert again.id == batch.id
    done = wait_batch(a, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 500
    assert done.output_file_id is not None
    assert a.files.content(done.output_file_id).read().count(b"\n") == 500
    slow = b.files.create(file=("slow.jsonl", jsonl([line("s", "slow")])), purpose="batch")
    waiting = b.batches.create(
        input_file_id=slow.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    b.batches.cancel(waiting.id)
    assert wait_batch(b, waiting.id).status == "cancelled"
    assert [x.id for x in a.batches.list(limit=5)] == [batch.id]
    a.files.list()
    a.files.retrieve(big.id)
    a.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}])
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY_A}"}) as h:
        h.get("/metrics").raise_for_status()


def test_every_statement_reads_through_an_index(
    tmp_path: Path, statements: dict[str, set[Path]]
) -> None:
    def slow(body: dict[str, Any], attempt: int) -> StubReply | None:
        return StubReply(delay_s=5) if body["messages"][0]["content"] == "slow" else None

    with StubServer(handler=slow) as stub:
        with served(stub.url, tmp_path / "state", api_keys=[KEY_A, KEY_B]) as url:
            _drive(url)
    checked = 0
    problems = {}
    for sql, paths in statements.items():
        if not re.match(r"\s*(SELECT|UPDATE|DELETE|INSERT|WITH)\b", sql, re.IGNORECASE):
            continue
        if re.match(r"\s*INSERT\b", sql, re.IGNORECASE) and " SELECT " not in sql.upper():
            continue  # INSERT ... VALUES reads nothing
        for path in paths:
            if not path.exists():
                continue
            checked += 1
            bad = _reads_too_much(sql, _plan(path, sql))
            if bad:
                problems[sql[:300]] = bad
    assert checked > 20, statements.keys()  # the workload ran its statements through here
    assert not problems, "\n".join(f"{sql}\n    {bad}" for sql, bad in problems.items())
