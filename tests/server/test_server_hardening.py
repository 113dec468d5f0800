"""``batchclient serve`` against browsers, strangers and slow clients, over real loopback
sockets: JSON only as ``application/json``, a ``Host`` allow-list, CORS closed unless
configured, bounded multipart bodies, header / body / idle timeouts and a connection cap,
clipped echoes, no server paths in messages, relative redirects, private state folders."""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import stat
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchclient.jobs._runner import WriteRetry
from batchclient.remote import RemoteProvider
from batchclient.server import create_app, http_protocol, tenant_id, uvicorn_options
from batchclient.testing import AppServer, StubServer, free_port
from server_util import (
    BOUNDARY,
    KEY_A,
    MULTIPART,
    batch_file,
    http,
    is_envelope,
    multipart,
    ready,
    sdk,
    spawn,
    wait_batch,
)

JSON = {"Content-Type": "application/json"}
SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


pytestmark = pytest.mark.stub(latency_s=0.05)


def serve(
    stub: StubServer, state: Path, limits: dict[str, Any] | None = None, **options: Any
) -> AppServer:
    app = create_app(RemoteProvider(stub.url), state_dir=state, **options)
    return AppServer(app, **(limits or {}))


def raw(port: int, *pieces: bytes, wait: float = 5.0) -> bytes:
    """Send ``pieces`` on a fresh connection, stopping as soon as the server answers (it may
    refuse a body before its end); everything it answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        for piece in pieces:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(piece)
            except OSError:
                break
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out


def answer_of(sock: socket.socket) -> bytes:
    """One whole answer (with ``Content-Length``) read from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")).split(
            b":"
        )[1]
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def closed_within(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closes ``sock`` (it sends nothing first); fails past ``limit``."""
    sock.settimeout(limit)
    started = time.monotonic()
    assert sock.recv(1) == b""
    return time.monotonic() - started


# ---------------------------------------------------------------- browsers


def test_json_routes_take_only_application_json(stub: StubServer, tmp_path: Path) -> None:
    """A page can post ``text/plain`` anywhere without a preflight: it must not reach the
    upstream through a server without keys."""
    with serve(stub, tmp_path / "state") as url, httpx.Client(base_url=url) as client:
        before = stub.stats.requests
        for kind in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": kind} if kind else {}
            r = client.post(
                "/v1/chat/completions", content=json.dumps(CHAT).encode(), headers=headers
            )
            assert r.status_code == 415, r.text
            assert is_envelope(r)["code"] == "unsupported_media_type"
        r = client.post(
            "/v1/batches", content=b'{"input_file_id": "x"}', headers={"Content-Type": "text/plain"}
        )
        assert r.status_code == 415
        assert stub.stats.requests == before  # nothing went upstream
        ok = client.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        assert ok.status_code == 200 and stub.stats.requests == before + 1


def test_only_allowed_host_names_are_answered(stub: StubServer, tmp_path: Path) -> None:
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends ``Host: evil.example``."""
    with serve(stub, tmp_path / "state", allowed_hosts=["api.example", ".corp.example"]) as url:
        port = int(url.rsplit(":", 1)[1])
        client = sdk(url, key=None)
        record = client.files.create(file=("in.jsonl", batch_file(1)), purpose="batch")
        with httpx.Client(base_url=url) as c:
            for host in (
                "evil.example",
                f"evil.example:{port}",
                "127.0.0.2",
                "api.example.evil",
                "corp.example.evil",
            ):
                r = c.delete(f"/v1/files/{record.id}", headers={"Host": host})
                assert r.status_code == 421, (host, r.text)
                assert is_envelope(r)["code"] == "host_not_allowed"
            r = c.get("/v1/files", headers={"Host": "x" * 5000})
            assert r.status_code == 421 and len(r.content) < 1000
            good = ["localhost", f"localhost:{port}", f"[::1]:{port}", "app.localhost",
                    "127.0.0.1", "API.example:443", "corp.example", "a.b.corp.example"]  # fmt: skip
            for host in good:
                r = c.get(f"/v1/files/{record.id}", headers={"Host": host})
                assert r.status_code == 200, (host, r.text)
        assert client.files.retrieve(record.id).id == record.id  # the 421s deleted nothing


def test_cors_is_closed_unless_configured(stub: StubServer, tmp_path: Path) -> None:
    preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}  # fmt: skip
    upload = multipart({"purpose": "batch", "file": batch_file(1)})
    with serve(stub, tmp_path / "a") as url, httpx.Client(base_url=url) as c:
        for r in (
            c.options("/v1/chat/completions", headers=preflight),
            c.get("/v1/files", headers={"Origin": "http://evil.example"}),
        ):
            assert not [h for h in r.headers if h.lower().startswith("access-control-")], r.headers
        # a form post from another page needs no preflight: refused, and nothing stored
        r = c.post(
            "/v1/files", content=upload, headers={**MULTIPART, "Origin": "http://evil.example"}
        )
        assert r.status_code == 403 and is_envelope(r)["code"] == "origin_not_allowed"
        assert c.get("/v1/files").json()["data"] == []
        own = c.post("/v1/files", content=upload, headers={**MULTIPART, "Origin": url})
        assert own.status_code == 200  # a page served from this very origin
    app_origin = "https://app.example"
    with (
        serve(stub, tmp_path / "b", cors_origins=[app_origin]) as url,
        httpx.Client(base_url=url) as c,
    ):
        r = c.options("/v1/chat/completions", headers={**preflight, "Origin": app_origin})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app_origin
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Origin": app_origin})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app_origin
        r = c.options("/v1/chat/completions", headers=preflight)
        assert "access-control-allow-origin" not in r.headers


