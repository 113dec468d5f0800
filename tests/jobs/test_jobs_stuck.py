"""Stuck is never silent, against a real ``batchclient serve`` on loopback and real SQLite files:
a full disk under the database fails the batch (logged, visible at once) and
``POST /v1/batches/{id}/resume`` finishes it once there is room (a tmpfs in a private mount
namespace); a server SIGKILLed and started again as PID 1 of a fresh PID namespace (as in a
container) takes its batch back within seconds, not by its pid; ``batchclient jobs resume``
reopens a batch that failed after validation and an open client takes it up; temporary files
left by SIGKILL during an upload are swept at the next start, live writers' are not."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from openai.types import Batch

from batchclient import ErrorCode, RemoteBatchInference
from batchclient.cli import main
from batchclient.errors import ConfigurationError
from batchclient.jobs import LeaseTimes
from batchclient.jobs._runner import WriteRetry
from batchclient.jobs._store import DB_NAME
from batchclient.server import tenant_id
from batchclient.testing import StubServer, free_port
from jobs_util import FAST, jsonl, line, output_folder_blocked, wait_sync
from server_util import KEY_A, WINDOW, batch_file, is_envelope, ready, sdk, spawn, wait_batch

PYTHONPATH = str(Path(__file__).parents[2] / "src")
LEASE_TIMES = "BATCHCLIENT_LEASE_TIMES"


@pytest.fixture(autouse=True)
def short_lease_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats every 0.1 s and orphan scans every 0.2 s, in this process and in the servers
    it starts (the lease stays 10 s): a test waits a scan, not seconds."""
    monkeypatch.setenv(LEASE_TIMES, "heartbeat_s=0.1,orphan_scan_s=0.2")


