"""The HTTP transport of one replica: an aiohttp ``ClientSession`` (its C parser, llhttp) with
keep-alive connections, behind one call, :meth:`Transport.request`.

- **One session per replica**, opened in the event loop on first use. No connection limit of
  its own (the dispatcher is the only queue, so a request's timeout starts when it is sent), no
  cookies, no redirects (a 3xx is the item's error: following one would turn a POST into a GET),
  idle connections closed after ``keepalive_expiry_s`` (a NAT or load balancer that silently
  drops idle connections would otherwise cost the next request its whole timeout).
- **The proxy is resolved once** (``_urls.resolve_proxy``) and passed to every request;
  aiohttp's ``trust_env=True`` looks it up on every request, which halved its rate.
- **A stale pooled connection** (the server closed it as the request went out: reset or closed
  before any byte of the answer) is retried once on a fresh connection; it is not a failure of
  the replica (the server never saw the request). Go's ``net/http`` and RFC 9112 §9.3.1.1 do
  the same for requests that were not answered at all.
- **Size cap**: an answer larger than ``max_response_bytes`` (decompressed) raises
  :class:`ResponseTooLarge` as soon as that many bytes have been read; the connection is
  dropped. Bodies are read chunk by chunk, so a large answer never blocks the event loop.
- **Errors**: :class:`HttpError` (no usable answer: connect failure, reset, malformed HTTP, TLS,
  proxy), :class:`HttpTimeout` (no complete answer within the request's timeout). Messages are
  built here from the exception's parts and scrubbed of secrets: never the request URL's
  userinfo or query.
"""

from __future__ import annotations

import contextvars
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import client_exceptions as errors
from yarl import URL

from ._urls import Address, Redactor

__all__ = ["HttpError", "HttpResponse", "HttpTimeout", "ResponseTooLarge", "Transport"]


class HttpError(Exception):
    """No usable answer: could not connect, reset, malformed HTTP, TLS or proxy failure.
    ``refused``: the connection was refused (nothing listens at that address: no server, or
    one restarting), which is not a slow or failing server."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class HttpTimeout(Exception):
    """No complete answer within the timeout (counted from when the request was sent)."""


class ResponseTooLarge(Exception):
    """The answer is larger than the cap (``limit`` bytes)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer is larger than {limit:,} bytes (max_response_bytes)")
        self.limit = limit


@dataclass(slots=True)
class HttpResponse:
    """``headers`` is case-insensitive (aiohttp's ``CIMultiDictProxy``)."""

    status: int
    headers: Mapping[str, str]
    body: bytes | bytearray


# Connections this task has opened (a count that only grows): a request that failed on a
# connection it did not open itself was sent on a pooled one. Read twice per request, only
# written when a connection is opened, which is rare with keep-alive.
_opened: contextvars.ContextVar[int] = contextvars.ContextVar("batchclient_opened", default=0)


class _Connector(aiohttp.TCPConnector):
    """Counts the connections each task opens (``_opened``)."""

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:  # noqa: ASYNC109
        _opened.set(_opened.get() + 1)
        return await super()._create_connection(req, traces, timeout)


_SEND_ERRORS = (aiohttp.ClientError, ValueError, TimeoutError)


