"""The answers uvicorn itself would give in plain text, given in OpenAI's error envelope:

- :class:`Interrupted` (an ASGI middleware): a request still running when the shutdown grace
  (``batchclient serve``: 5 s after SIGTERM) runs out is cancelled by uvicorn, which would
  answer ``500 Internal Server Error`` as text; it gets 503 ``server_shutting_down`` instead
  (when nothing was sent yet; a streamed answer already under way is cut, as before).
- :func:`http_protocol`: uvicorn's HTTP protocol (httptools or h11, as uvicorn picks), except
  that a request its parser refuses (a request line or headers over its limits, such as a URL
  of tens of KiB, or bytes that are not HTTP) is answered with a 400 envelope
  (``invalid_http_request``) instead of ``Invalid HTTP request received.`` as text. uvicorn
  answers those from its protocol class, before any ASGI app sees the request, so this
  overrides its ``send_400_response``; a uvicorn without that method keeps its own answer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import envelope

SHUTTING_DOWN = envelope(
    "the server is shutting down and stopped this request; retry it",
    type="server_error",
    code="server_shutting_down",
)


class Interrupted:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            # only a cancellation of the whole task reaches here (anyio's cancel scopes, such
            # as a client disconnecting, end inside the app): uvicorn's shutdown
            if not started:
                body = json.dumps(SHUTTING_DOWN).encode()
                await send(_start(503, body))
                await send({"type": "http.response.body", "body": body})
            raise


def _start(status: int, body: bytes) -> Message:
    headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    return {"type": "http.response.start", "status": status, "headers": headers}


def http_protocol(protocol: type[asyncio.Protocol] | None = None) -> type[asyncio.Protocol]:
    """``protocol`` (default: uvicorn's automatic HTTP protocol class) with the envelope for
    refused requests (see the module docstring); pass it as ``uvicorn.Config(http=...)``, e.g.
    over the guarded protocol of :func:`~batchclient.server.uvicorn_options`."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol if protocol is None else protocol
    if not callable(getattr(base, "send_400_response", None)):
        return base  # type: ignore[no-any-return]

    class EnvelopeProtocol(base):  # type: ignore[misc, valid-type]
        def send_400_response(self, msg: str) -> None:
            body = json.dumps(
                envelope(f"{msg} (malformed, or a request line or header too long)",
                         code="invalid_http_request")
            ).encode()  # fmt: skip
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            length = b"content-length: %d\r\n" % len(body)
            head += [b"content-type: application/json\r\n", length, b"connection: close\r\n\r\n"]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

    return EnvelopeProtocol
