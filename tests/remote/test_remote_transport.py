"""The remote provider's HTTP transport (aiohttp) over real loopback sockets: what it sends
(headers, query, User-Agent, auth), what it refuses to send, proxies, TLS with a private CA,
malformed and oversized answers, idle and stale keep-alive connections."""

from __future__ import annotations

import asyncio
import base64
import gc
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import trustme

from batchclient import BatchAPIBatchInference, ConfigurationError, RemoteBatchInference
from batchclient.remote import HttpOptions, RetryPolicy
from batchclient.testing import StubServer
from rawnet import MODELS, ForwardProxy, Seen, answering, completion, ok, read_request, serve

FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)
CONVO = [[{"role": "user", "content": "hi"}]]
SMALL = [[{"role": "user", "content": "small"}]]
SECRET = "sk-test-0123456789abcdef"


def url(port: int, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{port}/v1"


# ---------------------------------------------------------------------------- what is sent


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"X-Team": f"a\r\nX-Injected: {SECRET}"}, "X-Team"),
        ({"X-Team": f"{SECRET}\n"}, "X-Team"),
        ({"X-Team": f"{SECRET}\x00"}, "X-Team"),
        ({"X-Team": f"{SECRET}€"}, "X-Team"),
        ({"X Bad": "v"}, "X Bad"),
        ({"Content-Length": "5"}, "Content-Length"),
    ],
)
def test_bad_headers_are_refused_by_name_never_echoing_the_value(
    headers: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        RemoteBatchInference("http://127.0.0.1:9/v1", headers=headers)
    assert named in str(raised.value) and SECRET not in str(raised.value)


def test_a_control_character_inside_the_api_key_is_refused_without_echo() -> None:
    for key in (f"{SECRET}\r\nX-Injected: 1", f"sk-\x00{SECRET}"):
        with pytest.raises(ConfigurationError, match="api_key") as raised:
            RemoteBatchInference("http://127.0.0.1:9/v1", api_key=key)
        assert SECRET not in str(raised.value)


async def test_headers_query_user_agent_and_a_stripped_key_are_sent() -> None:
    seen = Seen()
    async with serve(answering(lambda head, body: ok(completion()), seen)) as port:
        async with RemoteBatchInference(
            f"http://127.0.0.1:{port}/openai/deployments/d?api-version=2024-10-21",
            api_key=f"  {SECRET}\n",  # as read from a file
            headers={"X-Team": "evals"},
            default_query={"tenant": "a b"},
        ) as client:
            result = await client.batch_chat_completion("m", CONVO)
    assert result.batch[0].text == "ok"
    models, chat = seen.heads  # GET /models (the model check), then the POST
    assert models.startswith(b"GET /openai/deployments/d/models?api-version=2024-10-21&tenant=a+b ")
    lines = chat.split(b"\r\n")
    assert lines[0] == (
        b"POST /openai/deployments/d/chat/completions?api-version=2024-10-21&tenant=a+b HTTP/1.1"
    )
    assert f"Authorization: Bearer {SECRET}".encode() in lines
    assert b"X-Team: evals" in lines and b"User-Agent: batchclient/0.1.0" in lines


async def test_userinfo_becomes_basic_auth_and_is_never_shown_or_stored(tmp_path: Path) -> None:
    seen = Seen()
    async with serve(answering(lambda head, body: None, seen)) as port:  # closes: an error
        base = f"http://user:{SECRET}@127.0.0.1:{port}/v1"
        async with RemoteBatchInference(
            base, max_retries=0, check_model=False, state_dir=tmp_path
        ) as client:
            result = await client.batch_chat_completion("m", CONVO)
            shown = [client.base_url, str(client.provider.identity()), str(client.replica_stats())]
        with pytest.raises(ConfigurationError) as both:
            RemoteBatchInference(base, api_key="k")
    token = base64.b64encode(f"user:{SECRET}".encode()).decode()
    assert f"Authorization: Basic {token}".encode() in seen.heads[0].split(b"\r\n")
    err = result.batch[0].error
    assert err is not None and err.code == "connection_error"
    for text in [err.message, *shown, str(both.value)]:
        assert SECRET not in text and "user:sk" not in text
    assert client.base_url == f"http://127.0.0.1:{port}/v1"


async def test_an_upstream_error_echoing_the_key_is_stored_redacted(tmp_path: Path) -> None:
    """A server's 400 that echoes the request's headers: the key never reaches the result,
    the SQLite database or the batch's error file."""

    def echo(head: bytes, body: bytes) -> bytes:
        payload = b'{"error": {"message": "bad request: %s"}}' % head.replace(b"\r\n", b" | ")
        return b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)

    async with serve(answering(echo)) as port:
        async with RemoteBatchInference(url(port), api_key=SECRET, state_dir=tmp_path) as client:
            result = await client.batch_chat_completion("m", CONVO)
            line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n'  # noqa: E501
            batch_file = await client.files.create(line, purpose="batch")
            batch = await client.batches.create(batch_file.id)
            batch = await client.batches.wait(batch.id)
    err = result.batch[0].error
    assert err is not None and err.status_code == 400
    assert "Authorization: [redacted]" in err.message and SECRET not in err.message
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())  # noqa: ASYNC240
    assert b"[redacted]" in stored and SECRET.encode() not in stored
    assert batch.error_file_id is not None


