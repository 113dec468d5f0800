"""Operating the server: ``GET /metrics`` (Prometheus text, a registry per app, tenants as
hashed ids), ``/health`` and ``/ready`` (503 until interrupted batches are taken back up), the
``--metrics-port`` of ``batchclient serve``, and the progress and ETA of running batches (on the
wire, kept by the openai SDK in ``model_extra``; in ``batchclient jobs status``)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batchclient import Batch, DelegatingProvider
from batchclient.cli import main
from batchclient.jobs._progress import ProgressTracker
from batchclient.remote import RemoteProvider
from batchclient.server import create_app, serve_starting, tenant_id
from batchclient.testing import Fault, StubReply, StubServer, free_port
from batchclient.types import BatchEta
from jobs_util import jsonl, line, wait_sync
from server_util import (
    KEY_A,
    KEY_B,
    finished,
    http,
    is_envelope,
    ready,
    sdk,
    served,
    spawn,
    wait_batch,
)

REFUSAL = {"error": {"message": "refused", "type": "invalid_request_error", "code": None}}


pytestmark = pytest.mark.stub(
    faults=[
        Fault(StubReply(status=400, body=REFUSAL), match="FAIL"),
        Fault(StubReply(delay_s=30), match="SLOW"),
        Fault(StubReply(delay_s=1), match="LATER"),
    ]
)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over every series whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def mixed_batch(client: Any, fast: int, slow: int = 0, failing: int = 0, later: int = 0) -> Any:
    lines = [line(f"q{i}", f"question {i}") for i in range(fast)]
    lines += [line(f"later{i}", f"LATER {i}") for i in range(later)]
    lines += [line(f"bad{i}", "FAIL please") for i in range(failing)]
    lines += [line(f"slow{i}", f"SLOW {i}") for i in range(slow)]
    upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def test_metrics_count_batches_requests_and_routes_per_tenant(
    stub: StubServer, tmp_path: Path
) -> None:
    with served(stub.url, tmp_path / "one", api_keys=[KEY_A, KEY_B]) as url:
        assert http(url, None).get("/metrics").status_code == 401  # behind the keys
        client = sdk(url, KEY_A)
        done = wait_batch(client, mixed_batch(client, fast=5, failing=1).id)
        assert done.status == "completed"
        assert http(url).get("/nowhere/at/all").status_code == 404
        answer = http(url, KEY_B).get("/metrics")
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = answer.text
        samples = scrape(text)
        a, b = tenant_id(KEY_A), tenant_id(KEY_B)
        assert value(samples, "batchclient_batches", tenant=a, status="completed") == 1
        assert value(samples, "batchclient_batches", tenant=a, status="in_progress") == 0
        assert total(samples, "batchclient_batches", tenant=b) == 0
        outcomes = {
            o: value(samples, "batchclient_batch_requests_total", tenant=a, outcome=o)
            for o in ("completed", "failed", "cached")
        }
        assert outcomes == {"completed": 5, "failed": 1, "cached": 0}
        assert value(samples, "batchclient_requests_in_flight") == 0
        assert (
            value(samples, "batchclient_request_duration_seconds_count", outcome="completed") == 5
        )
        assert value(samples, "batchclient_request_duration_seconds_count", outcome="failed") == 1
        # the stub counts one token per word: "question N" and "echo: question N"
        assert value(samples, "batchclient_tokens_total", kind="prompt") == 10
        assert value(samples, "batchclient_tokens_total", kind="completion") == 15
        route = {"method": "GET", "route": "/v1/batches/{batch_id}", "status": "200"}
        assert value(samples, "batchclient_http_requests_total", **route, tenant=a) >= 1
        assert value(samples, "batchclient_http_requests_total", method="GET",
                     route="unmatched", status="404", tenant=a) == 1  # fmt: skip
        assert total(samples, "batchclient_http_requests_total", status="401", tenant="none") == 1
        assert total(samples, "batchclient_http_request_duration_seconds_count") >= 5
        for secret in (KEY_A, KEY_B, done.id, "/nowhere"):  # no key, no raw path
            assert secret not in text
        # a second app in the same process counts for itself (a registry of its own)
        with served(stub.url, tmp_path / "two") as other:
            fresh = scrape(http(other, None).get("/metrics").text)
        assert total(fresh, "batchclient_batches") == 0
        assert total(fresh, "batchclient_http_requests_total") == 0  # the scrape counts after


def test_status_page_routes_are_counted_by_template_and_strangers_as_unmatched(
    stub: StubServer, tmp_path: Path
) -> None:
    with served(stub.url, tmp_path / "state") as url, http(url, None) as c:
        assert c.get("/").status_code == 200
        assert c.post("/signin").status_code == 303
        assert c.post("/signout").status_code == 303
        for i in range(5):  # random paths, near the page's and under a static-looking prefix
            assert c.get(f"/static/style-{i}.css").status_code == 404
            assert c.get(f"/signin/{i}").status_code in (404, 405)
            assert c.post(f"/x{i}").status_code in (404, 405)
        text = c.get("/metrics").text
    samples = scrape(text)
    routes = {
        dict(labels)["route"]
        for name, labels in samples
        if name == "batchclient_http_requests_total"
    }
    assert routes == {"/", "/signin", "/signout", "unmatched"}, routes
    assert value(samples, "batchclient_http_requests_total", method="GET", route="/",
                 status="200", tenant="none") == 1  # fmt: skip
    assert total(samples, "batchclient_http_requests_total", route="unmatched") == 15
    assert "/static" not in text and "style-" not in text


def test_a_running_batch_carries_progress_that_the_sdk_keeps(
    stub: StubServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with served(stub.url, tmp_path, max_concurrency=8) as url:
        client = sdk(url, None)
        # the rate counts what finished after the first result: two answers a second later
        batch = mixed_batch(client, fast=2, later=2, slow=12)
        wait_sync(lambda: finished(client.batches.retrieve(batch.id)) == 4, timeout=30)
        running = client.batches.retrieve(batch.id)
        assert running.status == "in_progress"
        progress = BatchEta.model_validate((running.model_extra or {})["progress"])
        assert progress.completed_fraction == 0.25
        assert progress.requests_per_s is not None and progress.requests_per_s > 0
        assert progress.eta_s == pytest.approx(12 / progress.requests_per_s)
        # batchclient jobs status, another reader of the same state directory
        assert main(["jobs", "status", batch.id, "--state-dir", str(tmp_path)]) == 0
        out = capsys.readouterr()
        assert Batch.model_validate_json(out.out).progress is not None
        assert f"{batch.id}: 25.0 % done, " in out.err and "requests/s, about " in out.err
        cancelled = client.batches.cancel(batch.id)
        assert cancelled.status == "cancelled" and "progress" not in (cancelled.model_extra or {})
        assert "progress" not in http(url, None).get(f"/v1/batches/{batch.id}").json()


def observed(done: int, total: int, status: str = "in_progress", started: int = 1000) -> Batch:
    return Batch.model_validate(
        {"id": "batch_x", "input_file_id": "file_x", "status": status, "created_at": started,
         "in_progress_at": started,
         "request_counts": {"total": total, "completed": done, "failed": 0}}
    )  # fmt: skip


def test_the_eta_starts_from_the_average_and_is_smoothed_in_time() -> None:
    tracker = ProgressTracker()
    first = tracker.annotate(observed(100, 1000), now=1100.0).progress  # 100 lines in 100 s
    assert first == BatchEta(completed_fraction=0.1, requests_per_s=1.0, eta_s=900.0)
    w_first = 1 - math.exp(-100 / 30)  # the span's weight
    # 0.5 s later (not kept): that half second counts for its share, a small one
    again = tracker.annotate(observed(101, 1000), now=1100.5).progress
    w_half = 1 - math.exp(-0.5 / 30)
    expected = (w_half * 2 + (1 - w_half) * w_first) / (w_half + (1 - w_half) * w_first)
    assert again is not None and again.requests_per_s == pytest.approx(expected)
    assert 1.0 < expected < 1.02  # a poll right after another moves the figure little
    # 30 s (one time constant) at 11 lines/s: the rate moves 63 % of the way
    later = tracker.annotate(observed(430, 1000), now=1130.0).progress
    w_30 = 1 - math.exp(-1)
    expected = (w_30 * 11 + (1 - w_30) * w_first) / (w_30 + (1 - w_30) * w_first)
    assert later is not None and later.requests_per_s == pytest.approx(expected)
    assert 1 + 10 * 0.63 < expected < 1 + 10 * 0.65
    rate = later.requests_per_s or 0.0
    assert later.eta_s == pytest.approx(570 / rate)
    ending = tracker.annotate(observed(1000, 1000, "finalizing"), now=1140.0).progress
    assert ending is not None and (ending.completed_fraction, ending.eta_s) == (1.0, 0.0)
    assert tracker.annotate(observed(1000, 1000, "completed"), now=1141.0).progress is None
    assert tracker.annotate(observed(0, 0), now=1142.0).progress is None  # lines not yet known
    idle = tracker.annotate(observed(0, 10), now=1143.0).progress
    assert idle == BatchEta(completed_fraction=0.0)  # nothing finished: no rate, no ETA
    first_lines = tracker.annotate(observed(2, 10), now=1143.2).progress  # at once: the average
    assert first_lines is not None and first_lines.requests_per_s == pytest.approx(2 / 143.2)
    assert first_lines.eta_s == pytest.approx(8 * 143.2 / 2)


def test_young_batches_average_since_the_runs_first_result() -> None:
    """In the process that runs a batch, the rate starts at its first committed result
    (``origin``), not at the whole-second ``in_progress_at``; later looks within the first
    seconds average over the whole span instead of keeping the first look's figure."""
    tracker = ProgressTracker()
    origin = (1000.9, 4)  # the first 4 lines committed 0.9 s into the second it started in
    first = tracker.annotate(observed(8, 240), now=1001.0, origin=origin).progress
    assert first is not None and first.requests_per_s == pytest.approx(40.0)
    # the second look (0.9 s later, not kept) averages over both spans: 40 lines/s throughout
    second = tracker.annotate(observed(44, 240), now=1001.9, origin=origin).progress
    assert second is not None and second.requests_per_s == pytest.approx(40.0, rel=1e-3)
    assert second.eta_s == pytest.approx(196 / 40, rel=1e-3)
    # without the origin: from in_progress_at (1000), start-up included
    other = ProgressTracker().annotate(observed(44, 240), now=1001.9).progress
    assert other is not None and other.requests_per_s == pytest.approx(44 / 1.9)
    # a run started again in this process starts over from its own first result
    again = tracker.annotate(observed(50, 240), now=1100.0, origin=(1099.0, 46)).progress
    assert again is not None and again.requests_per_s == pytest.approx(4.0)


