"""Webhooks of ``batchclient serve``: one signed event per batch that ends, in OpenAI's shape,
verified by the openai SDK's own Standard Webhooks verifier on a real loopback receiver;
retried after a failed attempt with the same ``webhook-id``; and delivered after the server is
SIGKILLed between the batch's end and the delivery."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest

from batchclient import RemoteBatchInference
from batchclient.cli import main
from batchclient.errors import ConfigurationError
from batchclient.jobs._runner import WriteRetry
from batchclient.remote import RemoteProvider
from batchclient.server import _webhooks, create_app, tenant_id
from batchclient.server._webhooks import Outbox, Webhook, sign
from batchclient.testing import Fault, StubReply, StubServer, free_port
from jobs_util import FAST, jsonl, line, output_folder_blocked, wait_sync
from server_util import KEY_A, batch_file, ready, sdk, served, spawn, wait_batch

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes
    path: str = "/hooks"
    at: float = field(default_factory=time.monotonic)  # when the receiver had it


@dataclass
class Receiver:
    """A loopback webhook receiver. ``script``: what each next POST gets (``"fail"``: a 500,
    ``"hang"``: no answer until :attr:`release` is set, ``"redirect"``: a 307 to
    ``/elsewhere`` on this receiver, ``"flood"``: a 200 with an endless chunked body,
    ``"garbage"``: an answer that is not HTTP); then 200."""

    script: list[str] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""
    flooded: int = 0  # bytes of "flood" answers sent before the client hung up

    def events(self) -> dict[str, Any]:
        """The verified events by ``webhook-id`` (the receiver's deduplication)."""
        verifier = openai.OpenAI(api_key="none")
        unique: dict[str, Any] = {}
        for d in self.deliveries:
            event = verifier.webhooks.unwrap(d.body, d.headers, secret=SECRET)  # raises if forged
            assert d.headers["webhook-id"] == event.id
            unique.setdefault(event.id, event)
        return unique


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            path = self.path.split("?", 1)[0]
            state.deliveries.append(Delivery(dict(self.headers.items()), body, path))
            action = state.script.pop(0) if state.script else "ok"
            if action == "hang":
                state.release.wait(30)
            if action == "garbage":
                self.wfile.write(b"garbage\r\n\r\n")
                self.close_connection = True
                return
            if action == "flood":
                self.flood()
                return
            status = {"fail": 500, "redirect": 307}.get(action, 200)
            self.send_response(status)
            if status == 307:
                self.send_header("location", "/elsewhere")
            self.send_header("content-length", "0")
            self.end_headers()

        def flood(self) -> None:
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            chunk = b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20))
            self.close_connection = True
            try:
                while state.flooded < 8 << 30 and not state.release.is_set():
                    self.wfile.write(chunk)
                    state.flooded += 1 << 20
            except OSError:  # the client closed the connection
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks?token=abc"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


def test_logs_show_a_webhook_url_without_its_path_or_query() -> None:
    # Slack's and Discord's webhook URLs carry their token in the path
    hook = Webhook.parse("https://hooks.example.com:8443/services/T0/B0/s3cr3t?sig=x", SECRET)
    assert hook.shown == "https://hooks.example.com:8443/…"
    assert "s3cr3t" not in repr(hook) and Webhook.parse("http://h", SECRET).shown == "http://h"