# ---------------------------------------------------------------- bounded bodies


def _chunked_upload(port: int, parts: list[bytes]) -> bytes:
    head = (
        b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Transfer-Encoding: chunked\r\nContent-Type: multipart/form-data; boundary="
        + BOUNDARY.encode() + b"\r\n\r\n"
    )  # fmt: skip
    chunks = [b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p]
    return raw(port, head, *chunks, b"0\r\n\r\n")


def _field(name: str, value: bytes, headers: bytes = b"") -> bytes:
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n".encode()
            + headers + b"\r\n" + value + b"\r\n")  # fmt: skip


def test_multipart_bodies_are_bounded_whatever_the_framing(
    stub: StubServer, tmp_path: Path
) -> None:
    end = f"--{BOUNDARY}--\r\n".encode()
    with serve(stub, tmp_path / "state", max_upload_bytes=1000) as url:
        port = int(url.rsplit(":", 1)[1])
        many = _chunked_upload(port, [_field(f"f{i}", b"v") for i in range(17)] + [end])
        assert many.startswith(b"HTTP/1.1 400") and b"more than 16 fields" in many
        big = _chunked_upload(port, [_field(f"f{i}", b"v" * 30_000) for i in range(3)] + [end])
        assert big.startswith(b"HTTP/1.1 413") and b"request_too_large" in big
        header = _chunked_upload(
            port, [_field("purpose", b"batch", b"X-Pad: " + b"p" * 9000 + b"\r\n"), end]
        )
        assert header.startswith(b"HTTP/1.1 400") and b"header" in header.split(b"\r\n\r\n")[1]
        # 600 KB after the closing boundary: the parser skips it, the total cap (the file's
        # cap plus 256 KiB) refuses it
        junk = _chunked_upload(port, [_field("purpose", b"batch"), end] + [b"j" * 60_000] * 10)
        assert junk.startswith(b"HTTP/1.1 413"), junk[:200]
        with httpx.Client(base_url=url) as c:
            assert c.get("/v1/files").json()["data"] == []
        ok = sdk(url, key=None).files.create(
            file=("in.jsonl", batch_file(1)[:900]), purpose="batch"
        )
        assert ok.bytes == len(batch_file(1)[:900])


