"""What a browser, a stranger's web page or a slow client can make the server do, bounded in
one ASGI middleware (:class:`Guard`, just inside the access log):

- **Host allow-list.** A request whose ``Host`` is not a loopback name (``localhost``,
  ``*.localhost``, ``127.0.0.1``, ``::1``) or one of the ``allowed_hosts`` gets 421 in
  OpenAI's envelope. Without it, a web page can rebind its own DNS name to 127.0.0.1 and
  read or delete every file and batch of a server without keys. ``"*"`` allows any name;
  ``".example.com"`` allows ``example.com`` and its subdomains. A request without ``Host``
  (HTTP/1.0; no browser sends one) passes.
- **Foreign origins.** A request that changes something (not GET, HEAD or OPTIONS) and carries
  an ``Origin`` that is neither one of ``cors_origins`` nor the server's own (an allowed
  ``Host``) gets 403: a page elsewhere can make a browser post a form here without asking
  (JSON bodies are refused unless they say ``application/json``; this covers the uploads).
- **Relative redirects.** A ``Location`` pointing at this request's own ``Host`` is sent as a
  path only, so the trailing-slash redirect never repeats a ``Host`` it was given.
- **Slow bodies.** While a request body is being read, each interval of ``body_timeout_s``
  seconds spent waiting for the client must bring at least :data:`MIN_BODY_BYTES` bytes, and
  the client may not be silent for ``body_timeout_s``; otherwise the request is answered 408
  (``Connection: close``). Time the application spends
  between reads does not count, so a slow disk never blames the client.

CORS headers are sent only for ``cors_origins`` (Starlette's ``CORSMiddleware``, added by
``create_app``); by default there are none and a browser keeps every answer from other pages.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from urllib.parse import urlsplit

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import APIError, clip, error_response

LOOPBACK_NAMES = ("localhost", ".localhost", "127.0.0.1", "::1")
"""Host names every server accepts."""
MIN_BODY_BYTES = 1024
"""Bytes a request body must bring in each ``body_timeout_s`` interval of waiting."""
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def host_name(value: str) -> str:
    """The name of a ``Host`` header or an origin's netloc: no port, no brackets, lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


class HostList:
    """Exact names, ``.suffix`` for a domain and its subdomains, ``*`` for any."""

    def __init__(self, names: Iterable[str]) -> None:
        cleaned = [n.strip().lower() for n in names if n.strip()]
        self.any = "*" in cleaned
        self.suffixes = tuple(n for n in cleaned if n.startswith("."))
        self.exact = frozenset(host_name(n) for n in cleaned if not n.startswith(".") and n != "*")
        self.exact |= {s[1:] for s in self.suffixes}

    def __contains__(self, name: str) -> bool:
        return self.any or name in self.exact or name.endswith(self.suffixes)


class SlowBody(APIError):
    def __init__(self, timeout: float) -> None:
        super().__init__(
            408,
            f"the request body came too slowly (under {MIN_BODY_BYTES} bytes in {timeout:g} s "
            "of waiting)",
            code="request_timeout",
            headers={"Connection": "close"},
        )


class _TimedBody:
    """``receive`` with the slow-body rule, until the body's last message."""

    def __init__(self, receive: Receive, timeout: float) -> None:
        self.receive = receive
        self.timeout = timeout
        self.done = False
        self.waited = 0.0
        self.window_bytes = 0

    async def __call__(self) -> Message:
        if self.done:
            return await self.receive()
        silent_since = time.monotonic()
        while True:
            started = time.monotonic()
            window_left = self.timeout - self.waited
            silence_left = self.timeout - (started - silent_since)
            try:
                with anyio.fail_after(max(min(window_left, silence_left), 0.0)):
                    message = await self.receive()
            except TimeoutError:
                # a client silent for a whole interval is cut off then, not an interval later
                silent = time.monotonic() - silent_since >= self.timeout
                if self.window_bytes < MIN_BODY_BYTES or silent:
                    raise SlowBody(self.timeout) from None
                self.waited, self.window_bytes = 0.0, 0
                continue
            self.waited += time.monotonic() - started
            if message["type"] == "http.request":
                self.window_bytes += len(message.get("body", b""))
                self.done = not message.get("more_body", False)
            else:
                self.done = True
            return message


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed_hosts: Iterable[str] = (),
        cors_origins: Iterable[str] = (),
        body_timeout_s: float | None = None,
    ) -> None:
        self.app = app
        self.hosts = HostList([*LOOPBACK_NAMES, *allowed_hosts])
        self.origins = frozenset(o.rstrip("/").lower() for o in cors_origins)
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if host and host_name(host) not in self.hosts:
            response = error_response(
                421,
                f"this server does not answer for Host {clip(host_name(host))}: start it with "
                "--allowed-host NAME (create_app(allowed_hosts=...)) to add a name",
                code="host_not_allowed",
                headers={"Connection": "close"},
            )
            await response(scope, receive, send)
            return
        origin = headers.get(b"origin", b"").decode("latin-1").rstrip("/").lower()
        if origin and scope["method"] not in SAFE_METHODS and not self._own(origin, host):
            response = error_response(
                403,
                f"requests from the web page at {clip(origin)} are refused: list it with "
                "--cors-origin (create_app(cors_origins=...)) to allow it",
                code="origin_not_allowed",
            )
            await response(scope, receive, send)
            return
        if self.body_timeout_s is not None:
            receive = _TimedBody(receive, self.body_timeout_s)
        await self.app(scope, receive, _relative_location(send, host))

    def _own(self, origin: str, host: str) -> bool:
        if origin in self.origins or "*" in self.origins:
            return True
        netloc = urlsplit(origin).netloc
        return bool(host) and netloc == host.lower()


def _relative_location(send: Send, host: str) -> Send:
    """``send`` with a ``Location`` on this request's ``Host`` cut to its path."""
    if not host:
        return send
    own = host.lower().encode("latin-1")

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = []
            for name, value in message.get("headers", ()):
                if name.lower() == b"location":
                    parts = urlsplit(value.decode("latin-1"))
                    if parts.netloc.encode("latin-1").lower() == own:
                        path = "/" + parts.path.lstrip("/")  # "//x" would name a host
                        value = (path + (f"?{parts.query}" if parts.query else "")).encode()
                headers.append((name, value))
            message = {**message, "headers": headers}
        await send(message)

    return sending
