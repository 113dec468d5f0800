"""Loopback servers written by hand for the transport tests: each one misbehaves in one precise
way (or forwards, as a proxy), over real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serve(handle: Handler, **kwargs: object) -> AsyncIterator[int]:
    """An asyncio server on 127.0.0.1 running ``handle`` per connection; yields its port."""
    tasks: set[asyncio.Task[None]] = set()

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            tasks.discard(task)
            writer.close()

    server = await asyncio.start_server(run, "127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


@dataclass
class Seen:
    """What a server saw: request heads (bytes) and how many connections."""

    heads: list[bytes] = field(default_factory=list)
    connections: int = 0


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP/1.1 request with a Content-Length body: (head, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


def completion(text: str = "ok") -> bytes:
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


MODELS = b'{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "x"}]}'


def ok(body: bytes, extra: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    return b"%s 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        version,
        len(body),
        extra,
        body,
    )


def answering(reply: Callable[[bytes, bytes], bytes | None], seen: Seen | None = None) -> Handler:
    """A keep-alive server writing ``reply(head, body)`` verbatim (None: close at once)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if seen is not None:
            seen.connections += 1
        while True:
            head, body = await read_request(reader)
            if seen is not None:
                seen.heads.append(head)
            answer = ok(MODELS) if head.startswith(b"GET") else reply(head, body)
            if answer is None:
                return
            writer.write(answer)
            await writer.drain()

    return handle


class ForwardProxy:
    """An HTTP forward proxy: absolute-form requests (``POST http://host/...``) are relayed
    over a fresh upstream connection, ``CONNECT host:port`` is tunnelled. ``seen`` keeps each
    request line with its ``Proxy-Authorization`` value (or None)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await read_request(reader)
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            auth = next(
                (
                    ln.split(":", 1)[1].strip()
                    for ln in lines[1:]
                    if ln.lower().startswith("proxy-authorization:")
                ),
                None,
            )
            self.seen.append((f"{method} {target}", auth))
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
                return
            rest = target.split("://", 1)[1]
            hostport, _, path = rest.partition("/")
            host, _, port = hostport.partition(":")
            up_reader, up_writer = await asyncio.open_connection(host, int(port or 80))
            kept = [
                ln
                for ln in lines[1:]
                if ln and not ln.lower().startswith(("proxy-", "connection:"))
            ]
            request = "\r\n".join([f"{method} /{path} HTTP/1.1", *kept, "Connection: close"])
            up_writer.write(request.encode("latin-1") + b"\r\n\r\n" + body)
            await up_writer.drain()
            answer = await up_reader.read()  # the upstream closes after one answer
            up_writer.close()
            writer.write(answer)
            await writer.drain()
            if b"\r\nconnection: close" in answer.lower():
                return


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except ConnectionError:
        pass
    finally:
        dst.close()
