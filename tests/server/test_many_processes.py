"""Three ``batchclient serve --database postgresql://...`` processes, each with its own state
directory, as one service over one real PostgreSQL and one loopback upstream: processes are
SIGKILLed (or frozen) in turn during batches and the batch still ends with every custom_id
exactly once and its own answer; a cancel through any process stops the upstream's traffic;
a process whose lease was taken over publishes nothing more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from batchclient.testing import StubServer, free_port
from jobs_util import jsonl, line, wait_sync
from server_util import WINDOW, batch_file, finished, ready, sdk, spawn, wait_batch

pytestmark = [pytest.mark.slow, pytest.mark.stub(latency_s=0.05)]  # 8 in flight: 160 req/s

LINES = 1500


class Fleet:
    """``serve`` processes over one database and upstream, each on its own port and state."""

    def __init__(self, stub: StubServer, root: Path, database: str, *extra: str) -> None:
        self.stub, self.root, self.extra = stub, root, ("--database", database, *extra)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.urls: dict[int, str] = {}

    def start(self, i: int, wait: bool = True) -> str:
        port = free_port()
        proc = spawn(self.stub.url, self.root / f"state{i}", port, *self.extra)
        self.procs[i], self.urls[i] = proc, f"http://127.0.0.1:{port}"
        if wait:
            ready(self.urls[i], proc)
        return self.urls[i]

    def kill(self, i: int) -> None:
        os.kill(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a frozen one too
                proc.kill()
                proc.wait()


@contextmanager
def fleet(stub: StubServer, root: Path, database: str, *extra: str) -> Iterator[Fleet]:
    servers = Fleet(stub, root, database, *extra)
    try:
        yield servers
    finally:
        servers.stop_all()


def _logs(root: Path) -> str:
    return "".join(p.read_text() for p in root.glob("serve-*.log"))


def _answers(client: object, batch: object) -> list[dict[str, Any]]:
    content = client.files.content(batch.output_file_id).text  # type: ignore[attr-defined]
    return [json.loads(x) for x in content.splitlines()]


def _own_answer(row: dict[str, Any]) -> bool:
    """Whether the stub's echo in ``row``'s answer is of its own request (``r <i>``)."""
    body = row["response"]["body"]  # type: ignore[index]
    text = body["choices"][0]["message"]["content"]  # type: ignore[index]
    return f"r {str(row['custom_id'])[1:]}" in text


def test_a_batch_outlives_two_of_three_servers_and_a_cancel_reaches_the_owner(
    stub: StubServer, tmp_path: Path, pg_url: str
) -> None:
    before = stub.stats.requests
    with fleet(stub, tmp_path, pg_url) as servers:
        one, _, three = (servers.start(i) for i in (1, 2, 3))
        c1 = sdk(one)
        upload = c1.files.create(file=("in.jsonl", batch_file(LINES)), purpose="batch")
        batch = c1.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait_sync(lambda: stub.stats.requests - before >= 200, timeout=60, every=0.01)
        servers.kill(1)
        time.sleep(3)
        servers.kill(2)
        c3 = sdk(three)
        done = wait_batch(c3, batch.id, within=180)
        sent = stub.stats.requests - before
        rows = _answers(c3, done)
        input_through_three = c3.files.content(upload.id).content

        # a second batch, created on 3, cancelled through 2 started again
        two = servers.start(2)
        before_second = stub.stats.requests
        upload2 = c3.files.create(file=("in.jsonl", batch_file(LINES, "s")), purpose="batch")
        second = c3.batches.create(
            input_file_id=upload2.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait_sync(lambda: stub.stats.requests > before_second, timeout=60, every=0.01)
        time.sleep(2)
        cancelled = sdk(two).batches.cancel(second.id)
        cancel_done = time.monotonic()
        final = wait_batch(sdk(two), second.id, within=60)
        at_cancel = stub.stats.requests
        time.sleep(5)
        after_cancel = stub.stats.requests - at_cancel
    print(
        f"first batch: upstream requests={sent} for {LINES} lines; second: cancelled after "
        f"{finished(final)} lines, {after_cancel} requests in the 5 s after it ended "
        f"({time.monotonic() - cancel_done:.1f} s after the cancel returned)"
    )
    assert done.status == "completed" and done.request_counts.completed == LINES
    ids = Counter(str(r["custom_id"]) for r in rows)
    assert set(ids) == {f"r{i}" for i in range(LINES)} and set(ids.values()) == {1}
    assert all(_own_answer(r) for r in rows)
    assert sent <= LINES + 64
    assert input_through_three == batch_file(LINES)
    assert cancelled.status in ("cancelling", "cancelled") and final.status == "cancelled"
    assert finished(final) == LINES  # every line has its result or batch_cancelled
    assert after_cancel == 0


def _on_two_servers(
    stub: StubServer, root: Path, database: str, data: bytes
) -> tuple[Any, list[dict[str, Any]], int]:
    """A batch of ``data`` created on the first of two servers and read through the second
    once it ends: the batch, its output lines and the upstream requests it took (the stub's
    ``max_in_flight`` counts from the start)."""
    with fleet(stub, root, database) as servers:
        one, two = servers.start(1), servers.start(2)
        before = stub.stats.requests
        stub.stats.max_in_flight = 0
        c1 = sdk(one)
        upload = c1.files.create(file=("in.jsonl", data), purpose="batch")
        batch = c1.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_batch(sdk(two), batch.id, within=120)
        return done, _answers(sdk(two), done), stub.stats.requests - before


def test_one_batch_runs_on_every_server_each_line_once(
    stub: StubServer, tmp_path: Path, pg_url: str
) -> None:
    """A batch created on one of two servers is run by both (blocks of lines under leases):
    more requests at once than one server sends, and each line sent exactly once."""
    done, rows, sent = _on_two_servers(stub, tmp_path, pg_url, batch_file(LINES))
    peak = stub.stats.max_in_flight
    print(
        f"{LINES} lines on two servers of {WINDOW} in flight each: {sent} requests, {peak} at once"
    )
    assert done.status == "completed" and done.request_counts.completed == LINES
    ids = Counter(str(r["custom_id"]) for r in rows)
    assert set(ids) == {f"r{i}" for i in range(LINES)} and set(ids.values()) == {1}
    assert sent == LINES  # nobody died: no line twice
    assert WINDOW < peak <= 2 * WINDOW  # both servers sent at once


def test_identical_lines_on_two_servers_are_sent_once_and_answer_each_custom_id(
    stub: StubServer, tmp_path: Path, pg_url: str
) -> None:
    """Identical greedy lines are merged into the first (one or two copies each, and one line
    with 200 copies, whose answers go in chunks) on a batch two servers run: each distinct
    request is sent once and every custom_id gets its line's answer."""
    texts = [f"t {i % 1000}" for i in range(1300)] + ["many"] * 200
    lines = [line(f"c{i}", text, temperature=0) for i, text in enumerate(texts)]
    done, rows, sent = _on_two_servers(stub, tmp_path, pg_url, jsonl(lines))
    assert done.status == "completed" and done.request_counts.completed == len(lines)
    assert sent == 1001  # 1,000 texts and "many", each once
    assert stub.stats.max_in_flight > WINDOW  # both servers sent
    answers = {str(r["custom_id"]): r["response"]["body"]["choices"][0]["message"]["content"]
               for r in rows}  # fmt: skip
    assert len(rows) == len(answers) == len(lines)
    assert all(texts[int(cid[1:])] in text for cid, text in answers.items())