class Gated(DelegatingProvider):
    """A provider whose start waits for ``gate`` (an engine loading)."""

    def __init__(self, inner: RemoteProvider, gate: asyncio.Event) -> None:
        super().__init__(inner)
        self.gate = gate

    async def start(self) -> None:
        await self.inner.start()
        await self.gate.wait()


async def test_ready_answers_503_until_the_interrupted_batch_is_taken_back_up(
    stub: StubServer, tmp_path: Path
) -> None:
    import uvicorn

    with served(stub.url, tmp_path) as url:  # a batch interrupted by the server's stop
        client = sdk(url, None)
        batch = mixed_batch(client, fast=2, slow=2)
        wait_sync(lambda: finished(client.batches.retrieve(batch.id)) == 2, timeout=30)
    gate = asyncio.Event()
    app = create_app(Gated(RemoteProvider(stub.url, max_concurrency=64), gate), state_dir=tmp_path)

    class Server(uvicorn.Server):
        def capture_signals(self) -> Any:
            return contextlib.nullcontext()

    server = Server(uvicorn.Config(app, port=0, lifespan="off", log_config=None))
    serving = asyncio.ensure_future(serve_starting(app, server))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            assert (await c.get("/health")).status_code == 200
            starting = await c.get("/ready")
            assert (starting.status_code, starting.json()) == (503, {"status": "starting"})
            held = await c.get("/v1/models")
            assert held.status_code == 503 and held.headers["retry-after"] == "1"
            assert held.json()["error"]["code"] == "server_starting"
            gate.set()
            deadline = time.monotonic() + 10
            while (await c.get("/ready")).status_code != 200:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert app.state.tenants.tenants[0].client.batches.recovered == (batch.id,)
            samples = scrape((await c.get("/metrics")).text)
            assert value(samples, "batchclient_recovered_batches_total", tenant="default") == 1
            assert (await c.get(f"/v1/batches/{batch.id}")).json()["status"] == "in_progress"
    finally:
        gate.set()
        server.should_exit = True
        await serving