class Transport:
    """Keep-alive HTTP(S) connections to one replica.

    Args:
        address: the replica (``_urls.parse_address``).
        headers: sent with every request (already checked).
        redactor: scrubs secrets from error messages.
        ssl: ``True`` (system CAs), ``False`` (no verification) or an ``SSLContext``.
        proxy: the proxy URL for this replica, or None; ``proxy_authorization`` its header.
        connect_timeout_s: seconds to open a connection (also bounded by the request's own).
        keepalive_expiry_s: idle connections are closed after this many seconds.
        max_response_bytes: the largest answer read (decompressed), in bytes.
    """

    def __init__(
        self,
        address: Address,
        headers: Mapping[str, str],
        redactor: Redactor,
        *,
        ssl: ssl.SSLContext | bool = True,
        proxy: URL | None = None,
        proxy_authorization: str | None = None,
        connect_timeout_s: float = 30.0,
        keepalive_expiry_s: float = 10.0,
        max_response_bytes: int = 64 << 20,
    ) -> None:
        self.address = address
        self._headers = dict(headers)
        self.redactor = redactor
        self._ssl = ssl
        self._proxy = None if proxy is None else proxy.with_user(None).with_password(None)
        self._proxy_headers = (
            {"Proxy-Authorization": proxy_authorization} if proxy_authorization else None
        )
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_expiry_s = keepalive_expiry_s
        self.max_response_bytes = max_response_bytes
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def _open(self, *, fresh: bool = False) -> aiohttp.ClientSession:
        keepalive: dict[str, Any] = (
            {"force_close": True} if fresh else {"keepalive_timeout": self._keepalive_expiry_s}
        )
        connector = _Connector(limit=0, ssl=self._ssl, **keepalive)
        return aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,  # proxies are resolved once, in _urls
        )

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = self._timeouts[seconds] = aiohttp.ClientTimeout(
                total=seconds, sock_connect=min(self._connect_timeout_s, seconds)
            )
        return timeout

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,  # noqa: ASYNC109 (aiohttp's own timer: one handle per request)
        root: bool = False,
    ) -> HttpResponse:
        """Send one request to ``path`` (relative to the base path, e.g. ``/chat/completions``;
        with ``root``, relative to the server root, e.g. ``/tokenize``; the base URL's query and
        ``default_query`` are added) and read the whole answer.

        Raises:
            HttpError: connect failure, reset or closed connection, malformed answer, TLS or
                proxy failure.
            HttpTimeout: no complete answer within ``timeout`` seconds of starting to send.
            ResponseTooLarge: the answer is over ``max_response_bytes``.
        """
        key = f"root:{path}" if root else path
        url = self._urls.get(key)
        if url is None:
            url = self.address.root_url(path) if root else self.address.url(path)
            self._urls[key] = url
        session = self._session
        if session is None:
            session = self._session = self._open()
        # sent and read here, in one coroutine: this runs once per request
        opened = _opened.get()
        try:
            resp = await session.request(
                method,
                url,
                data=body,
                timeout=self._timeout(timeout),
                allow_redirects=False,
                proxy=self._proxy,
                proxy_headers=self._proxy_headers,
            )
        except _SEND_ERRORS as exc:
            if not _stale(exc) or _opened.get() != opened:
                raise self._send_failure(exc) from None
            resp = await self._send_fresh(method, url, body, timeout)
        try:
            length = resp.content_length
            if (
                length is not None
                and length <= self.max_response_bytes
                and "Content-Encoding" not in resp.headers
            ):
                data: bytes | bytearray = await resp.read()  # framed, uncompressed, small
            else:
                data = await self._read(resp)
        except TimeoutError:
            resp.close()
            raise HttpTimeout() from None
        except aiohttp.ClientError as exc:
            resp.close()
            raise HttpError(self._describe(exc)) from None
        except BaseException:  # too large, or cancelled: an answer may still be on its way
            resp.close()
            raise
        resp.release()
        return HttpResponse(resp.status, resp.headers, data)

    async def _send_fresh(
        self,
        method: str,
        url: URL,
        body: bytes | None,
        timeout: float,  # noqa: ASYNC109
    ) -> aiohttp.ClientResponse:
        """Send again on a new connection, after a pooled one went stale."""
        fresh = self._fresh
        if fresh is None:
            fresh = self._fresh = self._open(fresh=True)
        try:
            return await fresh.request(
                method,
                url,
                data=body,
                timeout=self._timeout(timeout),
                allow_redirects=False,
                proxy=self._proxy,
                proxy_headers=self._proxy_headers,
            )
        except _SEND_ERRORS as exc:
            raise self._send_failure(exc) from None

    def _send_failure(self, exc: BaseException) -> Exception:
        """What a failure to send (no answer yet) raises: ``HttpTimeout`` or ``HttpError``."""
        if isinstance(exc, TimeoutError) and not isinstance(exc, errors.ClientOSError):
            if isinstance(exc, errors.ConnectionTimeoutError):
                return HttpError(f"cannot connect to {self._where()}: timed out")
            return HttpTimeout()
        refused = isinstance(exc, errors.ClientConnectorError) and isinstance(
            exc.os_error, ConnectionRefusedError
        )
        return HttpError(self._describe(exc), refused=refused)

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes | bytearray:
        cap = self.max_response_bytes
        length = resp.content_length
        if length is not None:
            if length > cap:
                raise ResponseTooLarge(cap)
            if "Content-Encoding" not in resp.headers:
                return await resp.read()  # the common case: framed, uncompressed, small
        content = resp.content
        data = bytearray()
        while chunk := await content.readany():
            if len(data) + len(chunk) > cap:
                raise ResponseTooLarge(cap)
            data += chunk
        return data

    def _where(self) -> str:
        return self.address.display

    def _describe(self, exc: BaseException) -> str:
        """A message from the exception's parts (aiohttp's own ``str`` of some errors shows
        the request URL, query included), scrubbed of secrets."""
        if isinstance(exc, errors.ClientProxyConnectionError):
            text = f"cannot connect to the proxy {exc.host}:{exc.port}: {exc.os_error}"
        elif isinstance(exc, errors.ClientConnectorCertificateError):
            text = f"TLS certificate of {exc.host}:{exc.port} refused: {exc.certificate_error}"
        elif isinstance(exc, errors.ClientConnectorError):
            text = f"cannot connect to {exc.host}:{exc.port}: {exc.os_error}"
        elif isinstance(exc, errors.ClientHttpProxyError):
            text = f"the proxy refused the tunnel: HTTP {exc.status} {exc.message}"
        elif isinstance(exc, errors.ServerDisconnectedError):
            text = "the server closed the connection before answering"
        elif isinstance(exc, errors.ClientResponseError):
            text = f"malformed HTTP answer: {exc.message}"
        elif isinstance(exc, errors.ClientPayloadError):
            text = f"malformed answer body: {exc}"
        else:
            text = f"{type(exc).__name__}: {exc}"
        return self.redactor.text(text)

    async def close(self) -> None:
        """Close every connection (idle and busy)."""
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None


def _stale(exc: BaseException) -> bool:
    """Whether a failure to send is what a pooled connection the server closed meanwhile gives
    (reset or closed before any byte of the answer; never a failure to connect)."""
    return isinstance(
        exc, errors.ServerDisconnectedError | errors.ClientOSError
    ) and not isinstance(exc, errors.ClientConnectorError)
