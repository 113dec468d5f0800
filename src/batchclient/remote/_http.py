"""A lean HTTP/1.1 keep-alive client for one endpoint: the remote provider's hot path.

Each request is one ``transport.write``; the answer (status line, headers, a ``Content-Length``,
chunked or close-delimited body, gzip/deflate) is parsed in an ``asyncio.Protocol``. Supported:
``http://`` and ``https://``, keep-alive reuse (connections the server closed while idle are
dropped). Not supported: proxies, redirects, ``Expect: 100-continue``, HTTP/2.

Every connection carries one request at a time; the pool opens a new one when none is idle (the
limits upstream bound how many). A timeout or a cancellation closes that connection, so the
server sees the client leave and no late answer is read as the next request's. Why not
aiohttp, httpx or the openai SDK, with the figures: ``docs/remote.md`` ("The HTTP path").
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["HttpError", "HttpResponse", "HttpTimeout", "Pool"]


class HttpError(Exception):
    """The connection failed: could not connect, was reset, or the answer was not HTTP."""


class HttpTimeout(Exception):
    """No complete answer within the timeout (counted from when the request was sent)."""


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


class _Conn(asyncio.Protocol):
    """One connection. States: idle (in the pool), busy (``waiter`` set), closed."""

    __slots__ = (
        "_chunked",
        "_head",
        "_length",
        "_until_close",
        "buf",
        "closed",
        "transport",
        "waiter",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[HttpResponse] | None = None
        self.closed = False
        self._head: tuple[int, dict[str, str]] | None = None
        self._length = -1
        self._chunked = False
        self._until_close = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if self._until_close and self._head is not None:
                status, headers = self._head
                self._finish(HttpResponse(status, headers, bytes(self.buf)))
            else:
                reason = f": {exc}" if exc else ""
                waiter.set_exception(HttpError(f"connection closed before the answer{reason}"))

    def send(self, data: bytes, waiter: asyncio.Future[HttpResponse]) -> None:
        self.waiter = waiter
        self._head = None
        self.buf.clear()
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        self.buf += data
        try:
            self._parse()
        except (ValueError, IndexError) as exc:
            self._fail(HttpError(f"malformed HTTP answer: {exc}"))

    def _fail(self, exc: Exception) -> None:
        waiter = self.waiter
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _parse(self) -> None:
        buf = self.buf
        if self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            del buf[: end + 4]
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                raise ValueError(f"bad status line {lines[0][:80]!r}")
            status = int(parts[1])
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if 100 <= status < 200:  # an interim answer: the real one follows
                self._parse()
                return
            self._head = (status, headers)
            self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            length = headers.get("content-length")
            self._length = int(length) if length is not None and not self._chunked else -1
            self._until_close = self._length < 0 and not self._chunked
            if status in (204, 304):
                self._length, self._until_close = 0, False
        status, headers = self._head
        if self._length >= 0:
            if len(buf) < self._length:
                return
            body = bytes(buf[: self._length])
            del buf[: self._length]
        elif self._chunked:
            body_or_none = _dechunk(buf)
            if body_or_none is None:
                return
            body = body_or_none
        else:
            return  # read until the server closes (connection_lost finishes it)
        self._finish(HttpResponse(status, headers, body))

    def _finish(self, response: HttpResponse) -> None:
        encoding = response.headers.get("content-encoding", "").lower()
        if encoding in ("gzip", "deflate"):
            try:
                response.body = zlib.decompress(response.body, 47)  # 47: auto-detect gzip/zlib
            except zlib.error as exc:
                self._fail(HttpError(f"bad {encoding} body: {exc}"))
                return
        if self._until_close or response.headers.get("connection", "").lower() == "close":
            self.close()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(response)


def _dechunk(buf: bytearray) -> bytes | None:
    """The body of a complete chunked message at the start of ``buf`` (consumed), else None."""
    out = bytearray()
    pos = 0
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        start = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)  # trailers end with an empty line
            if end < 0:
                return None
            del buf[: end + 4]
            return bytes(out)
        if len(buf) < start + size + 2:
            return None
        out += buf[start : start + size]
        pos = start + size + 2


class Pool:
    """Keep-alive connections to one ``scheme://host:port``; ``request`` sends one request.

    Args:
        url: any URL on the server (only scheme, host and port are used).
        headers: sent with every request (``Host``, ``Content-Length`` and ``Connection`` are
            added here).
        connect_timeout: seconds to open a connection (part of the request's own timeout too).
        ssl_context: for ``https://``; default ``ssl.create_default_context()`` (system CAs).
    """

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        *,
        connect_timeout: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.ssl = ssl_context or ssl.create_default_context()
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        name = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        host_header = name if default_port else f"{name}:{self.port}"
        lines = [f"Host: {host_header}", "Connection: keep-alive", "Accept-Encoding: gzip"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._fixed = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self.connect_timeout = connect_timeout
        self._idle: deque[_Conn] = deque()
        self._all: set[_Conn] = set()

    async def _connect(self, limit_s: float) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    _Conn,
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                ),
                limit_s,
            )
        except (OSError, ssl.SSLError) as exc:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        except TimeoutError:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: timed out") from None
        return conn

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        timeout: float,  # noqa: ASYNC109 (one timer handle per request is cheaper than a scope)
    ) -> HttpResponse:
        """Send one request and read the whole answer.

        Raises:
            HttpError: connect failure, reset or closed connection, malformed answer.
            HttpTimeout: no complete answer within ``timeout`` seconds of starting to send.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[HttpResponse] = loop.create_future()
        timer = loop.call_later(timeout, _expire, waiter)
        conn: _Conn | None = None
        try:
            idle = self._idle
            while idle:
                candidate = idle.pop()  # most recently used: the warmest connection
                if not candidate.closed:
                    conn = candidate
                    break
                self._all.discard(candidate)
            if conn is None:
                conn = await self._connect(min(self.connect_timeout, timeout))
                self._all.add(conn)
                if waiter.done():  # the request's time ran out while connecting
                    waiter.result()
            head = f"{method} {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n"
            conn.send(head.encode("latin-1") + self._fixed + b"\r\n" + body, waiter)
            response = await waiter
        except BaseException:
            if conn is not None:  # an answer may still be on its way: never reuse it
                conn.waiter = None
                conn.close()
                self._all.discard(conn)
            raise
        finally:
            timer.cancel()
        if conn.closed:
            self._all.discard(conn)
        else:
            self._idle.append(conn)
        return response

    def close(self) -> None:
        """Close every connection (idle and busy)."""
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()


def _expire(waiter: asyncio.Future[HttpResponse]) -> None:
    if not waiter.done():
        waiter.set_exception(HttpTimeout())