# ---------------------------------------------------------------- slow clients


@pytest.mark.slow
def test_idle_and_slow_connections_are_cut_off(stub: StubServer, tmp_path: Path) -> None:
    limits = uvicorn_options(header_timeout_s=0.5, keep_alive_s=0.5, max_connections=40)
    with serve(stub, tmp_path / "state", limits, api_keys=[KEY_A], body_timeout_s=0.5) as url:
        port = int(url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        with http(url) as c:  # keyed requests are answered while they sit there
            started = time.monotonic()
            assert all(c.get("/v1/models").status_code == 200 for _ in range(5))
            assert time.monotonic() - started < 4
        assert all(closed_within(s, 3) < 3 for s in idle)  # the header timeout closed them
        for s in idle:
            s.close()
        # slow-loris: a head at 5 bytes a second
        with socket.create_connection(("127.0.0.1", port)) as s:
            started = time.monotonic()
            for byte in b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaa":
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.2)
                if time.monotonic() - started > 10:
                    break
            # the head would take 14 s: only the 0.5 s header timeout ends it this early
            assert time.monotonic() - started < 5
        # a body that stops halfway (a lying Content-Length): 408 in the envelope, then closed
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + KEY_A.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n"
        )  # fmt: skip
        started = time.monotonic()
        answer = raw(port, head + b'{"model": "m"')  # and then nothing
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer, answer
        assert 0.4 < time.monotonic() - started < 4  # raw() itself waits up to 5 s
        # a kept-alive connection idle past keep_alive_s is closed
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(
                b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                + KEY_A.encode()
                + b"\r\n\r\n"
            )
            assert answer_of(s).startswith(b"HTTP/1.1 200")
            assert closed_within(s, 3) < 3


@pytest.mark.slow
def test_a_body_that_stops_is_cut_off_one_timeout_after_its_last_bytes(
    stub: StubServer, tmp_path: Path
) -> None:
    """2 KiB at once, then nothing: the interval's 1 KiB was there, but the client has been
    silent for the whole timeout (it was answered one interval later: 8 s here)."""
    with serve(stub, tmp_path / "state", body_timeout_s=4.0) as url:
        port = int(url.rsplit(":", 1)[1])
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 10000\r\n\r\n"
        )
        started = time.monotonic()
        answer = raw(port, head + b'{"model": "' + b"m" * 2048, wait=15)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert 3.9 < waited < 6.5, waited


