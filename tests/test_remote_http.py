"""The lean HTTP/1.1 pool of the remote provider against a raw loopback server that sends
hand-written answers: framing (Content-Length, chunked, close-delimited), compression,
interim 1xx answers, keep-alive reuse, and every way a connection can go wrong."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from batchclient.remote._http import HttpError, HttpTimeout, Pool

Reply = Callable[[bytes], bytes | None]  # request bytes -> raw answer (None: close at once)


@asynccontextmanager
async def raw_server(reply: Reply, *, close_after: bool = False) -> AsyncIterator[dict[str, int]]:
    """A server that reads one request at a time and writes ``reply(request)`` verbatim."""
    seen = {"connections": 0, "requests": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                seen["requests"] += 1
                answer = reply(head + body)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    seen["port"] = server.sockets[0].getsockname()[1]
    async with server:
        yield seen


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def test_content_length_answers_reuse_one_connection() -> None:
    async with raw_server(lambda req: ok(b'{"n": 1}', b"X-Request-Id: abc\r\n")) as seen:
        pool = Pool(f"http://127.0.0.1:{seen['port']}/v1", {"Authorization": "Bearer k"})
        for _ in range(5):
            resp = await pool.request("POST", "/v1/chat/completions", b"{}", timeout=5)
            assert (resp.status, resp.body, resp.headers["x-request-id"]) == (
                200,
                b'{"n": 1}',
                "abc",
            )
        pool.close()
    assert seen["connections"] == 1 and seen["requests"] == 5


async def test_request_carries_path_host_length_and_headers() -> None:
    got: list[bytes] = []

    def reply(req: bytes) -> bytes:
        got.append(req)
        return ok(b"{}")

    async with raw_server(reply) as seen:
        pool = Pool(f"http://127.0.0.1:{seen['port']}/v1", {"Authorization": "Bearer k"})
        await pool.request("POST", "/v1/chat/completions", b'{"a": 1}', timeout=5)
        pool.close()
    head, _, body = got[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert b"Content-Length: 8" in lines and b"Authorization: Bearer k" in lines
    assert f"Host: 127.0.0.1:{seen['port']}".encode() in lines
    assert body == b'{"a": 1}'


async def test_chunked_gzip_and_interim_answers() -> None:
    payload = gzip.compress(b'{"hello": "world"}')
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (payload[:7], payload[7:]))
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n"
        + chunks
        + b"0\r\n\r\n"
    )
    async with raw_server(lambda req: answer) as seen:
        pool = Pool(f"http://127.0.0.1:{seen['port']}", {})
        for _ in range(2):  # the connection stays usable after a chunked answer
            resp = await pool.request("POST", "/x", b"", timeout=5)
            assert resp.body == b'{"hello": "world"}'
        pool.close()
    assert seen["connections"] == 1


async def test_close_delimited_body_and_connection_close() -> None:
    answer = b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"until": "close"}'
    async with raw_server(lambda req: answer, close_after=True) as seen:
        pool = Pool(f"http://127.0.0.1:{seen['port']}", {})
        for _ in range(2):
            resp = await pool.request("GET", "/x", timeout=5)
            assert resp.body == b'{"until": "close"}'
        pool.close()
    assert seen["connections"] == 2  # never reused after Connection: close


async def test_server_closing_before_answering_is_an_http_error() -> None:
    async with raw_server(lambda req: None) as seen:
        pool = Pool(f"http://127.0.0.1:{seen['port']}", {})
        with pytest.raises(HttpError, match="closed before the answer"):
            await pool.request("POST", "/x", b"{}", timeout=5)
        pool.close()


async def test_garbage_instead_of_http_is_an_http_error() -> None:
    async with raw_server(lambda req: b"SSH-2.0-OpenSSH\r\n\r\n") as seen:
        pool = Pool(f"http://127.0.0.1:{seen['port']}", {})
        with pytest.raises(HttpError, match="malformed HTTP answer"):
            await pool.request("POST", "/x", b"{}", timeout=5)
        pool.close()


async def test_refused_connection_is_an_http_error() -> None:
    async with raw_server(lambda req: ok(b"")) as seen:
        port = seen["port"]
    pool = Pool(f"http://127.0.0.1:{port}", {})  # the server is gone now
    with pytest.raises(HttpError, match="cannot connect"):
        await pool.request("POST", "/x", b"{}", timeout=5)


async def test_timeout_closes_the_connection_and_a_late_answer_is_never_read() -> None:
    answers: list[float] = []

    def slow(req: bytes) -> bytes:
        answers.append(1)
        return ok(b'{"late": true}') if b"slow" in req else ok(b'{"fresh": true}')

    async def delayed_server() -> tuple[asyncio.Server, int]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    body = await reader.readexactly(length)
                    if b"slow" in body:
                        await asyncio.sleep(0.5)
                    writer.write(slow(body))
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return server, server.sockets[0].getsockname()[1]

    server, port = await delayed_server()
    async with server:
        pool = Pool(f"http://127.0.0.1:{port}", {})
        with pytest.raises(HttpTimeout):
            await pool.request("POST", "/x", b"slow", timeout=0.1)
        resp = await pool.request("POST", "/x", b"fast", timeout=5)
        assert resp.body == b'{"fresh": true}'
        pool.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_https_with_a_given_ssl_context(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    await anyio.run_process(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
    )  # fmt: skip
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ok(b'{"tls": true}'))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    async with server:
        strict = Pool(f"https://localhost:{port}/v1", {})  # system CAs: our cert is unknown
        with pytest.raises(HttpError, match="cannot connect"):
            await strict.request("GET", "/v1/models", timeout=5)
        trusting = Pool(
            f"https://localhost:{port}/v1", {}, ssl_context=ssl.create_default_context(cafile=cert)
        )
        resp = await trusting.request("GET", "/v1/models", timeout=5)
        assert resp.body == b'{"tls": true}'
        trusting.close()


async def test_ipv6_literal_host() -> None:
    got: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(ok(b"{}"))
        await writer.drain()
        writer.close()

    try:
        server = await asyncio.start_server(handle, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = server.sockets[0].getsockname()[1]
    async with server:
        pool = Pool(f"http://[::1]:{port}/v1", {})
        resp = await pool.request("GET", "/v1/models", timeout=5)
        pool.close()
    assert resp.status == 200
    assert f"Host: [::1]:{port}".encode() in got[0]


def test_only_http_urls() -> None:
    with pytest.raises(ValueError, match="not an http"):
        Pool("ftp://example.com/v1", {})
