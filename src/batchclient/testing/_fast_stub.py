"""A lean HTTP/1.1 keep-alive responder for the stub's "fast" mode (client headroom benchmarks).

``aiohttp.web`` tops out around 10k requests/s on one core, which would make the *stub* the
bottleneck when measuring how many requests/s one client core can push. This responder is an
``asyncio.Protocol`` that parses only what an HTTP/1.1 client sends (request line, headers,
``Content-Length`` body; no chunked uploads, no pipelining beyond answering in order) and
answers ``POST /v1/chat/completions`` with the stub's normal echo completion, ``GET /v1/models``
with the model list. It supports latency and a capacity (429 above N in flight, optionally with
``Retry-After``); every other fault lives in the full stub (``testing.StubServer``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ..types import Endpoint
from ._stub import StubStats, _retry_after_value, completion_body

_CHAT = Endpoint.chat_completions.value.encode()
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 429: b"Too Many Requests"}


def _response(status: int, payload: bytes, extra: str = "") -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, b'Error').decode()}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + payload


class FastStub:
    """Shared configuration and statistics of every connection of one fast stub."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        capacity: int | None = None,
        capacity_retry_after: str | None = None,
        models: tuple[str, ...] = ("smollm2",),
    ) -> None:
        self.latency_s = latency_s
        self.capacity = capacity
        self.capacity_retry_after = capacity_retry_after
        self.models = models
        self.stats = StubStats()
        data = [{"id": m, "object": "model", "owned_by": "stub"} for m in models]
        self.models_response = _response(200, json.dumps({"object": "list", "data": data}).encode())

    def answer(self, method: bytes, path: bytes, body: bytes) -> tuple[bytes, bool]:
        """The response bytes, and whether it is a success that should wait ``latency_s``."""
        if method == b"GET" and path.startswith(b"/v1/models"):
            return self.models_response, False
        if method == b"GET" and path.startswith(b"/stats"):
            return _response(200, json.dumps(self.stats.summary()).encode()), False
        if method != b"POST" or not path.startswith(_CHAT):
            return _response(404, b'{"error": {"message": "no such route"}}'), False
        stats = self.stats
        stats.requests += 1
        if self.capacity is not None and stats.in_flight >= self.capacity:
            stats.by_status[429] += 1
            extra = ""
            if self.capacity_retry_after is not None:
                extra = f"Retry-After: {_retry_after_value(self.capacity_retry_after)}\r\n"
            msg = b'{"error": {"message": "over capacity", "type": "rate_limit_error"}}'
            return _response(429, msg, extra), False
        try:
            request: Any = json.loads(body)
        except ValueError:
            stats.by_status[400] += 1
            return _response(400, b'{"error": {"message": "body is not JSON"}}'), False
        if not isinstance(request, dict):
            stats.by_status[400] += 1
            return _response(400, b'{"error": {"message": "body is not an object"}}'), False
        if self.models and request.get("model") not in self.models:
            stats.by_status[404] += 1
            missing = f"The model `{request.get('model')}` does not exist."
            msg = json.dumps({"error": {"message": missing, "code": 404}}).encode()
            return _response(404, msg), False
        stats.by_status[200] += 1
        return _response(200, json.dumps(completion_body(request)).encode()), True


class _Connection(asyncio.Protocol):
    def __init__(self, stub: FastStub) -> None:
        self.stub = stub
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False  # one request at a time per connection (HTTP/1.1 without pipelining)
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.busy:
            self.busy = False
            self.stub.stats.in_flight -= 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        buf = self.buffer
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buf[:end])
        length = 0
        lower = head.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at >= 0:
            stop = lower.find(b"\r\n", at + 2)
            length = int(lower[at + 17 : stop if stop >= 0 else None])
        total = end + 4 + length
        if len(buf) < total:
            return
        body = bytes(buf[end + 4 : total])
        del buf[:total]
        method, _, rest = head.partition(b" ")
        path = rest.partition(b" ")[0]
        stats = self.stub.stats
        response, delayed = self.stub.answer(method, path, body)
        if delayed and self.stub.latency_s > 0:
            self.busy = True
            stats.in_flight += 1
            stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
            asyncio.get_running_loop().call_later(self.stub.latency_s, self._send_later, response)
            return
        self._write(response)

    def _send_later(self, response: bytes) -> None:
        if self.closed:
            return
        self.busy = False
        self.stub.stats.in_flight -= 1
        self._write(response)

    def _write(self, response: bytes) -> None:
        assert self.transport is not None
        self.transport.write(response)
        if self.buffer:
            self._next()


async def serve_fast(stub: FastStub, host: str, port: int) -> asyncio.Server:
    """Start listening; returns the server (``server.sockets[0]`` has the port)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _Connection(stub), host, port, backlog=4096)
