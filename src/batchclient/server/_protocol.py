"""Connection limits uvicorn does not have, on its h11 protocol (:func:`uvicorn_options`).

uvicorn bounds a request head's size (``h11_max_incomplete_event_size``, 16 KiB here) only while
the head is incomplete: h11 parses a head of any size that arrives whole in one read. It closes
a kept-alive connection idle for ``timeout_keep_alive`` seconds, but a connection that never
finishes a request head is held forever: one that sends nothing after connecting, or a head at
one byte a second (slow-loris). Its ``limit_concurrency`` counts such connections and answers
503 to *everyone* once they reach the limit, so it turns idle sockets into a denial of service
rather than preventing one. The protocol here adds:

- a **header timeout**: a new connection, and each next request on a kept-alive one, must
  deliver a complete request head within ``header_timeout_s`` seconds of its first byte (of the
  connection, for the first request); otherwise it is closed without an answer;
- a **head size limit** whatever the reads: a parsed request head over
  ``h11_max_incomplete_event_size`` (:data:`MAX_HEAD_BYTES`) is refused like one that arrived
  piecemeal (uvicorn's 400, ``invalid_http_request`` in the envelope under
  :func:`~batchclient.server.http_protocol`; the connection is closed), never handed to the app;
- **one framing per request**: a request with both ``Transfer-Encoding`` and
  ``Content-Length`` is refused like a malformed head and its connection closed (RFC 9112,
  section 6.3; h11 takes the chunked framing and keeps the connection, so a second request
  hidden in the body would be answered);
- a **connection cap**: when a connection arrives while ``max_connections`` are open, the one
  that has waited longest without a request in progress (idle, or still sending its head) is
  closed to make room; when every one has a request in progress, the new one is closed. A
  warning is logged at most every 10 s. Sockets cannot exhaust the process's file descriptors,
  and idle ones cannot lock out clients that send requests.

Request bodies are bounded by the application (``create_app``'s ``body_timeout_s`` and size caps).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("batchclient.server")

DEFAULT_HEADER_TIMEOUT = 10.0
"""Seconds to deliver a request head."""
DEFAULT_KEEP_ALIVE = 5.0
"""Seconds an idle kept-alive connection stays open (uvicorn's default)."""
DEFAULT_MAX_CONNECTIONS = 1000
"""Connections open at once; keep the file-descriptor limit (``ulimit -n``) above it."""
MAX_HEAD_BYTES = 16 * 1024
"""Largest request head (request line and headers)."""
BACKLOG = 100
"""Connections waiting to be accepted. asyncio accepts up to this many at once before any is
counted, so the file-descriptor limit needs this much room above ``max_connections``
(uvicorn's default, 2048, would need 2048)."""


class _HeadLimited(h11.Connection):
    """h11's server side, refusing a parsed request head over ``max_head_bytes``."""

    def __init__(self, max_head_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request):
            if _head_bytes(event) > self.max_head_bytes:
                raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
            names = {name for name, _ in event.headers}
            if b"transfer-encoding" in names and b"content-length" in names:
                # RFC 9112, section 6.3: a server may refuse it, and must close the connection
                # (the two framings disagree on where the next request starts: smuggling)
                raise h11.RemoteProtocolError(
                    "Transfer-Encoding and Content-Length together", error_status_hint=400
                )
        return event


def _head_bytes(request: h11.Request) -> int:
    """The size of ``request``'s head as sent, less optional whitespace h11 dropped."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    return line + sum(len(n) + len(v) + 4 for n, v in request.headers.raw_items()) + 2


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout and a connection cap (class attributes,
    set by :func:`uvicorn_options` on a subclass), and a head size limit whatever the reads."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    _last_warning = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _HeadLimited(self.config.h11_max_incomplete_event_size or MAX_HEAD_BYTES)
        self._head_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = time.monotonic()  # None: a request in progress

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            now = time.monotonic()
            if now - GuardedH11Protocol._last_warning > 10:
                GuardedH11Protocol._last_warning = now
                logger.warning(
                    "%d connections open (max_connections): closing the longest idle ones",
                    self.max_connections,
                )
            # closing ones stay in the set until the loop runs their connection_lost: skip them
            idle = [
                c
                for c in self.connections
                if isinstance(c, GuardedH11Protocol)
                and c is not self
                and c._idle_since is not None
                and not c.transport.is_closing()
            ]
            if not idle:
                transport.close()
                return
            oldest = min(idle, key=lambda c: c._idle_since or 0.0)
            oldest._idle_since = None
            oldest.transport.close()
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        self._idle_since = time.monotonic()
        super().on_response_complete()
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _watch_head(self) -> None:
        """Timed while a head is arriving (some bytes of it, their state still IDLE)."""
        waiting = self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])
        if waiting and not self.transport.is_closing():
            if self._head_timer is None:
                self._arm_head_timer()
        elif self.conn.their_state is not h11.IDLE:
            self._idle_since = None
            self._disarm_head_timer()

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def uvicorn_options(
    *,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT,
    keep_alive_s: float = DEFAULT_KEEP_ALIVE,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> dict[str, Any]:
    """``uvicorn.Config`` arguments that bound what connections can hold (module docstring):
    ``http`` (the guarded h11 protocol), ``timeout_keep_alive``, ``backlog`` and
    ``h11_max_incomplete_event_size``.

    Args:
        header_timeout_s: seconds a connection has to deliver each request head.
        keep_alive_s: seconds an idle kept-alive connection stays open.
        max_connections: connections open at once; more are closed as they arrive.
    """
    protocol = type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout_s": header_timeout_s, "max_connections": max_connections},
    )
    return {
        "http": protocol,
        "timeout_keep_alive": keep_alive_s,
        "backlog": BACKLOG,
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
    }