def _probe(*args: str) -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run([*args], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_mounts = pytest.mark.skipif(
    not _probe("unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=16k tmpfs /tmp"),
    reason="needs `unshare -rm` (user and mount namespaces) to mount a tmpfs",
)
needs_pid_namespaces = pytest.mark.skipif(
    not _probe("unshare", "-rpf", "--mount-proc", "sh", "-c", 'test "$$" = 1'),
    reason="needs `unshare -rpf --mount-proc` (user and PID namespaces) to run a server as PID 1",
)


def serve_args(stub_url: str, state: Path, port: int) -> list[str]:
    """``batchclient serve`` over ``stub_url`` with key :data:`KEY_A`."""
    return [sys.executable, "-m", "batchclient.cli", "serve", "--base-url", stub_url,
            "--port", str(port), "--state-dir", str(state), "--api-key", KEY_A,
            "--max-concurrency", str(WINDOW)]  # fmt: skip


def popen(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A child in a session of its own (so its whole group can be signalled), logging to
    ``log``."""
    out = log.open("ab")
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    return subprocess.Popen(args, env=env, stdout=out, stderr=out, start_new_session=True)


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    if sig == signal.SIGKILL:
        proc.wait(timeout=30)


@contextmanager
def group(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)  # a stopped group dies only once it runs
            kill_group(proc)


def job_row(db: Path, batch_id: str) -> dict[str, Any]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM jobs WHERE id = ?", (batch_id,)).fetchone()
    return dict(row)


def custom_ids(client: openai.OpenAI, batch: Any) -> list[str]:
    text = client.files.content(batch.output_file_id).text
    return [json.loads(x)["custom_id"] for x in text.splitlines()]


def sent_by_text(stub: StubServer) -> Counter[str]:
    return Counter(b["messages"][0]["content"] for b in stub.stats.bodies)


# ------------------------------------------------------------------ a full disk, then resume


@pytest.mark.slow
@needs_mounts
def test_a_full_disk_under_the_database_fails_the_batch_and_resume_finishes_it(
    tmp_path: Path,
) -> None:
    """The tenant's state directory is a 640 KiB tmpfs: the database fills up midway. The
    batch is ``failed`` with ``storage_error`` at once (GET says so; the log says so), not
    ``in_progress`` forever; with room again, ``POST /v1/batches/{id}/resume`` (raw HTTP and
    the openai SDK's ``client.post``) finishes it without sending a committed line again."""
    state, port, n = tmp_path / "state", free_port(), 1500
    tenant = state / "tenants" / tenant_id(KEY_A)
    tenant.mkdir(parents=True)
    grow, log = tmp_path / "grow", tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    with StubServer(record_bodies=True) as stub:
        serve = " ".join(f"'{a}'" for a in serve_args(stub.url, state, port))
        script = f"""
mount -t tmpfs -o size=640k tmpfs '{tenant}'
{serve} &
while [ ! -e '{grow}' ]; do sleep 0.05; done
mount -o remount,size=64m '{tenant}'
touch '{grow}.done'
wait
"""
        with group(popen(["unshare", "-rm", "sh", "-euc", script], log)) as proc:
            ready(url, proc)
            client = sdk(url)
            upload = client.files.create(file=("in.jsonl", batch_file(n, "q")), purpose="batch")
            batch = client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            started = time.monotonic()
            failed = wait_batch(client, batch.id, within=60)
            took = time.monotonic() - started
            logged = log.read_text()
            grow.touch()
            wait_sync(lambda: Path(f"{grow}.done").exists(), timeout=30)
            resumed = client.post(f"/batches/{batch.id}/resume", cast_to=Batch)  # the SDK's way
            done = wait_batch(client, batch.id, within=60)
            ids = custom_ids(client, done)
            with http(url) as raw:
                unknown = raw.post(f"/v1/batches/{upload.id}/resume")
                finished = raw.post(f"/v1/batches/{batch.id}/resume")
            kill_group(proc, signal.SIGTERM)
            proc.wait(timeout=30)
        sent = sent_by_text(stub)
    assert failed.status == "failed" and failed.errors is not None, failed
    error = failed.errors.data[0]
    assert error.code == ErrorCode.storage_error and "disk is full" in error.message, error
    assert 0 < finished_of(failed) < n, "the disk filled up midway"
    assert took < 30
    assert f"batch {batch.id} failed: storage_error" in logged, logged
    assert resumed.status == "in_progress" and resumed.errors is None
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.completed == n
    assert ids == [f"q{i}" for i in range(n)]  # every custom_id once, in order
    assert set(sent) == {f"q {i}" for i in range(n)}
    twice = sum(c - 1 for c in sent.values())
    # only what was in flight or waiting at the server's fair gate (twice the window, so a
    # batch's next line can take its own freed slot) when the disk filled
    assert twice <= 2 * WINDOW, twice
    assert unknown.status_code == 404 and is_envelope(unknown)["param"] == "batch_id"
    assert finished.status_code == 409 and is_envelope(finished)["code"] == "conflict"
    assert "only a batch that failed after validation" in finished.json()["error"]["message"]


def finished_of(batch: Any) -> int:
    counts = batch.request_counts
    return int(counts.completed + counts.failed)


def http(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs resource.prlimit (Linux)")
def test_a_database_that_cannot_be_written_is_reported_failed_at_once_and_recorded_later(
    tmp_path: Path,
) -> None:
    """Mid-batch the server may write no byte to any file (``RLIMIT_FSIZE`` = 0 set on the live
    process: every write fails as on a dead disk): not even the failure can be written, yet GET
    says ``failed`` with ``storage_error`` at once and the log says why; with the limit lifted
    the failure is recorded within a heartbeat, and resume finishes the batch. The batch is
    long enough that a slow machine cannot finish it before the limit is set."""
    state, port, n = tmp_path / "state", free_port(), 600
    url = f"http://127.0.0.1:{port}"
    with StubServer(latency_s=0.05, record_bodies=True) as stub:
        env = {**os.environ, "PYTHONPATH": PYTHONPATH}
        # the log goes to a pipe: the file size limit covers regular files only
        proc = subprocess.Popen(
            serve_args(stub.url, state, port), env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        lines: list[bytes] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
        reader.start()

        def log() -> str:
            return b"".join(lines).decode()

        try:
            ready(url, proc)
            client = sdk(url)
            upload = client.files.create(file=("in.jsonl", batch_file(n, "q")), purpose="batch")
            batch = client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            wait_sync(lambda: stub.stats.requests >= 40, timeout=30, every=0.01)
            hard = resource.prlimit(proc.pid, resource.RLIMIT_FSIZE)[1]
            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (0, hard))
            failed = wait_batch(client, batch.id, within=30)
            wait_sync(lambda: "cannot be recorded yet" in log(), timeout=10)
            in_db = job_row(state / "tenants" / tenant_id(KEY_A) / DB_NAME, batch.id)["status"]
            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (hard, hard))
            wait_sync(lambda: "is recorded" in log(), timeout=10)
            resumed = client.post(f"/batches/{batch.id}/resume", cast_to=Batch)
            done = wait_batch(client, batch.id, within=60)
            ids = custom_ids(client, done)
        finally:
            proc.kill()
            proc.wait()
        sent = sent_by_text(stub)
    assert failed.status == "failed" and failed.errors is not None, failed
    error = failed.errors.data[0]
    assert error.code == ErrorCode.storage_error and "disk I/O error" in error.message, error
    assert in_db == "in_progress"  # what the database said meanwhile (and all GET said before)
    assert f"batch {batch.id} failed: storage_error" in log()
    assert resumed.status == "in_progress" and done.status == "completed"
    assert ids == [f"q{i}" for i in range(n)]
    # what was in flight or waiting at the fair gate when writing stopped: twice the window
    assert sum(c - 1 for c in sent.values()) <= 2 * WINDOW and len(sent) == n


# ------------------------------------------------------------------ orphans, not by pid


@pytest.mark.slow
@needs_pid_namespaces
def test_a_server_restarted_as_pid_1_takes_its_batch_back_within_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two servers, each PID 1 of its own PID namespace (as a container's entrypoint), on one
    host name and state directory. Server A runs a batch and freezes (SIGSTOP: its lease looks
    alive); B starts and leaves the batch alone; A is SIGKILLed: B, already serving, takes the
    batch back within seconds (the owner's lock is free, whatever its pid says) and finishes
    it: every custom_id once, at most the window sent twice. The lease is 300 s here, so only
    the free lock can hand the batch over, however long a busy machine takes to start B; the
    batch is long enough that A cannot finish it between the test's look and the SIGSTOP."""
    monkeypatch.setenv(LEASE_TIMES, "heartbeat_s=0.1,orphan_scan_s=0.2,lease_s=300")
    state, n = tmp_path / "state", 400
    db = state / "tenants" / tenant_id(KEY_A) / DB_NAME
    as_pid_1 = ["unshare", "-rpf", "--mount-proc", "--kill-child"]
    port_a, port_b = free_port(), free_port()
    with StubServer(latency_s=0.05, record_bodies=True) as stub:
        a_args = [*as_pid_1, *serve_args(stub.url, state, port_a)]
        with group(popen(a_args, tmp_path / "a.log")) as a:
            ready(f"http://127.0.0.1:{port_a}", a)
            upload = sdk(f"http://127.0.0.1:{port_a}").files.create(
                file=("in.jsonl", batch_file(n)), purpose="batch"
            )
            batch = sdk(f"http://127.0.0.1:{port_a}").batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            wait_sync(lambda: job_row(db, batch.id)["completed"] >= 2 * WINDOW, every=0.02)
            os.killpg(a.pid, signal.SIGSTOP)
            owner_a = job_row(db, batch.id)["owner"]
            b_args = [*as_pid_1, *serve_args(stub.url, state, port_b)]
            with group(popen(b_args, tmp_path / "b.log")) as b:
                url_b = f"http://127.0.0.1:{port_b}"
                ready(url_b, b)  # B looked for orphans before its port opened
                at_b_start = job_row(db, batch.id)
                kill_group(a)
                killed = time.monotonic()
                owner_b = wait_sync(
                    lambda: (o := job_row(db, batch.id)["owner"]) != owner_a and o, every=0.02
                )
                took = time.monotonic() - killed
                done = wait_batch(sdk(url_b), batch.id, within=60)
                ids = custom_ids(sdk(url_b), done)
        sent = sent_by_text(stub)
    [taken] = [x for x in (tmp_path / "b.log").read_text().splitlines() if "taking up" in x]
    silent = float(taken.split("last heartbeat ")[1].split(" s ago")[0])
    assert owner_a.split(":")[1] == "1" and owner_b.split(":")[1] == "1"  # both PID 1
    assert owner_a.split(":")[0] == owner_b.split(":")[0]  # on one host name
    assert at_b_start["owner"] == owner_a and at_b_start["status"] == "in_progress"
    assert took < 30, took  # scans every 0.2 s here (2 s by default), far short of the lease
    assert silent < 300, taken  # by the free lock: the lease (300 s of silence) was not waited for
    assert done.status == "completed" and sorted(ids) == sorted(f"r{i}" for i in range(n))
    assert len(sent) == n and sum(c - 1 for c in sent.values()) <= WINDOW


# ------------------------------------------------------------------ temporary files


@pytest.mark.slow
def test_temporary_files_left_by_sigkill_mid_upload_are_swept_at_the_next_start(
    tmp_path: Path,
) -> None:
    """A server SIGKILLed while a 3 MiB upload is being written leaves ``.file-*.tmp``; the next
    start, right away, removes it, an output file's temporary and one just written, and leaves
    alone one that a live writer holds (its lock)."""
    state, port = tmp_path / "state", free_port()
    files = state / "tenants" / tenant_id(KEY_A) / "files"
    url = f"http://127.0.0.1:{port}"
    with StubServer() as stub:
        proc = spawn(stub.url, state, port)
        try:
            ready(url, proc)
            head = (
                f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: Bearer {KEY_A}\r\nContent-Length: {8 << 20}\r\n"
                "Content-Type: multipart/form-data; boundary=b\r\n\r\n"
                '--b\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n'
            ).encode()
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(head + b"x" * (3 << 20))  # and never the rest
                staged = wait_sync(
                    lambda: [p for p in files.glob(".file-*.tmp") if p.stat().st_size >= 2 << 20]
                )
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            [upload] = staged
            left = upload.stat().st_size
            output = files / ".file-0123-output.4242.tmp"  # an output file cut by a crash
            output.write_bytes(b"{}\n" * 1000)
            young = files / ".file-young.tmp"  # written as the sweep looks, by no live writer
            young.write_bytes(b"y")
            soon = time.time() + 3600  # (the restart takes seconds: its time set ahead)
            os.utime(young, (soon, soon))
            old = time.time() - 3600
            live = files / ".file-live.tmp"  # an old file a live process still writes
            with live.open("wb") as held:
                fcntl.flock(held.fileno(), fcntl.LOCK_EX)
                os.utime(live, (old, old))
                proc = spawn(stub.url, state, port)
                ready(url, proc)
                kept = sorted(p.name for p in files.glob(".*.tmp"))
        finally:
            proc.kill()
            proc.wait()
    log = "".join(p.read_text() for p in tmp_path.glob("serve-*.log"))
    assert left >= 2 << 20
    assert kept == [".file-live.tmp"]
    assert f"removed 3 stale temporary file(s), {left + 3000 + 1} bytes" in log, log


def test_a_file_swept_between_its_creation_and_its_lock_is_created_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up sweep removes every unlocked temporary file, however young: a writer whose
    file it took before the writer locked it creates the file again, and its upload is
    stored whole."""
    from batchclient.jobs import _lease
    from batchclient.jobs._files import StagedFile
    from batchclient.jobs._store import Store

    store = Store(tmp_path / "state")
    real = fcntl.flock
    swept: list[str] = []
    calls = []

    def sweep_first(fd: int, op: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # the sweep runs between the writer's open and its lock
            for path in store.files_dir.glob(".*.tmp"):
                assert _lease.remove_if_unlocked(path)
                swept.append(path.name)
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", sweep_first)  # the module _lease locks with
    try:
        staged = StagedFile(store)
        staged.write(b"kept whole\n")
        record = staged.commit(store, "batch", "x.jsonl")
        assert swept == [f".{record.id}.tmp"]
        assert store.file_path(record.id).read_bytes() == b"kept whole\n"
        assert not list(store.files_dir.glob(".*.tmp"))
    finally:
        store.close()


# ------------------------------------------------------------------ batchclient jobs resume


async def test_jobs_resume_reopens_a_failed_batch_and_an_open_client_takes_it_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch fails after validation (a file where its output folder should be); once the
    folder is back, ``batchclient jobs resume`` (no provider: another process's command)
    reopens it and the client that is open on the state directory (as a server is) takes it
    up within a scan, sending nothing again. Resuming a completed batch is refused."""
    monkeypatch.setattr("batchclient.jobs._runner.WRITE_RETRY", WriteRetry(2, 0.01, 0.02))
    files = tmp_path / "files"
    resume = ["jobs", "resume", "--state-dir", str(tmp_path)]
    with StubServer(latency_s=0.05, record_bodies=True) as stub:
        async with RemoteBatchInference(
            stub.url, state_dir=tmp_path, max_concurrency=4, **FAST
        ) as c:
            record = await c.files.create(jsonl([line(f"r{i}", f"q{i}") for i in range(8)]))
            batch = await c.batches.create(record.id)
            async with output_folder_blocked(stub, files):
                with anyio.fail_after(30):
                    failed = await c.batches.wait(batch.id)
            code = await anyio.to_thread.run_sync(main, [*resume[:2], batch.id, *resume[2:]])
            reopened = capsys.readouterr().out
            started = time.monotonic()
            with anyio.fail_after(15):
                done = await c.batches.wait(batch.id)
            took = time.monotonic() - started
            again = await anyio.to_thread.run_sync(main, [*resume[:2], batch.id, *resume[2:]])
    assert failed.status == "failed" and failed.errors is not None
    assert failed.errors.data[0].code == ErrorCode.output_write_failed
    assert code == 0 and f"{batch.id}: in_progress" in reopened, reopened
    assert done.status == "completed" and done.request_counts.completed == 8
    assert took < 12, took  # the open client's scan (every 2 s), not its next start
    assert stub.stats.requests == 8  # every line had its result: nothing sent again
    assert again == 1 and "only a batch that failed after validation" in capsys.readouterr().err


async def test_a_live_client_in_the_same_process_keeps_its_lease_a_closed_one_loses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clients on one state directory in one process (same host, same pid): the second
    never takes the first's running batch (the lock is held by another open file); once the
    first is gone without releasing its lease (as a crash leaves it), its lock is free and the
    second takes the batch within a scan."""
    from batchclient.jobs._lease import owner_gone

    monkeypatch.setenv(LEASE_TIMES, "heartbeat_s=0.05,orphan_scan_s=0.1")
    with StubServer(latency_s=0.05) as stub:
        first = RemoteBatchInference(stub.url, state_dir=tmp_path, max_concurrency=1, **FAST)
        async with first:
            record = await first.files.create(jsonl([line(f"r{i}", f"q{i}") for i in range(40)]))
            batch = await first.batches.create(record.id)
            owner = first._manager().owner  # type: ignore[attr-defined]
            async with RemoteBatchInference(stub.url, state_dir=tmp_path, **FAST) as second:
                await anyio.sleep(0.5)  # past several scans of the second
                assert not second.batches.running_here(batch.id)
                assert owner_gone(tmp_path, owner) is False
        # the first paused its batch and released the lease; put back a lease as a SIGKILL
        # leaves it: naming the first owner, whose lock is now free
        with sqlite3.connect(tmp_path / DB_NAME) as db:
            db.execute("UPDATE jobs SET owner = ? WHERE id = ?", (owner, batch.id))
        lock = tmp_path / "owners" / f"{owner.rsplit(':', 1)[1]}.lock"
        lock.touch()  # left by the crash (the start-up sweep removes it: gone all the same)
        async with RemoteBatchInference(stub.url, state_dir=tmp_path, **FAST) as third:
            assert third.batches.running_here(batch.id)  # taken on entry: the lock was free
            with anyio.fail_after(30):
                done = await third.batches.wait(batch.id)
    assert done.status == "completed" and not lock.exists()


# ------------------------------------------------------------------ lease times


def test_lease_times_default_and_from_the_environment() -> None:
    assert LeaseTimes.from_env({}) == LeaseTimes(lease_s=10.0, heartbeat_s=1.0, orphan_scan_s=2.0)
    given = {LEASE_TIMES: " heartbeat_s=0.05, orphan_scan_s = 0.1 "}
    assert LeaseTimes.from_env(given) == LeaseTimes(heartbeat_s=0.05, orphan_scan_s=0.1)
    assert LeaseTimes.from_env({LEASE_TIMES: ""}) == LeaseTimes()
    for bad, says in [
        ("heartbeat=1", "unknown 'heartbeat'"),
        ("lease_s=soon", "lease_s must be a number of seconds, not 'soon'"),
        ("orphan_scan_s=0", "orphan_scan_s must be a positive number"),
        ("lease_s=nan", "lease_s must be a positive number"),
    ]:
        with pytest.raises(ConfigurationError, match=says):
            LeaseTimes.from_env({LEASE_TIMES: bad})
