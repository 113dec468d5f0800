"""``batchclient serve`` as a command: it refuses an open address without keys, a batch survives
SIGKILL of the server (started again, it resumes: counts never go back, every custom_id once,
at most the in-flight window sent twice), and SIGTERM pauses batches and exits within 10 s.
The servers run as subprocesses; the provider is a loopback stub in this process."""

from __future__ import annotations

import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import trustme

from batchclient.cli import main
from batchclient.server import tenant_id
from batchclient.server._bind import is_loopback
from batchclient.testing import Fault, StubReply, StubServer, free_port
from jobs_util import done_in_db, wait_sync
from server_util import KEY_A, WINDOW, batch_file, finished, ready, sdk, spawn, wait_batch


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("no-such-host.invalid", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_serve_refuses_an_open_address_without_keys_and_bad_keys(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHCLIENT_API_KEYS", raising=False)
    base = ["serve", "--base-url", "http://127.0.0.1:9/v1", "--port", "0"]
    assert main([*base, "--host", "0.0.0.0"]) == 2
    assert "refusing to listen on 0.0.0.0 without keys" in capsys.readouterr().err
    assert main([*base, "--api-key", "short"]) == 2
    assert "at least 16 characters" in capsys.readouterr().err
    monkeypatch.setenv("BATCHCLIENT_API_KEYS", "bad key with spaces, and more")
    assert main(base) == 2
    assert "visible ASCII" in capsys.readouterr().err


def _serve_with_file_limit(
    stub_url: str, state: Path, port: int, keys: list[str], soft: int, hard: int
) -> subprocess.Popen[bytes]:
    """``batchclient serve`` with ``keys`` under an open-files limit of ``soft`` / ``hard``."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    args = ["serve", "--base-url", stub_url, "--port", str(port), "--state-dir", str(state)]
    for key in keys:
        args += ["--api-key", key]
    return subprocess.Popen(
        [sys.executable, "-m", "batchclient.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=limit,
    )


@pytest.mark.slow
def test_many_keys_raise_the_open_files_limit_or_are_refused_in_one_line(
    stub: StubServer, tmp_path: Path
) -> None:
    """60 tenants may hold more files than a soft limit of 300 allows: the server raises it to
    the hard limit and serves; under a hard limit of 300 it refuses at once, in one line
    saying what to do (it hung at start, neither serving nor saying why)."""
    keys = [KEY_A, *(f"tenant-key-{i:012d}" for i in range(59))]
    port = free_port()
    proc = _serve_with_file_limit(stub.url, tmp_path / "raised", port, keys, 300, 4096)
    try:
        ready(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        proc.wait(30)
    refused = _serve_with_file_limit(stub.url, tmp_path / "capped", free_port(), keys, 300, 300)
    try:
        out, _ = refused.communicate(timeout=60)
    finally:
        refused.kill()  # (it hung at start before: left no process behind)
        refused.wait()
    assert refused.returncode == 2, out
    lines = out.decode().strip().splitlines()
    assert len(lines) == 1 and "60 key(s) need about 948 open files" in lines[0], lines
    assert "the limit (ulimit -n) is 300" in lines[0]


pytestmark = pytest.mark.stub(
    latency_s=0.05, record_bodies=True, faults=[Fault(StubReply(delay_s=60), match="SLOW")]
)


@pytest.mark.slow
def test_a_batch_survives_sigkill_of_the_server(stub: StubServer, tmp_path: Path) -> None:
    # enough lines that the batch is far from done when it is killed
    state, port, lines = tmp_path / "state", free_port(), 400
    url = f"http://127.0.0.1:{port}"
    # the module's stub: counted from what it had when this test began
    requests_before, bodies_before = stub.stats.requests, len(stub.stats.bodies)
    proc = spawn(stub.url, state, port)
    try:
        ready(url, proc)
        client = sdk(url)
        upload = client.files.create(file=("in.jsonl", batch_file(lines)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        # read before the wait: a retrieve from the busy server between the wait and the kill
        # could let a slow machine finish the batch before it is killed
        seen = [finished(client.batches.retrieve(batch.id))]
        # killed at a moment set by what the provider received, unrelated to commits
        wait_sync(
            lambda: stub.stats.requests - requests_before >= 50 + WINDOW, timeout=60, every=0.002
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        tenant = state / "tenants" / tenant_id(KEY_A)
        at_kill, sent_before = done_in_db(tenant), stub.stats.requests - requests_before
        proc = spawn(stub.url, state, port)
        ready(url, proc)
        while (current := client.batches.retrieve(batch.id)).status != "completed":
            seen.append(finished(current))
            time.sleep(0.02)
        done = wait_batch(client, batch.id)
        output = client.files.content(done.output_file_id).text.splitlines()
    finally:
        proc.kill()
        proc.wait()
    assert 50 <= at_kill < lines and sent_before - at_kill <= WINDOW
    assert seen == sorted(seen) and seen[0] <= at_kill  # counts never went back
    assert all(x >= at_kill for x in seen[1:])
    assert done.request_counts is not None and done.request_counts.completed == lines
    ids = [json.loads(x)["custom_id"] for x in output]
    assert sorted(ids) == sorted(f"r{i}" for i in range(lines))  # every custom_id, once
    sent = Counter(body["messages"][0]["content"] for body in stub.stats.bodies[bodies_before:])
    assert len(sent) == lines and sum(n - 1 for n in sent.values()) <= WINDOW


@pytest.mark.slow
def test_sigterm_pauses_batches_and_exits_within_10_s(stub: StubServer, tmp_path: Path) -> None:
    ca = trustme.CA()
    pem, ca_pem = tmp_path / "server.pem", tmp_path / "ca.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    ca.cert_pem.write_to_path(str(ca_pem))
    state, port = tmp_path / "state", free_port()
    url = f"https://127.0.0.1:{port}"
    proc = spawn(stub.url, state, port, "--ssl-certfile", str(pem), "--ssl-keyfile", str(pem))
    try:
        ready(url, proc, verify=str(ca_pem))
        with httpx.Client(
            base_url=url, verify=str(ca_pem), headers={"Authorization": f"Bearer {KEY_A}"}
        ) as client:
            upload = client.post(
                "/v1/files",
                files={"file": ("in.jsonl", batch_file(40, "SLOW"))},
                data={"purpose": "batch"},
            ).json()
            batch = client.post(
                "/v1/batches",
                json={"input_file_id": upload["id"], "endpoint": "/v1/chat/completions"},
            ).json()
        wait_sync(lambda: stub.stats.in_flight >= WINDOW, timeout=30)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        took = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
    assert code == 0 and took < 10, (code, took)
    wait_sync(lambda: stub.stats.in_flight == 0, timeout=5)  # its requests were closed
    db = state / "tenants" / tenant_id(KEY_A) / "batchclient.sqlite3"
    with sqlite3.connect(db) as conn:
        (status,) = conn.execute("SELECT status FROM jobs WHERE id = ?", (batch["id"],)).fetchone()
    assert status == "in_progress"  # paused, to resume on the next start
    log = "".join(p.read_text() for p in tmp_path.glob("serve-*.log"))
    assert "POST /v1/batches 200" in log and KEY_A not in log
