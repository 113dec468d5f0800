"""Failures after results are committed never strand them, against real files and folders: a
file where the output folder should be, a read-only output folder, a full disk (a tiny tmpfs),
a full disk under the database itself. The filesystem tests run ``batchclient run`` in a
private mount namespace (``unshare -rm``: no privileges needed, nothing outlives the process)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import BatchChatCompletionResponse, ErrorCode, RemoteBatchInference
from batchclient.cli import main
from batchclient.jobs._runner import WriteRetry
from batchclient.testing import StubServer
from jobs_util import FAST, jsonl, line, output_folder_blocked, read_jsonl


def client(stub: StubServer, state: Path, **kw: Any) -> RemoteBatchInference:
    return RemoteBatchInference(stub.url, state_dir=state, **{**FAST, **kw})


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=16k tmpfs /tmp"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(
    not _can_unshare(), reason="needs `unshare -rm` (user and mount namespaces) to mount a tmpfs"
)


def in_namespace(script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a shell script as root of a private user + mount namespace (mounts vanish with it)."""
    return subprocess.run(
        ["unshare", "-rm", "sh", "-euc", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHON": sys.executable},
    )


def cli(*args: str | Path) -> str:
    """A ``batchclient`` command line for the namespace's shell."""
    return " ".join(['"$PYTHON" -m batchclient.cli', *(f"'{a}'" for a in args)])


def sent_by_text(stub: StubServer) -> Counter[str]:
    return Counter(b["messages"][0]["content"] for b in stub.stats.bodies)


# ------------------------------------------------------------------------------ in process


async def test_a_file_where_the_output_folder_should_be_fails_the_batch_keeping_every_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("batchclient.jobs._runner.WRITE_RETRY", WriteRetry(3, 0.01, 0.02))
    files = tmp_path / "files"
    with StubServer(latency_s=0.2, record_bodies=True) as stub:
        async with client(stub, tmp_path, max_concurrency=4) as c:
            record = await c.files.create(jsonl([line(f"r{i}", f"q{i}") for i in range(8)]))
            batch = await c.batches.create(record.id)
            async with output_folder_blocked(stub, files):
                with anyio.fail_after(30):
                    failed = await c.batches.wait(batch.id)
                result = await c.job_result(batch.id)
            resumed = await c.batches.resume(batch.id)
            with anyio.fail_after(30):
                done = await c.batches.wait(batch.id)
            out = (await c.files.content(done.output_file_id or "")).decode().splitlines()
    assert failed.status == "failed" and failed.errors is not None
    error = failed.errors.data[0]
    assert error.code == ErrorCode.output_write_failed
    assert str(files) in error.message and "Errno" in error.message, error.message
    assert failed.request_counts.completed == 8
    assert isinstance(result, BatchChatCompletionResponse)
    assert [r.text for r in result.batch] == [f"echo: q{i}" for i in range(8)]
    # running again (every result is there, so it may already be writing its files)
    assert resumed.status in ("in_progress", "finalizing") and resumed.errors is None
    assert done.status == "completed" and len(out) == 8
    assert stub.stats.requests == 8  # resuming sent nothing: every request had its result


async def test_a_failed_batch_is_free_to_resume_once_wait_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wait`` returns once the job has let go of its lease, however slowly that is written (a
    loaded machine): resuming right after it finds the lease free, and keeps it."""
    from batchclient.jobs._store import DB_NAME, Store

    def owner() -> str | None:
        with sqlite3.connect(tmp_path / DB_NAME) as db:
            (value,) = db.execute("SELECT owner FROM jobs WHERE id = ?", (batch.id,)).fetchone()
        return None if value is None else str(value)

    release = Store.release

    def slow_release(self: Store, job_id: str, owner: str) -> None:
        time.sleep(0.3)  # in a worker thread, as every store call
        release(self, job_id, owner)

    monkeypatch.setattr(Store, "release", slow_release)
    monkeypatch.setattr("batchclient.jobs._runner.WRITE_RETRY", WriteRetry(1, 0.01, 0.02))
    files = tmp_path / "files"
    with StubServer(latency_s=0.1) as stub:
        async with client(stub, tmp_path) as c:
            record = await c.files.create(jsonl([line(f"r{i}", f"q{i}") for i in range(4)]))
            batch = await c.batches.create(record.id)
            async with output_folder_blocked(stub, files):
                with anyio.fail_after(30):
                    failed = await c.batches.wait(batch.id)
                owner_when_failed = owner()
            resumed = await c.batches.resume(batch.id)
            owner_when_resumed, mine = owner(), c._manager().owner  # type: ignore[attr-defined]
            with anyio.fail_after(30):
                done = await c.batches.wait(batch.id)
    assert failed.status == "failed" and owner_when_failed is None
    assert failed.errors is not None
    assert failed.errors.data[0].code == ErrorCode.output_write_failed
    assert resumed.status == "in_progress" and owner_when_resumed == mine
    assert done.status == "completed" and stub.stats.requests == 4


async def test_a_state_directory_moved_under_a_running_batch(tmp_path: Path) -> None:
    state, moved = tmp_path / "state", tmp_path / "moved"
    with StubServer(latency_s=0.2) as stub:
        async with client(stub, state, max_concurrency=4) as c:
            record = await c.files.create(jsonl([line(f"r{i}", f"q{i}") for i in range(8)]))
            batch = await c.batches.create(record.id)
            with anyio.fail_after(30):
                while stub.stats.requests == 0:
                    await anyio.sleep(0.01)
            state.rename(moved)
            with anyio.fail_after(30):
                failed = await c.batches.wait(batch.id)
            result = await c.job_result(batch.id)  # still readable here
        assert not state.exists()  # nothing was made again at the old path
        moved.rename(state)  # put back: the database holds every result
        async with client(stub, state) as c:
            await c.batches.resume(batch.id)
            with anyio.fail_after(30):
                done = await c.batches.wait(batch.id)
        assert stub.stats.requests == 8
    assert failed.status == "failed" and failed.errors is not None
    error = failed.errors.data[0]
    assert error.code == "storage_error" and str(state / "batchclient.sqlite3") in error.message
    assert "moved, removed or replaced" in error.message
    assert isinstance(result, BatchChatCompletionResponse)
    assert [r.text for r in result.batch] == [f"echo: q{i}" for i in range(8)]
    assert done.status == "completed"


async def test_writing_the_files_is_retried_until_the_folder_is_back(tmp_path: Path) -> None:
    files = tmp_path / "files"
    with StubServer(latency_s=0.2) as stub:
        async with client(stub, tmp_path, max_concurrency=4) as c:
            record = await c.files.create(jsonl([line(f"r{i}", f"q{i}") for i in range(4)]))
            batch = await c.batches.create(record.id)
            with anyio.fail_after(30):
                while stub.stats.requests == 0:
                    await anyio.sleep(0.01)
            files.rename(tmp_path / "files.moved")
            files.write_text("in the way for a moment")
            with anyio.fail_after(30):
                while (await c.batches.retrieve(batch.id)).status != "finalizing":
                    await anyio.sleep(0.01)
            await anyio.sleep(0.15)  # a try or two fail meanwhile
            files.unlink()
            (tmp_path / "files.moved").rename(files)
            with anyio.fail_after(30):
                done = await c.batches.wait(batch.id)
    assert done.status == "completed" and done.output_file_id is not None


async def test_job_result_of_a_batch_that_stopped_midway_marks_lines_without_a_result(
    tmp_path: Path,
) -> None:
    import sqlite3

    lines = [line(f"r{i}", f"q{i}") for i in range(6)]
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            record = await c.files.create(jsonl(lines))
            batch = await c.batches.create(record.id)
            with anyio.fail_after(30):
                await c.batches.wait(batch.id)
        with sqlite3.connect(tmp_path / "batchclient.sqlite3") as db:  # as a full disk leaves it
            db.execute("DELETE FROM results WHERE job_id = ? AND seq >= 4", (batch.id,))
            error = {"code": "storage_error", "message": "the state database failed: full"}
            db.execute(
                "UPDATE jobs SET status = 'failed', completed = 4, errors = ? WHERE id = ?",
                (json.dumps([error]), batch.id),
            )
        async with client(stub, tmp_path) as c:
            result = await c.job_result(batch.id)
            await c.batches.resume(batch.id)
            with anyio.fail_after(30):
                done = await c.batches.wait(batch.id)
        assert stub.stats.requests == 6 + 2  # the two lines without a result, nothing else
    assert isinstance(result, BatchChatCompletionResponse)
    assert [r.text for r in result.batch[:4]] == [f"echo: q{i}" for i in range(4)]
    assert [r.custom_id for r in result.batch] == [f"r{i}" for i in range(6)]
    for item in result.batch[4:]:
        assert item.error is not None and item.error.code == "batch_failed"
        assert "storage_error" in item.error.message
    assert done.status == "completed" and done.request_counts.completed == 6


# ------------------------------------------------------------------------------ real mounts


@pytest.mark.slow
@needs_mounts
def test_cli_output_on_a_full_disk_then_run_again_sends_nothing(tmp_path: Path) -> None:
    inp, state, out_dir = tmp_path / "in.jsonl", tmp_path / "state", tmp_path / "out"
    out_dir.mkdir()
    inp.write_bytes(jsonl([line(f"r{i}", f"question {i}") for i in range(200)]))
    out = out_dir / "out.jsonl"
    with StubServer(record_bodies=True) as stub:
        args: list[str | Path] = [
            "run", inp, "-o", out, "--base-url", stub.url, "--state-dir", state, "--no-progress"
        ]  # fmt: skip
        full = in_namespace(f"mount -t tmpfs -o size=16k tmpfs '{out_dir}'\n{cli(*args)}")
        assert full.returncode == 1, full.stderr
        assert f"could not write {out}: [Errno 28] No space left on device" in full.stderr
        assert "run the same command again" in full.stderr
        assert stub.stats.requests == 200
        assert main([str(a) for a in args]) == 0  # the disk has room again (no tmpfs)
        assert stub.stats.requests == 200  # nothing was sent again
    assert [r["custom_id"] for r in read_jsonl(out)] == [f"r{i}" for i in range(200)]


@pytest.mark.slow
@needs_mounts
def test_cli_output_in_a_read_only_folder(tmp_path: Path) -> None:
    inp, state, out_dir = tmp_path / "in.jsonl", tmp_path / "state", tmp_path / "out"
    out_dir.mkdir()
    inp.write_bytes(jsonl([line(f"r{i}", f"q{i}") for i in range(20)]))
    out, errors = out_dir / "out.jsonl", tmp_path / "errors.jsonl"
    with StubServer() as stub:
        args: list[str | Path] = ["run", inp, "-o", out, "--errors", errors]
        args += ["--base-url", stub.url, "--state-dir", state, "--no-progress"]
        ro = in_namespace(
            f"mount --bind '{out_dir}' '{out_dir}'\nmount -o remount,ro,bind '{out_dir}'\n"
            + cli(*args)
        )
        assert ro.returncode == 1, ro.stderr
        assert f"could not write {out}: [Errno 30] Read-only file system" in ro.stderr
        assert main([str(a) for a in args]) == 0
        assert stub.stats.requests == 20
    assert len(read_jsonl(out)) == 20 and not list(out_dir.glob(".*.tmp"))


@pytest.mark.slow
@needs_mounts
def test_cli_job_files_on_a_full_disk_then_run_again_resumes_the_job(tmp_path: Path) -> None:
    """The batch's own output file cannot be written (its folder is a full tmpfs): the batch
    fails naming the file and the error; with room again the same command finishes it."""
    inp, state, out = tmp_path / "in.jsonl", tmp_path / "state", tmp_path / "out.jsonl"
    inp.write_bytes(jsonl([line(f"r{i}", f"q{i}") for i in range(120)]))
    files = state / "files"
    files.mkdir(parents=True)
    with StubServer(record_bodies=True) as stub:
        args: list[str | Path] = ["run", inp, "-o", out, "--base-url", stub.url]
        args += ["--state-dir", state, "--no-progress"]
        # room for the input (about 20 kB), not for the output file (about 60 kB)
        script = f"""
mount -t tmpfs -o size=32k tmpfs '{files}'
if {cli(*args)} 2> '{tmp_path}/first.err'; then exit 3; fi
mount -o remount,size=4m '{files}'
{cli(*args)}
"""
        run = in_namespace(script)
        assert run.returncode == 0, run.stderr
        first = (tmp_path / "first.err").read_text()
        assert "output_write_failed" in first and str(files / "file-") in first, first
        assert "[Errno 28] No space left on device" in first
        # the first run's summary (and -o, written all the same), then the second's
        summaries = [x for x in run.stdout.splitlines() if " completed, " in x]
        assert ": failed; 120 completed, 0 failed of 120" in summaries[0]
        assert f"output (every result, written all the same): {out}" in run.stdout
        assert ": completed; 120 completed, 0 failed of 120" in summaries[1]
        assert "resuming job" in run.stderr
        assert stub.stats.requests == 120
    assert [r["custom_id"] for r in read_jsonl(out)] == [f"r{i}" for i in range(120)]


@pytest.mark.slow
@needs_mounts
def test_cli_database_on_a_full_disk_then_run_again_sends_only_what_was_not_committed(
    tmp_path: Path,
) -> None:
    inp, state, out = tmp_path / "in.jsonl", tmp_path / "state", tmp_path / "out.jsonl"
    n = 1500
    inp.write_bytes(jsonl([line(f"r{i}", f"q{i}") for i in range(n)]))
    state.mkdir()
    committed = tmp_path / "committed.txt"
    dump = (
        "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
        "print('\\n'.join(r[0] for r in db.execute('SELECT custom_id FROM results')))"
    )
    with StubServer(record_bodies=True) as stub:
        args: list[str | Path] = ["run", inp, "-o", out, "--base-url", stub.url]
        args += ["--state-dir", state, "--no-progress", "--max-concurrency", "8"]
        script = f"""
mount -t tmpfs -o size=640k tmpfs '{state}'
if {cli(*args)} 2> '{tmp_path}/first.err'; then exit 3; fi
"$PYTHON" -c "{dump}" '{state}/batchclient.sqlite3' > '{committed}'
mount -o remount,size=64m '{state}'
{cli(*args)}
"""
        run = in_namespace(script, timeout=300)
        first = (tmp_path / "first.err").read_text()
        assert run.returncode == 0, run.stderr + first
        assert "database or disk is full" in first, first
        sent = sent_by_text(stub)
    kept = set(committed.read_text().split())
    assert 0 < len(kept) < n, "the disk filled up midway"
    assert [r["custom_id"] for r in read_jsonl(out)] == [f"r{i}" for i in range(n)]
    assert set(sent) == {f"q{i}" for i in range(n)}
    twice = {text for text, count in sent.items() if count > 1}
    assert not {f"q{cid[1:]}" for cid in kept} & twice, "a committed request was sent again"