def test_signature_is_the_standard_webhooks_recipe() -> None:
    # the example of the Standard Webhooks specification (its test vector)
    key = base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    got = sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert got == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.mark.parametrize(
    ("url", "secret", "message"),
    [
        ("ftp://127.0.0.1/x", SECRET, "http:// or https://"),
        ("http:///nohost", SECRET, "with a host"),
        ("http://h:99999/x", SECRET, "not a valid URL .Port out of range"),
        ("http://h:abc/x", SECRET, "not a valid URL"),
        ("http://[::1/x", SECRET, "not a valid URL .Invalid IPv6 URL"),
        ("http://h/a b", SECRET, "spaces or control characters"),
        ("http://h/a\nb", SECRET, "spaces or control characters"),
        ("http://127.0.0.1/x", "plain-secret-0123456789abcdef", "start with 'whsec_'"),
        ("http://127.0.0.1/x", "whsec_not*base64!", "must be base64"),
        ("http://127.0.0.1/x", "whsec_" + base64.b64encode(b"short").decode(), "24 to 64"),
        ("http://127.0.0.1/x", None, "go together"),
    ],
)
def test_webhook_url_and_secret_are_checked(url: str, secret: str | None, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        create_app(
            RemoteProvider("http://127.0.0.1:9/v1"),
            webhook_url=url,
            webhook_secret=secret,
        )
    if secret:
        assert secret not in str(caught.value) and secret[6:] not in str(caught.value)
    assert SECRET[6:] not in repr(Webhook.parse("http://h/x", SECRET))


def test_serve_refuses_a_bad_webhook_secret_or_url(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHCLIENT_WEBHOOK_SECRET", "whsec_!!")
    args = ["serve", "--base-url", "http://127.0.0.1:9/v1", "--port", "0"]
    assert main([*args, "--webhook-url", "http://127.0.0.1:9/x"]) == 2
    err = capsys.readouterr().err
    assert "must be base64" in err and "whsec_!!" not in err
    monkeypatch.setenv("BATCHCLIENT_WEBHOOK_SECRET", SECRET)
    assert main([*args, "--webhook-url", "http://h:99999/s3cr3t"]) == 2  # one line, no traceback
    err = capsys.readouterr().err
    assert "Port out of range" in err and "Traceback" not in err and "s3cr3t" not in err


def test_each_ending_posts_one_signed_event_retried_with_the_same_id(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_webhooks, "POLL_S", 0.05)
    monkeypatch.setattr(_webhooks, "BASE_DELAY_S", 0.05)
    receiver.script = ["fail"]  # the first attempt gets a 500: retried
    faults = [Fault(StubReply(delay_s=30), match="SLOW")]
    with (
        StubServer(faults=faults) as stub,
        served(stub.url, tmp_path / "state", webhook_url=receiver.url, webhook_secret=SECRET)
        as url,
    ):  # fmt: skip
        client = sdk(url, None)

        def start(content: bytes, window: str = "24h") -> str:
            upload = client.files.create(file=("in.jsonl", content), purpose="batch")
            batch = client.batches.create(
                input_file_id=upload.id,
                endpoint="/v1/chat/completions",
                completion_window=window,  # type: ignore[arg-type]
            )
            return batch.id

        done = start(batch_file(3))
        failed = start(jsonl([line("a", "1"), line("a", "2")]))  # duplicate custom_id
        slow = start(batch_file(2, "SLOW"))
        late = start(batch_file(2, "SLOW"), "1s")  # past its window: expired
        assert wait_batch(client, done).status == "completed"
        assert wait_batch(client, failed).status == "failed"
        client.batches.cancel(slow)
        assert wait_batch(client, slow).status == "cancelled"
        assert wait_batch(client, late).status == "expired"
        wait_sync(lambda: len(receiver.events()) == 4, timeout=20)
    events = receiver.events()
    by_batch = {e.data.id: e for e in events.values()}
    assert {k: e.type for k, e in by_batch.items()} == {
        done: "batch.completed",
        failed: "batch.failed",
        slow: "batch.cancelled",
        late: "batch.expired",
    }
    first = receiver.deliveries[0]
    assert json.loads(first.body).keys() == {"id", "object", "created_at", "type", "data"}
    assert json.loads(first.body)["object"] == "event"
    # the 500 was retried with the same webhook-id and body; nothing else was sent twice
    ids = [d.headers["webhook-id"] for d in receiver.deliveries]
    assert len(ids) == 5 and ids.count(ids[0]) == 2 and len(set(ids)) == 4
    assert receiver.deliveries[0].body == next(
        d.body for d in receiver.deliveries[1:] if d.headers["webhook-id"] == ids[0]
    )
    # forged: a verifier with another secret refuses it
    other = "whsec_" + base64.b64encode(bytes(32)).decode()
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai.OpenAI(api_key="none").webhooks.unwrap(first.body, first.headers, secret=other)
    db = tmp_path / "state" / "batchclient.sqlite3"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT attempts, delivered_at IS NOT NULL FROM webhook_events")
        assert sorted(rows.fetchall()) == [(1, 1), (1, 1), (1, 1), (2, 1)]
    stored = b"".join(p.read_bytes() for p in db.parent.glob("batchclient.sqlite3*"))
    assert SECRET[6:].encode() not in stored and bytes(range(32)) not in stored


@contextmanager
def hooked(receiver: Receiver, state: Path) -> Iterator[str]:
    """A served app over the chat stub whose webhook goes to ``receiver``; yields its URL."""
    with (
        StubServer() as stub,
        served(stub.url, state, webhook_url=receiver.url, webhook_secret=SECRET) as url,
    ):
        yield url


def end_one_batch(url: str, lines: int = 1) -> None:
    """A batch of ``lines`` lines through the served app, waited until it completed."""
    client = sdk(url, None)
    upload = client.files.create(file=("in.jsonl", batch_file(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert wait_batch(client, batch.id).status == "completed"


def delivered_event(state: Path) -> tuple[int, str | None]:
    """The outbox's one event once delivered: its attempts and ``last_error``."""
    with sqlite3.connect(state / "batchclient.sqlite3") as conn:
        wait_sync(
            lambda: conn.execute("SELECT delivered_at FROM webhook_events").fetchone()[0],
            timeout=20,
        )
        attempts, error = conn.execute("SELECT attempts, last_error FROM webhook_events").fetchone()
    return int(attempts), error


def test_a_redirect_is_a_failed_attempt_never_followed(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver's 3xx must not send the signed event to another URL (which a compromised or
    misconfigured receiver could point anywhere): it is retried at the configured URL."""
    monkeypatch.setattr(_webhooks, "POLL_S", 0.05)
    monkeypatch.setattr(_webhooks, "BASE_DELAY_S", 0.05)
    receiver.script = ["redirect"]
    state = tmp_path / "state"
    with hooked(receiver, state) as url:
        end_one_batch(url, 2)
        attempts, _ = delivered_event(state)
    assert [d.path for d in receiver.deliveries] == ["/hooks", "/hooks"]
    assert attempts == 2 and len(receiver.events()) == 1


def test_an_endless_answer_is_read_no_further_than_the_cap(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 200 whose body never ends is a delivery: the deliverer reads the first 64 KiB and
    hangs up, instead of reading (and holding) gigabytes until its timeout."""
    monkeypatch.setattr(_webhooks, "POLL_S", 0.05)
    receiver.script = ["flood"]
    state = tmp_path / "state"
    with hooked(receiver, state) as url:
        end_one_batch(url)
        row = delivered_event(state)
    assert row == (1, None) and len(receiver.deliveries) == 1
    # what the receiver could write before the hang-up: the cap plus the sockets' buffers
    assert receiver.flooded < 64 << 20, receiver.flooded


def test_an_error_that_quotes_the_url_is_logged_and_stored_without_its_token(
    receiver: Receiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiohttp's error for an answer that is not HTTP quotes the whole URL, query and all."""
    monkeypatch.setattr(_webhooks, "POLL_S", 0.05)
    monkeypatch.setattr(_webhooks, "BASE_DELAY_S", 0.05)
    receiver.script = ["garbage", "hang"]  # the second attempt waits while the test looks
    state = tmp_path / "state"
    with (
        caplog.at_level("WARNING", logger="batchclient.server.webhooks"),
        hooked(receiver, state) as url,
    ):
        end_one_batch(url)
        wait_sync(lambda: len(receiver.deliveries) == 2, timeout=20)
        with sqlite3.connect(state / "batchclient.sqlite3") as conn:
            (stored,) = conn.execute("SELECT last_error FROM webhook_events").fetchone()
        receiver.release.set()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert stored.startswith("ClientResponseError") and "/…" in stored, stored
    assert "ClientResponseError" in logged
    for text in (stored, logged):
        assert "token=abc" not in text and "/hooks" not in text, text


def test_a_receiver_slow_to_answer_one_event_does_not_hold_the_next(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first event's answer hangs (30 s, the receiver's limit, inside the deliverer's
    timeout, raised here to 60 s); the next event is delivered meanwhile (one delivery at a
    time held it until the first was answered)."""
    monkeypatch.setattr(_webhooks, "POLL_S", 0.05)
    monkeypatch.setattr(_webhooks, "Deliverer", partial(_webhooks.Deliverer, timeout_s=60.0))
    receiver.script = ["hang"]
    state = tmp_path / "state"
    with hooked(receiver, state) as url:
        end_one_batch(url)
        wait_sync(lambda: len(receiver.deliveries) == 1, timeout=20)
        end_one_batch(url)
        wait_sync(lambda: len(receiver.deliveries) == 2, timeout=25)
        first, second = receiver.deliveries
        assert second.at - first.at < 25  # while the first still hung

        def delivered() -> list[Any]:
            # the answer is recorded a moment after the receiver has the request
            with sqlite3.connect(state / "batchclient.sqlite3") as conn:
                query = "SELECT delivered_at IS NOT NULL FROM webhook_events"
                return sorted(conn.execute(query).fetchall())

        wait_sync(lambda: delivered() == [(0,), (1,)], timeout=20)
        rows = delivered()
        receiver.release.set()
    assert rows == [(0,), (1,)]


async def test_a_resumed_batch_sends_the_event_of_each_state_it_ends_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that failed (its output folder could not be written) and then completed once
    resumed queues ``batch.failed`` and then ``batch.completed`` (one event per batch held
    the second back)."""
    monkeypatch.setattr("batchclient.jobs._runner.WRITE_RETRY", WriteRetry(3, 0.01, 0.02))
    state = tmp_path / "state"
    outbox = Outbox(state)  # a server with a webhook opened this state directory
    files = state / "files"
    try:
        with StubServer(latency_s=0.2) as stub:
            async with RemoteBatchInference(stub.url, state_dir=state, **FAST) as client:
                record = await client.files.create(batch_file(4))
                batch = await client.batches.create(record.id)
                async with output_folder_blocked(stub, files):
                    with anyio.fail_after(30):
                        failed = await client.batches.wait(batch.id)
                await client.batches.resume(batch.id)
                with anyio.fail_after(30):
                    done = await client.batches.wait(batch.id)
        rows = outbox.db.all("SELECT batch_id, type FROM webhook_events ORDER BY rowid")
    finally:
        outbox.close()
    assert (failed.status, done.status) == ("failed", "completed")
    assert [tuple(r) for r in rows] == [(batch.id, "batch.failed"), (batch.id, "batch.completed")]


def test_an_outbox_of_one_event_per_batch_is_migrated_keeping_its_events(tmp_path: Path) -> None:
    """A state directory whose outbox is at version 1 (one event per batch): opened, it keeps
    its events and queues the next state's event of the same batch."""
    from batchclient._state import Migration, Schema
    from batchclient.jobs._store import Store

    store = Store(tmp_path)
    store.db.migrate(Schema("webhooks", (Migration(1, _webhooks._create),)))
    store.db.write(
        "INSERT INTO webhook_events (id, batch_id, type, created_at, delivered_at) "
        "VALUES ('evt_1', 'batch_1', 'batch.failed', 1, 2)"
    )
    store.close()
    outbox = Outbox(tmp_path)
    try:
        outbox.db.write(
            "INSERT INTO webhook_events (id, batch_id, type, created_at) "
            "VALUES ('evt_2', 'batch_1', 'batch.completed', 3)"
        )
        rows = outbox.db.all("SELECT id, type, delivered_at FROM webhook_events ORDER BY id")
        triggers = outbox.db.all("SELECT name FROM sqlite_master WHERE type = 'trigger'")
    finally:
        outbox.close()
    assert [tuple(r) for r in rows] == [
        ("evt_1", "batch.failed", 2),
        ("evt_2", "batch.completed", None),
    ]
    assert {r[0] for r in triggers} >= {"webhook_on_terminal", "webhook_on_terminal_insert"}


def test_redaction_cuts_the_path_and_query_wherever_they_appear() -> None:
    hook = Webhook.parse("https://h.example:8443/services/T0/s3cr3t?sig=x", SECRET)
    quoted = "400, message='Bad status line', url='https://h.example:8443/services/T0/s3cr3t?sig=x'"
    assert hook.redact(quoted) == "400, message='Bad status line', url='https://h.example:8443/…'"
    assert "s3cr3t" not in hook.redact("POST /services/T0/s3cr3t?sig=x failed")
    assert "sig=x" not in hook.redact("query sig=x")
    assert Webhook.parse("http://h/", SECRET).redact("GET / ok") == "GET / ok"


@pytest.mark.slow
def test_an_event_survives_sigkill_between_the_end_and_the_delivery(
    receiver: Receiver, tmp_path: Path
) -> None:
    receiver.script = ["hang"]  # the first POST is received, never answered: the kill comes
    state, port = tmp_path / "state", free_port()
    url = f"http://127.0.0.1:{port}"
    hooks = ("--webhook-url", receiver.url, "--webhook-secret", SECRET)
    with StubServer() as stub:
        proc = spawn(stub.url, state, port, *hooks)
        try:
            ready(url, proc)
            client = sdk(url)
            upload = client.files.create(file=("in.jsonl", batch_file(5)), purpose="batch")
            batch = client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            wait_sync(lambda: receiver.deliveries, timeout=30)  # ended, its event in flight
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            db = state / "tenants" / tenant_id(KEY_A) / "batchclient.sqlite3"
            with sqlite3.connect(db) as conn:
                (pending,) = conn.execute(
                    "SELECT count(*) FROM webhook_events WHERE delivered_at IS NULL"
                ).fetchone()
            receiver.release.set()
            proc = spawn(stub.url, state, port, *hooks)
            ready(url, proc)
            wait_sync(lambda: len(receiver.deliveries) >= 2, timeout=30)
            with sqlite3.connect(db) as conn:
                wait_sync(
                    lambda: conn.execute(
                        "SELECT delivered_at FROM webhook_events WHERE batch_id = ?", (batch.id,)
                    ).fetchone()[0],
                    timeout=10,
                )
        finally:
            proc.kill()
            proc.wait()
    events = receiver.events()
    # figures: POSTs received, events after deduplication by webhook-id, duplicates left
    print(f"posts={len(receiver.deliveries)} events={len(events)} duplicates=0")
    assert pending == 1 and len(receiver.deliveries) == 2 and len(events) == 1
    log = "".join(p.read_text() for p in tmp_path.glob("serve-*.log"))
    assert "webhooks to http://127.0.0.1:" in log and "delivered" in log
    assert SECRET[6:] not in log and "token=abc" not in log  # no secret, no query
    (event,) = events.values()
    assert event.type == "batch.completed" and event.data.id == batch.id


def docs_recipe() -> str:
    """The receiver's recipe of docs/server.md ("Webhooks"): its Python block that unwraps."""
    text = (Path(__file__).parents[2] / "docs" / "server.md").read_text()
    blocks: list[str] = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    (recipe,) = [b for b in blocks if "webhooks.unwrap" in b or ".unwrap(" in b]
    return recipe


def run_recipe(delivery: Delivery, secret: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The docs' recipe as a receiver would run it: in its own process, with the delivery's
    raw body and headers, and no OpenAI key or webhook secret in the environment."""
    given = tmp_path / "delivery.json"
    given.write_text(json.dumps({"body": delivery.body.decode(), "headers": delivery.headers}))
    prelude = (
        "import json, sys\n"
        "given = json.load(open(sys.argv[1]))\n"
        "body, headers, secret = given['body'].encode(), given['headers'], sys.argv[2]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return subprocess.run(
        [sys.executable, "-c", prelude + docs_recipe(), str(given), secret],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_the_docs_recipe_verifies_a_real_delivery_without_an_openai_key(
    receiver: Receiver, tmp_path: Path
) -> None:
    """``batchclient serve`` delivers a signed event; the receiver's recipe of docs/server.md
    verifies and reads it with the openai SDK where ``OPENAI_API_KEY`` is not set (the recipe's
    ``openai.OpenAI()`` raised "Missing credentials"), and refuses a forged one."""
    state, port = tmp_path / "state", free_port()
    url = f"http://127.0.0.1:{port}"
    with StubServer() as stub:
        proc = spawn(
            stub.url, state, port, "--webhook-url", receiver.url, "--webhook-secret", SECRET
        )
        try:
            ready(url, proc)
            client = sdk(url)
            upload = client.files.create(file=("in.jsonl", batch_file(3)), purpose="batch")
            batch = client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            wait_sync(lambda: receiver.deliveries, timeout=30)
        finally:
            proc.kill()
            proc.wait()
    (delivery,) = receiver.deliveries
    verified = run_recipe(delivery, SECRET, tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout == f"{batch.id} completed\n"
    forged = Delivery(delivery.headers, delivery.body.replace(b"completed", b"cancelled"))
    refused = run_recipe(forged, SECRET, tmp_path)
    assert refused.returncode != 0 and "InvalidWebhookSignatureError" in refused.stderr
