"""The state on a real PostgreSQL server (``database=``): the same stores as on SQLite, shared by
clients and servers with different state directories: files (their bytes included), batches,
results, idempotency keys, the webhook outbox and the result cache; migrations run once;
a commit for a lease taken over is refused."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from batchclient import BatchClient
from batchclient._state import DATABASE_ENV, Database, bind
from batchclient.jobs._store import LeaseLostError, ResultRow, Store
from batchclient.server._webhooks import Outbox
from batchclient.testing import StubServer
from jobs_util import FAST, jsonl, line
from server_util import KEY_A, KEY_B, batch_file, sdk, served, wait_batch

# a PostgreSQL server per pytest process (about 3 s); a stub slow enough to kill a run mid-file
pytestmark = [pytest.mark.slow, pytest.mark.stub(latency_s=0.05)]


async def test_a_batch_made_in_one_state_dir_is_read_whole_from_another(
    stub: StubServer, tmp_path: Path, pg_url: str
) -> None:
    """Upload and run through a client on one state directory; a client on another (no file
    of the first) reads the input file's bytes, the batch and its output from the database."""
    lines = [line(f"r{i}", f"hello {i}") for i in range(20)]
    async with BatchClient(_remote(stub), state_dir=tmp_path / "a", database=pg_url) as first:
        upload = await first.files.create(jsonl(lines))
        job = await first.schedule_batch(upload.id)
        with anyio.fail_after(60):
            done = await first.batches.wait(job.job_id)
        assert done.output_file_id is not None
        output = await first.files.content(done.output_file_id)
    assert done.status == "completed" and done.request_counts.completed == 20
    assert not (tmp_path / "a" / "batchclient.sqlite3").exists()  # nothing went to SQLite

    async with BatchClient(_remote(stub), state_dir=tmp_path / "b", database=pg_url) as second:
        assert await second.files.content(upload.id) == jsonl(lines)
        again = await second.batches.retrieve(job.job_id)
        assert again.status == "completed" and again.request_counts == done.request_counts
        assert await second.files.content(done.output_file_id) == output
        result = await second.job_result(job.job_id)
    answers = [json.loads(x)["custom_id"] for x in output.decode().splitlines()]
    assert answers == [f"r{i}" for i in range(20)]
    assert len(result.batch) == 20 and not result.errors


def _remote(stub: StubServer) -> Any:
    from batchclient.remote import RemoteProvider

    return RemoteProvider(stub.url, **FAST)


def test_migrations_run_once_whoever_starts_first(tmp_path: Path, pg_url: str) -> None:
    """Eight stores opened at once on an empty database: every one opens, the tables are made
    once and the version is recorded once."""
    errors: list[BaseException] = []
    stores: list[Store] = []

    def open_one(i: int) -> None:
        folder = tmp_path / f"s{i}"
        bind(folder, pg_url)
        try:
            stores.append(Store(folder))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(stores) == 8
    rows = stores[0].db.all("SELECT name, version FROM schema_versions ORDER BY name")
    assert [(r["name"], r["version"]) for r in rows] == [("file_bytes", 1), ("jobs", 9)]
    for store in stores:
        store.close()


def test_a_commit_for_a_lease_taken_over_is_refused_and_writes_nothing(
    tmp_path: Path, pg_url: str
) -> None:
    bind(tmp_path, pg_url)
    store = Store(tmp_path)
    try:
        (tmp_path / "files").mkdir(exist_ok=True)
        (tmp_path / "files" / "file-x").write_bytes(b"{}\n")
        from batchclient.types import FileObject

        store.add_file(FileObject(id="file-x", bytes=3, created_at=0, filename="x",
                                  purpose="batch"), "0" * 64)  # fmt: skip
        store.insert_job({"id": "batch_1", "input_file_id": "file-x", "endpoint": "/v1/x",
                          "completion_window": "24h", "status": "in_progress", "created_at": 0,
                          "total": 2, "identity": "{}", "owner": "b"})  # fmt: skip
        row = ResultRow(seq=0, custom_id="r0", ok=True, status_code=200, body={}, error=None,
                        line='{"custom_id": "r0"}')  # fmt: skip
        store.owner = "a"  # the lease was taken over by b
        with pytest.raises(LeaseLostError):
            store.commit_results("batch_1", [row])
        assert store.result_row("batch_1", 0) is None
        assert store.job_row("batch_1").completed == 0
        store.owner = "b"
        store.commit_results("batch_1", [row])
        store.commit_results("batch_1", [row])  # published once: a second commit adds nothing
        assert store.job_row("batch_1").completed == 1
    finally:
        store.close()