@pytest.mark.slow
def test_serve_metrics_port_answers_without_a_key_on_loopback(
    stub: StubServer, tmp_path: Path
) -> None:
    port, metrics_port = free_port(), free_port()
    proc = spawn(stub.url, tmp_path / "state", port, "--metrics-port", str(metrics_port))
    try:
        url = f"http://127.0.0.1:{port}"
        ready(url, proc)
        assert httpx.get(f"{url}/ready").json() == {"status": "ready"}  # no key needed
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/metrics").status_code == 401
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert value(scrape(text), "batchclient_batches", tenant=tenant_id(KEY_A),
                     status="completed") == 0  # fmt: skip
        assert httpx.get(f"http://127.0.0.1:{metrics_port}/v1/models").status_code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def _exchange(port: int, data: bytes) -> bytes:
    """``data`` sent in one piece on a fresh connection; all the server answers until it
    closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        out = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                out += chunk
        return out


@pytest.mark.slow
def test_serve_metrics_port_has_the_host_list_and_limits_of_the_main_port(
    stub: StubServer, tmp_path: Path
) -> None:
    port, metrics_port = free_port(), free_port()
    limits = ("--header-timeout", "5", "--max-connections", "3", "--allowed-host", "api.example")
    proc = spawn(stub.url, tmp_path / "state", port, "--metrics-port", str(metrics_port), *limits)
    try:
        ready(f"http://127.0.0.1:{port}", proc)
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        for host in ("evil.example", f"evil.example:{metrics_port}"):  # DNS rebinding
            r = httpx.get(metrics, headers={"Host": host})
            assert r.status_code == 421 and is_envelope(r)["code"] == "host_not_allowed"
            assert "batchclient_" not in r.text
        for host in ("localhost", f"127.0.0.1:{metrics_port}", "api.example"):
            assert httpx.get(metrics, headers={"Host": host}).status_code == 200
        get = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        big = _exchange(metrics_port, get + b"X-Pad: " + b"p" * 20_000 + b"\r\n\r\n")
        assert big.startswith(b"HTTP/1.1 400") and b"invalid_http_request" in big, big[:300]
        # the connection cap: a fourth connection evicts the longest idle one
        idle = [socket.create_connection(("127.0.0.1", metrics_port)) for _ in range(3)]
        time.sleep(0.2)
        assert _exchange(metrics_port, get + b"\r\n").startswith(b"HTTP/1.1 200")
        idle[0].settimeout(2.5)
        assert idle[0].recv(1) == b""  # long before the header timeout
        # the header timeout: a connection that sends nothing is closed
        for sock in idle[1:]:
            sock.settimeout(30)
            started = time.monotonic()
            assert sock.recv(1) == b""
            assert time.monotonic() - started < 20
        for sock in idle:
            sock.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.mark.slow
def test_serve_stops_cleanly_when_its_metrics_port_is_taken(tmp_path: Path) -> None:
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = str(taken.getsockname()[1])
        args = ["serve", "--base-url", "http://127.0.0.1:9/v1", "--state-dir", str(tmp_path),
                "--port", str(free_port()), "--metrics-port", busy]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "batchclient.cli", *args], capture_output=True, text=True,
            timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
        )  # fmt: skip
    assert done.returncode == 3, done.stderr  # uvicorn's start-up failure
    assert "address already in use" in done.stderr and "Traceback" not in done.stderr
    assert "stopped: running batches paused" in done.stderr  # the app's own clean exit


def test_request_durations_fall_in_prometheus_le_buckets() -> None:
    from batchclient.server._metrics import Metrics

    metrics = Metrics()
    for seconds in (0.05, 0.07, 1000.0):
        metrics.requests.observe("completed", seconds)
    metrics.requests.observe("failed", 0.2)
    samples = scrape(generate_latest(metrics.registry).decode())
    bucket = "batchclient_request_duration_seconds_bucket"
    assert value(samples, bucket, le="0.05", outcome="completed") == 1  # le: at most
    assert value(samples, bucket, le="0.1", outcome="completed") == 2
    assert value(samples, bucket, le="600.0", outcome="completed") == 2
    assert value(samples, bucket, le="+Inf", outcome="completed") == 3
    assert value(samples, bucket, le="0.25", outcome="failed") == 1
    total_s = value(samples, "batchclient_request_duration_seconds_sum", outcome="completed")
    assert total_s == pytest.approx(1000.12)
