"""Crash and re-attach on a remote Batch API: a client SIGKILLed while it waits for its remote
batch re-attaches on the next ``async with`` (or the same call made again) and never submits a
second time; ``batchclient run --provider batch-api`` end to end. Against the Batch API stub."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from batchclient import BatchAPIBatchInference, RetryPolicy
from batchclient.cli import main
from batchclient.testing import BatchAPIStub
from jobs_util import jsonl, line, read_jsonl, wait_sync

FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)
N = 20

CHILD = textwrap.dedent(
    """
    import sys, anyio
    from batchclient import BatchAPIBatchInference

    url, state, mode = sys.argv[1], sys.argv[2], sys.argv[3]

    async def main() -> None:
        async with BatchAPIBatchInference(url, poll_interval_s=0.05, state_dir=state) as c:
            if mode == "call":
                msgs = [[{"role": "user", "content": f"k{i}"}] for i in range(N)]
                await c.batch_chat_completion("smollm2", msgs)
            else:
                record = await c.files.create(sys.argv[4])
                job = await c.schedule_batch(record.id)
                await c.batches.wait(job.job_id)
        print("finished", flush=True)

    anyio.run(main)
    """
).replace("range(N)", f"range({N})")


def submitted(state: Path) -> bool:
    db = state / "batchclient.sqlite3"
    if not db.exists():
        return False
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        try:
            row = conn.execute(
                "SELECT count(*) FROM remote_parts WHERE batch_id IS NOT NULL"
            ).fetchone()
        except sqlite3.OperationalError:
            return False
    return bool(row[0])


def kill_once_submitted(stub: BatchAPIStub, state: Path, *args: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, stub.url, str(state), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_sync(lambda: submitted(state) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        wait_sync(lambda: stub.stats.polls >= 1, timeout=30)  # it is waiting
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert b"finished" not in (proc.stdout.read() if proc.stdout else b"")


async def test_a_killed_call_reattaches_and_never_submits_twice(tmp_path: Path) -> None:
    with BatchAPIStub(line_delay_s=0.05) as stub:
        kill_once_submitted(stub, tmp_path, "call")
        assert (stub.stats.uploads, stub.stats.creates) == (1, 1)
        async with BatchAPIBatchInference(
            stub.url, poll_interval_s=0.02, retry=FAST, state_dir=tmp_path
        ) as c:
            msgs = [[{"role": "user", "content": f"k{i}"}] for i in range(N)]
            result = await c.batch_chat_completion("smollm2", msgs)
    assert [i.completion_message.content for i in result.batch if i.completion_message] == [
        f"echo: k{i}" for i in range(N)
    ]
    assert (stub.stats.uploads, stub.stats.creates, stub.stats.lines) == (1, 1, N)


async def test_a_killed_job_resumes_on_the_next_async_with(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line(f"r{i}", f"n{i}") for i in range(N)]))
    state = tmp_path / "state"
    with BatchAPIStub(line_delay_s=0.05) as stub:
        kill_once_submitted(stub, state, "job", str(inp))
        async with BatchAPIBatchInference(
            stub.url, poll_interval_s=0.02, retry=FAST, state_dir=state
        ) as c:
            job = (await c.batches.list())[0]
            info = await c.batches.wait(job.id)  # resumed on entry: polls the same batch
            result = await c.job_result(job.id)
    assert info.status == "completed" and info.request_counts.completed == N
    assert [i.custom_id for i in result.batch] == [f"r{i}" for i in range(N)]
    assert (stub.stats.uploads, stub.stats.creates) == (1, 1)


def test_cli_run_with_the_batch_api_provider(tmp_path: Path) -> None:
    inp, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    inp.write_bytes(jsonl([line(f"r{i}", f"n{i}" + (" BAD" if i == 3 else "")) for i in range(7)]))
    args = [
        "run", str(inp), "-o", str(out), "--errors", str(err), "--provider", "batch-api",
        "--poll-interval", "0.02", "--max-lines", "3", "--state-dir", str(tmp_path / "s"),
        "--no-progress",
    ]  # fmt: skip
    with BatchAPIStub(error_match="BAD") as stub:
        assert main([*args, "--base-url", stub.url]) == 0
        assert stub.stats.creates == 3
        assert main([*args, "--base-url", stub.url]) == 0  # done: rebuilds, sends nothing
        assert stub.stats.creates == 3
    assert [r["custom_id"] for r in read_jsonl(out)] == ["r0", "r1", "r2", "r4", "r5", "r6"]
    assert [r["response"]["status_code"] for r in read_jsonl(err)] == [400]


def test_cli_batch_api_needs_a_base_url(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line("r0", "n0")]))
    code = main(["run", str(inp), "-o", str(tmp_path / "o"), "--provider", "batch-api"])
    assert code == 2