def test_servers_on_one_database_are_one_service(
    stub: StubServer, tmp_path: Path, pg_url: str
) -> None:
    """Two servers with their own state directories: a file uploaded to one is read through
    the other, a batch created on one is seen, awaited and read on the other, an idempotency
    key used on one answers the same batch on the other, and tenants stay apart."""
    keys = [KEY_A, KEY_B]
    with (
        served(stub.url, tmp_path / "one", api_keys=keys, database=pg_url) as one,
        served(stub.url, tmp_path / "two", api_keys=keys, database=pg_url) as two,
    ):
        a1, a2 = sdk(one), sdk(two)
        upload = a1.files.create(file=("in.jsonl", batch_file(30)), purpose="batch")
        assert a2.files.content(upload.id).content == batch_file(30)
        headers = {"Idempotency-Key": "k-123"}
        batch = a2.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions",
            completion_window="24h", extra_headers=headers,
        )  # fmt: skip
        same = a1.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions",
            completion_window="24h", extra_headers=headers,
        )  # fmt: skip
        assert same.id == batch.id
        done = wait_batch(a1, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 30
        ids = [
            json.loads(x)["custom_id"]
            for x in a1.files.content(done.output_file_id).text.splitlines()
        ]
        assert sorted(ids) == sorted(f"r{i}" for i in range(30))
        other = sdk(two, KEY_B)  # another tenant: another schema
        assert [b.id for b in other.batches.list()] == []
        with pytest.raises(Exception) as refused:
            other.files.content(upload.id)
        assert getattr(refused.value, "status_code", None) == 404
        for url in (one, two):
            ready = httpx.get(f"{url}/ready")
            assert ready.status_code == 200 and ready.json() == {"status": "ready"}


def test_the_outbox_gets_terminal_batches_and_gives_each_event_to_one_sender(
    tmp_path: Path, pg_url: str
) -> None:
    bind(tmp_path / "one", pg_url)
    bind(tmp_path / "two", pg_url)
    first, second = Outbox(tmp_path / "one"), Outbox(tmp_path / "two")
    try:
        store = first.store
        (tmp_path / "one" / "files" / "file-x").write_bytes(b"{}\n")
        from batchclient.types import FileObject

        store.add_file(FileObject(id="file-x", bytes=3, created_at=0, filename="x",
                                  purpose="batch"), "0" * 64)  # fmt: skip
        store.insert_job({"id": "batch_1", "input_file_id": "file-x", "endpoint": "/v1/x",
                          "completion_window": "24h", "status": "in_progress", "created_at": 0,
                          "total": 1, "identity": "{}"})  # fmt: skip
        assert first.due(time.time() + 1) == []
        store.update_job("batch_1", status="completed")
        store.update_job("batch_1", status="completed")  # no second event for the same state
        now = time.time() + 1
        claimed = first.due(now)
        assert [(e.batch_id, e.type) for e in claimed] == [("batch_1", "batch.completed")]
        assert claimed[0].id.startswith("evt_") and len(claimed[0].id) == 36
        assert second.due(now) == []  # claimed by the first sender
        assert [e.id for e in second.due(now + 3600)] == [claimed[0].id]  # its sender died
    finally:
        first.close()
        second.close()


def test_a_broken_connection_is_made_again(tmp_path: Path, pg_url: str) -> None:
    """The server closing the connection (a restart, a failover) fails the statement that finds
    it closed; the next one connects again."""
    bind(tmp_path, pg_url)
    db = Database(tmp_path / "x.sqlite3")
    try:
        pid = db.one("SELECT pg_backend_pid()")[0]
        import psycopg

        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            db.ping()
        db.ping()
        assert db.one("SELECT pg_backend_pid()")[0] != pid
    finally:
        db.close()


def test_the_commands_take_database_and_see_each_others_jobs(
    stub: StubServer, tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``batchclient run --database URL`` on one state directory; ``batchclient jobs list`` and
    ``jobs result`` with the same URL on another find the job and its answers."""
    from batchclient.cli import main

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(jsonl([line(f"q{i}", f"question {i}") for i in range(5)]))
    try:
        code = main(["run", str(inp), "-o", str(out), "--base-url", stub.url, "--no-progress",
                     "--state-dir", str(tmp_path / "a"), "--database", pg_url])  # fmt: skip
        assert code == 0
        capsys.readouterr()
        other = ["--state-dir", str(tmp_path / "b"), "--database", pg_url]
        assert main(["jobs", "list", *other]) == 0
        listed = capsys.readouterr().out
        (job_id,) = {w for w in listed.split() if w.startswith("batch_")}
        again = tmp_path / "again.jsonl"
        assert main(["jobs", "result", job_id, "-o", str(again), *other]) == 0
    finally:
        os.environ.pop(DATABASE_ENV, None)  # the flag sets it for the command's process
    assert "completed" in listed
    answers = [json.loads(x)["custom_id"] for x in out.read_text().splitlines()]
    assert answers == [f"q{i}" for i in range(5)]
    assert again.read_text() == out.read_text()
    assert not (tmp_path / "b" / "batchclient.sqlite3").exists()


async def test_the_result_cache_is_shared_through_the_database(
    stub: StubServer, tmp_path: Path, pg_url: str
) -> None:
    """Answers cached by a client on one machine's state directory answer a client on
    another: nothing is sent again."""
    from batchclient import SamplingParams

    messages = [[{"role": "user", "content": f"cache me {i}"}] for i in range(6)]
    greedy = SamplingParams(max_tokens=8)
    async with BatchClient(
        _remote(stub), state_dir=tmp_path / "a", database=pg_url, cache=True
    ) as first:
        answered = await first.batch_chat_completion("smollm2", messages, greedy)
    sent = stub.stats.requests
    async with BatchClient(
        _remote(stub), state_dir=tmp_path / "b", database=pg_url, cache=True
    ) as second:
        again = await second.batch_chat_completion("smollm2", messages, greedy)
    assert stub.stats.requests == sent  # every answer came from the shared cache
    texts = [[r.completion_message and r.completion_message.content for r in x.batch]
             for x in (answered, again)]  # fmt: skip
    assert texts[0] == texts[1] and all(texts[0])


def test_a_run_killed_on_one_machine_is_finished_from_another(
    stub: StubServer, tmp_path: Path, pg_url: str
) -> None:
    """``batchclient run --database URL`` SIGKILLed mid-file; the same command from another
    state directory (another machine, as far as the files go) takes the job over and finishes
    it: every custom_id once, nothing finished sent again but what was in flight."""
    import signal
    import subprocess
    import sys

    from batchclient.cli import main
    from jobs_util import wait_sync

    n, window = 300, 8
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line(f"q{i}", f"question {i}") for i in range(n)]))
    before = stub.stats.requests
    args = ["run", str(inp), "--base-url", stub.url, "--no-progress", "--database", pg_url,
            "--max-concurrency", str(window)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    first = subprocess.Popen(
        [sys.executable, "-m", "batchclient.cli", *args, "-o", str(tmp_path / "a.jsonl"),
         "--state-dir", str(tmp_path / "a")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_sync(lambda: stub.stats.requests - before >= 100, timeout=60, every=0.01)
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    sent_by_first = stub.stats.requests - before
    out = tmp_path / "b.jsonl"
    try:
        code = main([*args, "-o", str(out), "--state-dir", str(tmp_path / "b")])
    finally:
        os.environ.pop(DATABASE_ENV, None)
    assert code == 0
    ids = [json.loads(x)["custom_id"] for x in out.read_text().splitlines()]
    assert ids == [f"q{i}" for i in range(n)]
    assert 100 <= sent_by_first < n
    assert stub.stats.requests - before <= n + window  # only what was in flight, again


def test_leases_are_timed_on_the_databases_clock(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host whose clock is an hour ahead still writes heartbeats the others read as fresh:
    lease times come from the database server's clock (its offset measured per connection)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600.0)  # the clock _state reads too
    bind(tmp_path, pg_url)
    db = Database(tmp_path / "x.sqlite3")
    try:
        server = float(db.one("SELECT extract(epoch FROM clock_timestamp())")[0])
        assert abs(time.time() - server - 3600.0) < 1.0  # this host's clock is off
        assert abs(db.now() - server) < 1.0  # the lease clock is not
    finally:
        db.close()