def test_a_frozen_server_loses_its_lease_and_publishes_nothing_after(
    stub: StubServer, tmp_path: Path, pg_url: str
) -> None:
    """SIGSTOP the process running a batch: its heartbeat stops, another takes the batch over
    after the lease (2 s here); woken with SIGCONT, the first finds its commits refused and
    stops. Every custom_id once, and the counts equal the rows."""
    times = "lease_s=2,heartbeat_s=0.2,orphan_scan_s=0.3"
    os.environ["BATCHCLIENT_LEASE_TIMES"] = times  # read by the servers spawned below
    try:
        with fleet(stub, tmp_path, pg_url) as servers:
            one, two = servers.start(1), servers.start(2)
            c1 = sdk(one)
            upload = c1.files.create(file=("in.jsonl", batch_file(600)), purpose="batch")
            batch = c1.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            wait_sync(lambda: finished(c1.batches.retrieve(batch.id)) >= 100, timeout=60)
            os.kill(servers.procs[1].pid, signal.SIGSTOP)
            wait_sync(lambda: "taking up batch" in _logs(tmp_path), timeout=30)  # by the second
            os.kill(servers.procs[1].pid, signal.SIGCONT)
            done = wait_batch(sdk(two), batch.id, within=120)
            rows = _answers(sdk(two), done)
            wait_sync(lambda: "another process took it over" in _logs(tmp_path), timeout=30)
    finally:
        del os.environ["BATCHCLIENT_LEASE_TIMES"]
    log = _logs(tmp_path)
    assert done.status == "completed" and done.request_counts.completed == 600
    ids = Counter(str(r["custom_id"]) for r in rows)
    assert set(ids) == {f"r{i}" for i in range(600)} and set(ids.values()) == {1}
    notable = [x for x in log.splitlines() if " INFO " not in x]
    assert "another process took it over; stopped here" in log, notable
