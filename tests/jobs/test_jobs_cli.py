"""The ``batchclient`` CLI: ``run`` (output format, resume, rebuild, refusing to overwrite the
input) and ``jobs``; crash tests that SIGKILL ``batchclient run`` mid-job and run it again
(results on disk as they complete, a re-run sends only what did not finish: vllm PR #52505,
curator PR #730), against the stub (exact count of what the server received)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from batchclient.cli import main
from batchclient.testing import StubServer
from jobs_util import done_in_db, jsonl, line, read_jsonl, wait_sync

WINDOW = 8


def write_input(path: Path, n: int, *, bad: frozenset[int] = frozenset()) -> Path:
    lines = [line(f"r{i}", f"n{i}", **({"max_tokens": -5} if i in bad else {})) for i in range(n)]
    path.write_bytes(jsonl(lines))
    return path


def run_args(inp: Path, out: Path, url: str, state: Path, *extra: str) -> list[str]:
    return [
        "run",
        str(inp),
        "-o",
        str(out),
        "--base-url",
        url,
        "--state-dir",
        str(state),
        "--max-concurrency",
        str(WINDOW),
        "--no-progress",
        *extra,
    ]


def latest_job(state: Path) -> str:
    with sqlite3.connect(f"file:{state / 'batchclient.sqlite3'}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT id FROM jobs ORDER BY created_at DESC, rowid DESC").fetchone()
    return str(row[0])


def sent_counts(stub: StubServer) -> Counter[str]:
    return Counter(b["messages"][0]["content"] for b in stub.stats.bodies)


def refusal_400(body: dict[str, Any], attempt: int) -> Any:
    from batchclient.testing import StubReply

    if body.get("max_tokens") == -5:
        error = {"message": "max_tokens must be at least 1", "type": "BadRequestError"}
        return StubReply(status=400, body={"error": {**error, "param": "max_tokens", "code": 400}})
    return None


# ------------------------------------------------------------------------------ in-process


def test_run_writes_openai_output_and_a_rerun_sends_nothing(tmp_path: Path) -> None:
    inp = write_input(tmp_path / "in.jsonl", 30, bad=frozenset({4, 17}))
    out, err, state = tmp_path / "out.jsonl", tmp_path / "err.jsonl", tmp_path / "state"
    with StubServer(record_bodies=True, handler=refusal_400) as stub:
        assert main(run_args(inp, out, stub.url, state)) == 0
        everything = read_jsonl(out)
        sent = stub.stats.requests
        out.unlink()
        assert main(run_args(inp, out, stub.url, state, "--errors", str(err))) == 0
        assert stub.stats.requests == sent == 30  # the finished job was not run again
    assert [r["custom_id"] for r in everything] == [f"r{i}" for i in range(30)]
    assert [r["custom_id"] for r in read_jsonl(err)] == ["r4", "r17"]
    assert len(read_jsonl(out)) == 28
    refusal = read_jsonl(err)[0]
    assert refusal["error"] is None and refusal["response"]["status_code"] == 400


@pytest.mark.parametrize("target", ["output", "errors"])
def test_run_refuses_to_write_over_its_input(tmp_path: Path, target: str) -> None:
    inp = write_input(tmp_path / "in.jsonl", 3)
    before = inp.read_bytes()
    other = tmp_path / "out.jsonl"
    out, extra = (inp, []) if target == "output" else (other, ["--errors", str(inp)])
    link = tmp_path / "link.jsonl"
    link.symlink_to(inp)
    with StubServer() as stub:
        assert main(run_args(inp, out, stub.url, tmp_path / "s", *extra)) == 2
        assert main(run_args(inp, link, stub.url, tmp_path / "s")) == 2
        assert stub.stats.requests == 0
    assert inp.read_bytes() == before


def test_jobs_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = write_input(tmp_path / "in.jsonl", 5)
    state = tmp_path / "state"
    with StubServer() as stub:
        assert main(run_args(inp, tmp_path / "o.jsonl", stub.url, state)) == 0
    capsys.readouterr()
    assert main(["jobs", "list", "--json", "--state-dir", str(state)]) == 0
    (job,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert job["status"] == "completed" and job["request_counts"]["completed"] == 5
    assert main(["jobs", "--state-dir", str(state), "status", job["id"]]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == job["id"]
    assert main(["jobs", "result", job["id"], "--state-dir", str(state)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5
    assert main(["jobs", "cancel", job["id"], "--state-dir", str(state)]) == 1
    assert "completed" in capsys.readouterr().err
    assert main(["jobs", "status", "batch_nope", "--state-dir", str(state)]) == 1


# ------------------------------------------------------------------------------ crash tests


def spawn(args: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    return subprocess.Popen(
        [sys.executable, "-m", "batchclient.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def kill_after(proc: subprocess.Popen[bytes], state: Path, n: int, sent: Any = None) -> int:
    """SIGKILL once ``n`` results are committed, or (with ``sent``) once the server received
    ``n`` requests: a moment unrelated to commits, so lazy commits could not hide."""
    if sent is None:
        wait_sync(lambda: done_in_db(state) >= n or proc.poll() is not None, timeout=120)
    else:
        wait_sync(lambda: sent() >= n or proc.poll() is not None, timeout=120, every=0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()  # reaped: its pid is dead for the next run's lease check
    return done_in_db(state)


@pytest.mark.slow
def test_results_are_on_disk_as_they_complete_and_input_is_untouched(tmp_path: Path) -> None:
    inp = write_input(tmp_path / "in.jsonl", 500)
    digest = hashlib.sha256(inp.read_bytes()).hexdigest()
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    with StubServer(latency_s=0.02, jitter_s=0.05) as stub:
        proc = spawn(run_args(inp, out, stub.url, state))
        on_disk = kill_after(proc, state, 200)
    assert 200 <= on_disk < 500
    # what is committed is readable right away, line by line (SQLite: no torn lines at all)
    partial = tmp_path / "partial.jsonl"
    job_id = latest_job(state)
    assert main(["jobs", "result", job_id, "-o", str(partial), "--state-dir", str(state)]) == 0
    rows = read_jsonl(partial)
    assert len(rows) == on_disk and all(r["response"]["status_code"] == 200 for r in rows)
    assert hashlib.sha256(inp.read_bytes()).hexdigest() == digest
    assert not out.exists()  # the output is written whole at the end, never half


@pytest.mark.slow
def test_sigkill_and_rerun_sends_only_unfinished_requests(tmp_path: Path) -> None:
    inp = write_input(tmp_path / "in.jsonl", 300, bad=frozenset({7, 150}))
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    with StubServer(latency_s=0.02, jitter_s=0.08, record_bodies=True, handler=refusal_400) as stub:
        proc = spawn(run_args(inp, out, stub.url, state))
        at_kill = kill_after(proc, state, 100 + WINDOW, sent=lambda: stub.stats.requests)
        before = sent_counts(stub)
        assert main(run_args(inp, out, stub.url, state)) == 0  # the re-run, in this process
        after = sent_counts(stub)
    assert 100 <= at_kill < 300
    rows = read_jsonl(out)
    ids = [r["custom_id"] for r in rows]
    assert sorted(ids, key=lambda x: int(x[1:])) == [f"r{i}" for i in range(300)]  # exactly once
    assert sum(r["error"] is None and r["response"]["status_code"] == 200 for r in rows) == 298
    resent = sum(after.values()) - len(after)
    assert len(after) == 300 and resent <= WINDOW  # finished requests were not sent again
    assert sum(before.values()) - at_kill <= WINDOW  # what was lost at the kill: the window


@pytest.mark.slow
def test_cancelled_run_is_cancelled_from_another_process_and_rerun_reuses_its_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the run sees the cancel at its next heartbeat: every 0.1 s here (1 s by default)
    monkeypatch.setenv("BATCHCLIENT_LEASE_TIMES", "heartbeat_s=0.1")
    inp = write_input(tmp_path / "in.jsonl", 120)
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    with StubServer(latency_s=0.2, jitter_s=0.2, record_bodies=True) as stub:
        proc = spawn(run_args(inp, out, stub.url, state))
        wait_sync(lambda: done_in_db(state) >= 30, timeout=60, every=0.01)
        job_id = latest_job(state)
        assert main(["jobs", "cancel", job_id, "--state-dir", str(state)]) == 0
        assert proc.wait(30) == 1  # the run saw its job cancelled and stopped
        first = sent_counts(stub)
        stub.latency_s, stub.jitter_s = 0.01, 0.0  # the re-run need not be slow
        assert main(run_args(inp, out, stub.url, state)) == 0
        after = sent_counts(stub)
    assert len(after) == 120 and sum(after.values()) - 120 <= WINDOW
    assert sum(first.values()) < 100  # the cancel stopped the first run early
    assert sum(after.values()) > sum(first.values())
    assert [r["custom_id"] for r in read_jsonl(out)] == [f"r{i}" for i in range(120)]
    assert all(r["error"] is None for r in read_jsonl(out))