def test_at_the_connection_cap_the_longest_idle_make_room(stub: StubServer, tmp_path: Path) -> None:
    limits = uvicorn_options(header_timeout_s=5.0, max_connections=5)
    with serve(stub, tmp_path / "state", limits) as url:
        port = int(url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        time.sleep(0.1)
        started = time.monotonic()
        kept = []
        for _ in range(3):  # each evicts the longest idle socket, and is answered
            s = socket.create_connection(("127.0.0.1", port))
            kept.append(s)
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert answer_of(s).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started < 4.5  # not held until the 5 s header timeout
        assert all(closed_within(s, 1) < 1 for s in held[:3])  # the three oldest, long before 5 s
        for s in held + kept:
            s.close()


@pytest.mark.slow
def test_serve_applies_its_limits_and_host_list(stub: StubServer, tmp_path: Path) -> None:
    port = free_port()
    limits = ["--header-timeout", "0.5", "--body-timeout", "0.5"]
    proc = spawn(stub.url, tmp_path / "state", port, *limits, "--allowed-host", "api.example",
                 "--cors-origin", "https://app.example")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        ready(url, proc)
        with socket.create_connection(("127.0.0.1", port)) as s:
            assert closed_within(s, 3) < 3
        with http(url) as c:
            assert c.get("/v1/models", headers={"Host": "api.example"}).status_code == 200
            assert c.get("/v1/models", headers={"Host": "evil.example"}).status_code == 421
            r = c.options(
                "/v1/models",
                headers={"Origin": "https://app.example", "Access-Control-Request-Method": "GET"},
            )
            assert r.headers["access-control-allow-origin"] == "https://app.example"
        head = (
            b"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + KEY_A.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )  # fmt: skip
        assert raw(port, head).startswith(b"HTTP/1.1 408")
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_request_with_two_framings_is_refused_and_its_connection_closed(
    stub: StubServer, tmp_path: Path
) -> None:
    """``Transfer-Encoding`` with ``Content-Length``: a proxy in front may frame the body by
    the length and this server by the chunks, so a request hidden in the body would reach the
    app unseen by the proxy (request smuggling)."""
    limits = uvicorn_options()
    limits["http"] = http_protocol(limits["http"])
    hidden = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    smuggler = (
        b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" % (5 + len(hidden))
    )
    with serve(stub, tmp_path / "state", limits) as url:
        port = int(url.rsplit(":", 1)[1])
        answer = raw(port, smuggler + hidden)
        fine = raw(port, hidden.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert answer.startswith(b"HTTP/1.1 400") and b"invalid_http_request" in answer, answer
    assert answer.count(b"HTTP/1.1 ") == 1, answer  # the hidden request was never answered
    assert fine.startswith(b"HTTP/1.1 200"), fine[:200]


def test_a_request_head_over_16_kib_is_refused_even_in_one_piece(
    stub: StubServer, tmp_path: Path
) -> None:
    """h11 bounds only a head still incomplete; one that arrives whole in one read is
    measured too."""
    limits = uvicorn_options()
    limits["http"] = http_protocol(limits["http"])
    start = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    with serve(stub, tmp_path / "state", limits) as url:
        port = int(url.rsplit(":", 1)[1])
        fits = raw(port, start + b"X-Pad: " + b"p" * (15 * 1024) + b"\r\n\r\n")
        assert fits.startswith(b"HTTP/1.1 200"), fits[:200]
        for pad in (20 * 1024, 200 * 1024):
            big = start + b"X-Pad: " + b"p" * pad + b"\r\n\r\n"
            answer = raw(port, big)  # one sendall: one read on loopback
            assert answer == b"" or answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431")), answer
            assert b"invalid_http_request" in answer or answer == b""
        # many headers, each small: the head as a whole counts
        many = start + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(200))
        answer = raw(port, many + b"\r\n")
        assert not answer.startswith(b"HTTP/1.1 200"), answer[:200]
        # two requests in one read, the second over the limit: the first is answered, not it
        first = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        answer = raw(port, first + big)
        assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1 200") == 1, answer


# ---------------------------------------------------------------- what answers say


def test_echoed_input_is_clipped(stub: StubServer, tmp_path: Path) -> None:
    long_id = "file-" + "x" * 5_000_000
    with serve(stub, tmp_path / "state") as url, httpx.Client(base_url=url, timeout=30) as c:
        r = c.post(
            "/v1/batches", json={"input_file_id": long_id, "endpoint": "/v1/chat/completions"}
        )
        assert r.status_code == 404 and len(r.content) < 1000, len(r.content)
        assert "characters)" in is_envelope(r)["message"]
        r = c.post(
            "/v1/batches",
            json={"input_file_id": "f", "endpoint": "/v1/chat/completions", "y" * 100_000: 1},
        )
        assert r.status_code == 400 and len(r.content) < 1000
        r = c.get("/batch-inference/jobs/" + "j" * 10_000)
        assert r.status_code == 404 and len(r.content) < 1000
        r = c.get("/v1/nothing/" + "n" * 10_000)
        assert r.status_code == 404 and len(r.content) < 1000


def test_no_server_path_in_what_tenants_are_told(
    stub: StubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose output file cannot be written: the tenant reads the reason, not where."""
    monkeypatch.setattr("batchclient.jobs._runner.WRITE_RETRY", WriteRetry(2, 0.01, 0.02))
    state = tmp_path / "state"
    with StubServer(latency_s=0.3) as slow, serve(slow, state, api_keys=[KEY_A]) as url:
        client = sdk(url)
        record = client.files.create(file=("in.jsonl", batch_file(4)), purpose="batch")
        batch = client.batches.create(
            input_file_id=record.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        files = state / "tenants" / tenant_id(KEY_A) / "files"
        deadline = time.monotonic() + 30
        while slow.stats.requests == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        files.rename(files.with_name("files.moved"))
        files.write_text("a file where the folder of output files should be")
        failed = wait_batch(client, batch.id)
        assert failed.status == "failed" and failed.errors is not None
        message = failed.errors.data[0].message or ""
        assert failed.errors.data[0].code == "output_write_failed"
        assert (
            str(tmp_path) not in message and "<state>/files/" in message and "Errno" in message
        ), message
        listed = http(url).get("/v1/batches").text
        assert str(tmp_path) not in listed and "<state>" in listed


def test_the_trailing_slash_redirect_does_not_repeat_the_host(
    stub: StubServer, tmp_path: Path
) -> None:
    with serve(stub, tmp_path / "state") as url, httpx.Client(base_url=url) as c:
        r = c.get("/v1/files/", headers={"Host": "localhost"})
        assert r.status_code == 307 and r.headers["location"] == "/v1/files", r.headers
        r = c.get("/v1/files/?limit=1")
        assert r.status_code == 307 and r.headers["location"] == "/v1/files?limit=1"


@pytest.mark.parametrize("webhook", [False, True], ids=["plain", "webhook"])
def test_every_folder_the_server_makes_is_private(
    stub: StubServer, tmp_path: Path, webhook: bool
) -> None:
    """With a webhook, the outboxes are opened first (before the tenants make their folders)."""
    state = tmp_path / "made" / "by" / "serve"
    hooks: dict[str, Any] = {}
    if webhook:  # nothing listens there: the events wait in the outbox
        hooks = {"webhook_url": f"http://127.0.0.1:{free_port()}/hooks", "webhook_secret": SECRET}
    old = os.umask(0o022)
    try:
        with serve(stub, state, api_keys=[KEY_A], **hooks) as url:
            client = sdk(url)
            record = client.files.create(file=("in.jsonl", batch_file(1)), purpose="batch")
            batch = client.batches.create(
                input_file_id=record.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            assert wait_batch(client, batch.id).status == "completed"
    finally:
        os.umask(old)
    folders = [tmp_path / "made", tmp_path / "made" / "by", state, state / "tenants"]
    folders += [p for p in (state / "tenants").rglob("*") if p.is_dir()]
    assert len(folders) >= 6
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in folders}
    assert set(modes.values()) == {0o700}, {k: oct(v) for k, v in modes.items()}
    files = [p for p in state.rglob("*") if p.is_file()]
    assert len(files) >= 3  # the database, the input file, the output file
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in files}
    assert set(modes.values()) == {0o600}, {k: oct(v) for k, v in modes.items()}


def test_the_streamed_result_names_no_server_path(tmp_path: Path) -> None:
    """A failed item's stored message may quote the state directory (the output could not be
    written there): the streamed result of the original route shows ``<state>`` instead."""
    from batchclient.server._routes_original import _encode
    from batchclient.types import BatchItemError, ChatCompletionResponse

    state = tmp_path / "state"
    message = f"output_write_failed: cannot write {state}/files/out.jsonl: disk full"
    items = [
        ChatCompletionResponse(custom_id="a", error=BatchItemError(code="batch_failed",
                                                                   message=message)),
        ChatCompletionResponse(custom_id="b", error=None),
    ]  # fmt: skip
    encoded = json.loads(b"[" + _encode(items, True, [state]) + b"]")
    assert str(state) not in json.dumps(encoded)
    assert encoded[0]["error"]["message"].startswith("output_write_failed: cannot write <state>")
    assert encoded[1]["error"] is None and encoded[1]["custom_id"] == "b"