@pytest.mark.parametrize("name", ["api_key", "Token", "x-api-key", "sig", "X-Amz-Signature"])
async def test_a_secret_in_the_query_never_reaches_the_state_or_the_logs(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An upstream whose 400 echoes its request line (query included): a secret-named query
    parameter's value is nowhere in the result, the database, the error file or the logs,
    even a short one that the literal scrubbing would skip; the other parameters stay."""
    short = "s3cr1"  # under the literal scrubber's 6 characters: only the name protects it

    def echo(head: bytes, body: bytes) -> bytes:
        payload = b'{"error": {"message": "no route: %s"}}' % head.split(b"\r\n")[0]
        return b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)

    caplog.set_level("DEBUG")
    async with serve(answering(echo)) as port:
        base = f"{url(port)}?api-version=2024&{name}={SECRET}&auth={short}"
        async with RemoteBatchInference(
            base, max_retries=0, check_model=False, state_dir=tmp_path
        ) as client:
            result = await client.batch_chat_completion("m", CONVO)
            line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n'  # noqa: E501
            batch = await client.batches.create((await client.files.create(line)).id)
            batch = await client.batches.wait(batch.id)
            shown = [client.base_url, str(client.provider.identity()), str(client.replica_stats())]
    err = result.batch[0].error
    assert err is not None and err.status_code == 400
    assert f"api-version=2024&{name}=[redacted]&auth=[redacted]" in err.message
    assert batch.error_file_id is not None
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())  # noqa: ASYNC240
    assert b"[redacted]" in stored
    for text in [err.message, *shown, caplog.text, stored.decode("utf-8", "replace")]:
        assert SECRET not in text and short not in text


async def test_the_batch_api_client_never_shows_or_stores_url_secrets(tmp_path: Path) -> None:
    """The Batch API client's URL as shown and kept in a job's provider identity, and its
    connection errors: no userinfo, no secret-named query value."""
    base = f"http://user:{SECRET}@127.0.0.1:9/v1?sig={SECRET}"
    client = BatchAPIBatchInference(base, state_dir=tmp_path, max_retries=0)
    shown = [client.base_url, str(client.provider.identity())]
    with pytest.raises(ConfigurationError) as bad:
        BatchAPIBatchInference(f"ftp://user:{SECRET}@host/v1?token={SECRET}")
    for text in [*shown, str(bad.value)]:
        assert SECRET not in text, text
    assert client.base_url == "http://127.0.0.1:9/v1?sig=[redacted]"


@pytest.mark.parametrize("bad", ["http://[::1", f"http://u:{SECRET}@[::1/v1?key={SECRET}"])
def test_an_unparsable_url_is_a_configuration_error_without_its_secrets(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="not a valid URL") as raised:
        RemoteBatchInference(bad)
    assert "IPv6" in str(raised.value) and SECRET not in str(raised.value)


# ---------------------------------------------------------------------------- proxies


async def test_environment_proxy_is_used_and_no_proxy_honoured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = ForwardProxy()
    with StubServer() as stub:
        async with serve(proxy.handle) as proxy_port:
            monkeypatch.setenv("HTTP_PROXY", f"http://user:{SECRET}@127.0.0.1:{proxy_port}")
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            async with RemoteBatchInference(stub.url) as client:
                result = await client.batch_chat_completion("smollm2", CONVO)
            assert result.batch[0].text == "echo: hi"
            relayed = list(proxy.seen)
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            async with RemoteBatchInference(stub.url) as client:
                await client.batch_chat_completion("smollm2", CONVO)
            async with RemoteBatchInference(stub.url, trust_env=False) as client:
                await client.batch_chat_completion("smollm2", CONVO)
    token = base64.b64encode(f"user:{SECRET}".encode()).decode()
    assert (f"POST {stub.url}/chat/completions", f"Basic {token}") in relayed
    assert len(proxy.seen) == len(relayed)  # NO_PROXY and trust_env=False: straight there
    assert stub.stats.requests == 3


async def test_explicit_proxy_tunnels_https_with_connect(tmp_path: Path) -> None:
    ca = trustme.CA()
    async with tls_server(ca) as port:
        proxy = ForwardProxy()
        async with serve(proxy.handle) as proxy_port:
            ca_file = tmp_path / "ca.pem"
            ca.cert_pem.write_to_path(str(ca_file))
            async with RemoteBatchInference(
                f"https://localhost:{port}/v1",
                proxy=f"http://127.0.0.1:{proxy_port}",
                verify=str(ca_file),
            ) as client:
                result = await client.batch_chat_completion("m", CONVO)
    assert result.batch[0].text == "ok"
    assert proxy.seen[0] == (f"CONNECT localhost:{port}", None)


def test_a_socks_proxy_is_refused_clearly() -> None:
    with pytest.raises(ConfigurationError, match="only http:// and https:// proxies"):
        RemoteBatchInference("http://127.0.0.1:9/v1", proxy="socks5://127.0.0.1:1080")


# ---------------------------------------------------------------------------- TLS


def tls_server(ca: trustme.CA, *, client_ca: trustme.CA | None = None) -> Any:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    if client_ca is not None:
        client_ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
    return serve(answering(lambda head, body: ok(completion())), ssl=context)


async def test_a_private_ca_is_refused_by_default_and_trusted_with_verify(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    async with tls_server(ca) as port:
        base = f"https://localhost:{port}/v1"
        async with RemoteBatchInference(base, max_retries=0, check_model=False) as client:
            refused = await client.batch_chat_completion("m", CONVO)
        async with RemoteBatchInference(base, verify=str(ca_file)) as client:
            trusted = await client.batch_chat_completion("m", CONVO)
        context = ssl.create_default_context()
        ca.configure_trust(context)
        async with RemoteBatchInference(base, verify=context) as client:
            with_context = await client.batch_chat_completion("m", CONVO)
    err = refused.batch[0].error
    assert err is not None and err.code == "connection_error" and "certificate" in err.message
    assert trusted.batch[0].text == with_context.batch[0].text == "ok"


async def test_a_client_certificate_for_mutual_tls(tmp_path: Path) -> None:
    ca, client_ca = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client_cert = client_ca.issue_cert("batchclient@example.com")
    client_cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "client.pem"))
    async with tls_server(ca, client_ca=client_ca) as port:
        base = f"https://localhost:{port}/v1"
        verify = str(tmp_path / "ca.pem")
        async with RemoteBatchInference(
            base, verify=verify, max_retries=0, check_model=False
        ) as client:
            without = await client.batch_chat_completion("m", CONVO)
        http = HttpOptions(client_cert=str(tmp_path / "client.pem"))
        async with RemoteBatchInference(base, verify=verify, http=http) as client:
            with_cert = await client.batch_chat_completion("m", CONVO)
    assert without.batch[0].error is not None
    assert with_cert.batch[0].text == "ok"


def test_a_missing_ca_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot load"):
        RemoteBatchInference("https://x/v1", verify=str(tmp_path / "nope.pem"))


# ---------------------------------------------------------------------------- malformed answers


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",  # conflicting
        b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\n{}",  # negative
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n",  # 0x size
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",  # not HTTP at all
    ],
)
async def test_malformed_framing_is_a_connection_error_for_that_item(answer: bytes) -> None:
    async with serve(answering(lambda head, body: answer)) as port:
        async with RemoteBatchInference(url(port), max_retries=0, check_model=False) as client:
            result = await client.batch_chat_completion("m", CONVO)
    err = result.batch[0].error
    assert err is not None and err.code == "connection_error", err


async def test_a_folded_header_line_is_not_taken_as_content_length() -> None:
    async def folded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-A: 1\r\n Content-Length: 2\r\n\r\n" + completion())
        await writer.drain()  # then close: the body is delimited by the close, all of it

    async with serve(folded) as port:
        async with RemoteBatchInference(url(port), max_retries=0, check_model=False) as client:
            result = await client.batch_chat_completion("m", CONVO)
    assert result.batch[0].text == "ok"


async def test_an_http_10_answer_is_not_reused_as_keep_alive() -> None:
    seen = Seen()
    body = completion()
    reply = ok(body, version=b"HTTP/1.0")

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.connections += 1
        head, _ = await read_request(reader)
        writer.write(ok(MODELS, version=b"HTTP/1.0") if head.startswith(b"GET") else reply)
        await writer.drain()
        await asyncio.sleep(5)  # keeps the socket open: only the client can tell it is done

    async with serve(once) as port:
        async with RemoteBatchInference(url(port), timeout_s=2, max_retries=0) as client:
            result = await client.batch_chat_completion("m", CONVO * 3)
    assert [r.text for r in result.batch] == ["ok"] * 3
    assert seen.connections == 4  # one per request, the model check included


async def test_gzip_and_chunked_answers_are_decoded() -> None:
    import gzip

    payload = gzip.compress(completion("zipped"))
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (payload[:9], payload[9:]))
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n"
        + chunks
        + b"0\r\n\r\n"
    )
    async with serve(answering(lambda head, body: answer)) as port:
        async with RemoteBatchInference(url(port)) as client:
            result = await client.batch_chat_completion("m", CONVO * 2)
    assert [r.text for r in result.batch] == ["zipped", "zipped"]


async def test_a_header_flood_fails_the_item_fast_with_bounded_memory() -> None:
    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(10**6):  # headers forever (bounded here so the test cannot hang)
            writer.write(b"X-Flood-%d: %s\r\n" % (i, b"y" * 64))
            await writer.drain()

    process = psutil.Process()
    before = process.memory_info().rss
    async with serve(flood) as port:
        async with RemoteBatchInference(url(port), max_retries=0, check_model=False) as client:
            with anyio.fail_after(10):
                result = await client.batch_chat_completion("m", CONVO)
    err = result.batch[0].error
    assert err is not None and err.code == "connection_error"
    assert process.memory_info().rss - before < 50 << 20


# ---------------------------------------------------------------------------- large answers


def chunked_answer(total: int, block: int = 1 << 16) -> Any:
    """A chat completion of about ``total`` bytes, streamed in chunks without building it."""
    head = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "'
    tail = b'"}, "finish_reason": "stop"}]}'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request_head, _ = await read_request(reader)
            if request_head.startswith(b"GET"):
                writer.write(ok(MODELS))
                continue
            if b"small" in _:
                writer.write(ok(completion("small")))
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n%s\r\n" % (len(head), head))
            filler = b"x" * block
            for _i in range(total // block):
                writer.write(b"%x\r\n%s\r\n" % (block, filler))
                await writer.drain()
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
            await writer.drain()

    return handle


class PeakRss:
    """The highest resident set size seen by a sampling thread (bytes)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        process = psutil.Process()
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def test_a_100_mb_chunked_answer_stops_at_the_cap_in_bounded_memory() -> None:
    """100 MB, chunked, against the default 64 MiB cap: that item is ``response_too_large``,
    memory stays within the cap, and small requests keep completing meanwhile (the body is
    read chunk by chunk; nothing blocks the event loop)."""
    gc.collect()
    base = psutil.Process().memory_info().rss
    done: list[float] = []
    async with serve(chunked_answer(100 << 20)) as port:
        async with RemoteBatchInference(url(port), max_retries=0) as client:

            async def small() -> None:
                while True:
                    r = await client.batch_chat_completion(
                        "m", [[{"role": "user", "content": "small"}]]
                    )
                    assert r.batch[0].text == "small"
                    done.append(time.monotonic())

            with PeakRss() as rss:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(small)
                    started = time.monotonic()
                    big = await client.batch_chat_completion("m", CONVO)
                    finished = time.monotonic()
                    tg.cancel_scope.cancel()
    err = big.batch[0].error
    assert err is not None and err.code == "response_too_large", err
    assert rss.peak - base < (64 << 20) + (48 << 20)  # the cap plus slack, never the 100 MB
    during = [t for t in done if started <= t <= finished]
    gaps = [b - a for a, b in zip([started, *during], [*during, finished], strict=True)]
    # a blocked event loop shows as one gap about as long as the whole download
    bound = max(1.0, 0.25 * (finished - started))
    assert len(during) >= 5 and max(gaps) < bound, (len(during), max(gaps), bound)


async def test_an_answer_over_a_small_cap_is_refused_early() -> None:
    async with serve(chunked_answer(20 << 20)) as port:
        http = HttpOptions(max_response_bytes=1 << 20)
        async with RemoteBatchInference(url(port), http=http) as client:
            result = await client.batch_chat_completion("m", CONVO)
            stats = client.replica_stats()[0]
    err = result.batch[0].error
    assert err is not None and err.code == "response_too_large" and "1,048,576" in err.message
    assert result.batch[0].error is not None and stats.failed == 0 and stats.sent == 1


# ---------------------------------------------------------------------------- keep-alive


def blackhole_after_idle(idle_s: float, seen: Seen) -> Any:
    """Answers, but a connection left idle for ``idle_s`` goes dead without a word (a NAT or
    load balancer that dropped it): what arrives on it later is never answered."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.connections += 1
        last = time.monotonic()
        while True:
            head, _ = await read_request(reader)
            if time.monotonic() - last > idle_s:
                await asyncio.sleep(3600)
            writer.write(ok(MODELS) if head.startswith(b"GET") else ok(completion()))
            await writer.drain()
            last = time.monotonic()

    return handle


@pytest.mark.parametrize("expiry_s", [0.5, 30.0])
async def test_idle_connections_expire_before_a_middlebox_drops_them(expiry_s: float) -> None:
    # Seconds apart, so a busy machine's pauses between the model check and the first request
    # neither drop the first connection nor keep the client's pool from expiring it.
    seen = Seen()
    async with (
        serve(blackhole_after_idle(1.5, seen)) as port,
        RemoteBatchInference(
            url(port), timeout_s=1.0, max_retries=0, http=HttpOptions(keepalive_expiry_s=expiry_s)
        ) as client,
    ):
        first = await client.batch_chat_completion("m", CONVO)
        await anyio.sleep(1.8)
        second = await client.batch_chat_completion("m", CONVO)
    assert first.batch[0].text == "ok"
    if expiry_s < 1.5:  # closed by the client first: a fresh connection, at once
        assert second.batch[0].text == "ok" and seen.connections >= 2
    else:  # the control: a connection kept past the middlebox's limit waits out the timeout
        assert second.batch[0].error is not None and second.batch[0].error.code == "timeout"


async def test_a_server_closing_pooled_connections_costs_no_failures() -> None:
    """Each connection serves one request; the next request on it is met with a close (the
    server dropped it just as it was reused). Each is retried once on a fresh connection: all
    succeed, at full speed, and the only endpoint is never ejected."""
    seen = Seen()

    async def one_per_connection(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        seen.connections += 1
        head, _ = await read_request(reader)
        writer.write(ok(MODELS) if head.startswith(b"GET") else ok(completion()))
        await writer.drain()
        await read_request(reader)  # the reuse: closed without an answer

    async with serve(one_per_connection) as port:
        async with RemoteBatchInference(url(port), max_concurrency=4, retry=FAST) as client:
            started = time.monotonic()
            result = await client.batch_chat_completion("m", CONVO * 32)
            elapsed = time.monotonic() - started
            stats = client.replica_stats()[0]
    assert all(r.text == "ok" for r in result.batch)
    assert (stats.failed, stats.ejected, stats.sent) == (0, False, 32)
    assert all(r.metric("latency") is not None for r in result.batch)
    assert elapsed < 5.0
