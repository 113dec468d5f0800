"""What the transport sends, checked once at construction: replica URLs, headers, proxies,
and the secrets that must never be kept.

- **Base URL**: ``http://`` or ``https://``. ``user:password@`` in it becomes a Basic
  ``Authorization`` header and is removed from every URL batchclient shows or stores (error
  messages, ``replica_stats``, a job's provider identity): those use :attr:`Address.display`,
  ``scheme://host[:port]/path`` without userinfo or query.
- **Query**: the base URL's own query string (Azure OpenAI's ``?api-version=...``) and
  ``default_query`` are sent on every path; ``default_query`` wins on a repeated name.
- **Headers**: names must be RFC 9110 tokens, values free of control characters (CR, LF, NUL,
  ...) and encodable as latin-1, else :class:`~batchclient.ConfigurationError` naming the header
  and never echoing its value (a CR/LF in a value is a header injection). Framing headers
  (``Host``, ``Content-Length``, ``Transfer-Encoding``, ``Connection``) belong to the transport.
  The API key is stripped of surrounding whitespace (a key read from a file ends in a newline).
- **Secrets**: the API key, URL and proxy passwords, the values of credential-like headers and
  of query parameters named like secrets (``api_key``, ``key``, ``token``, ``access_token``,
  ``sig``, ``signature``, ``password``, ``secret``, ``x-api-key``, ...; see
  :func:`is_secret_name`) are collected in a :class:`Redactor`, which scrubs them from error
  messages and from upstream error bodies before they are stored (a server's 400 may echo the
  request's headers or its request line). Whatever their value, ``name=value`` pairs with
  such names in a URL's query are shown as ``name=[redacted]`` (:func:`redact_query`), like
  ``user:password@`` is removed.
- **Proxies**: ``proxy=`` for every replica, else (with ``trust_env``) the environment's
  ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` honouring ``NO_PROXY``, resolved once per
  replica (aiohttp's ``trust_env=True`` looks them up on every request).
"""

from __future__ import annotations

import base64
import re
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from yarl import URL

from .._redact import (
    PAIR,
    USERINFO,
    is_secret_name,
    redact_query,
    redact_query_raw,
    redact_url,
)
from ..errors import ConfigurationError

__all__ = [
    "Address",
    "Redactor",
    "check_headers",
    "clean_api_key",
    "is_secret_name",
    "parse_address",
    "redact_query",
    "resolve_proxy",
]

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # every C0 control but HTAB, and DEL
_FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection", "upgrade"})
# Header names whose values are credentials (scrubbed like the API key).
_CREDENTIAL_WORDS = ("auth", "key", "token", "secret", "password", "cookie", "signature")


def _shown(url: str) -> str:
    """A URL that could not be parsed, as a message may show it: no userinfo, no secrets."""
    return redact_url(url.strip())


@dataclass(frozen=True)
class Address:
    """One replica's URL, taken apart. ``origin`` is ``scheme://host:port``; ``path`` the base
    path without a trailing slash (``/v1``); ``query`` the base URL's query plus
    ``default_query`` (encoded); ``display`` the URL as shown and stored (no userinfo, no query);
    ``basic_auth`` the ``Authorization`` value from the URL's userinfo, if any; ``secrets`` the
    values of its secret-named query parameters (as written and decoded), for the redactor."""

    origin: str
    path: str
    query: str
    display: str
    basic_auth: str | None
    password: str | None
    secrets: tuple[str, ...] = ()

    def url(self, path: str) -> URL:
        """The full URL of ``path`` (relative to the base path, e.g. ``/chat/completions``)."""
        query = f"?{self.query}" if self.query else ""
        return URL(f"{self.origin}{self.path}{path}{query}")

    def root_url(self, path: str) -> URL:
        """The full URL of ``path`` next to the API root rather than under it (vLLM's
        ``/tokenize`` beside ``/v1``): the base path without a trailing ``/v1``."""
        query = f"?{self.query}" if self.query else ""
        return URL(f"{self.origin}{self.path.removesuffix('/v1')}{path}{query}")


def parse_address(url: str, default_query: Mapping[str, str] | None = None) -> Address:
    """Raises ``ConfigurationError`` for anything but an ``http(s)://host`` URL (the message
    shows the URL without its userinfo and secret query values)."""
    try:
        parts = urlsplit(url.strip())
        hostname = parts.hostname
    except ValueError as exc:  # "http://[::1": an unclosed IPv6 bracket
        raise ConfigurationError(f"not a valid URL: {_shown(url)!r} ({exc})") from None
    hostport = parts.netloc.rpartition("@")[2]
    shown = f"{parts.scheme}://{hostport}{parts.path.rstrip('/')}"
    if parts.scheme not in ("http", "https") or not hostname:
        raise ConfigurationError(f"not an http(s) URL: {shown!r}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"{shown}: bad port") from None
    basic = None
    if parts.username is not None or parts.password is not None:
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        basic = f"Basic {token}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    if default_query:
        given = {str(k): str(v) for k, v in default_query.items()}
        query = [(k, v) for k, v in query if k not in given] + list(given.items())
    del port  # checked: yarl takes the host and port as written
    encoded = urlencode(query)
    # each secret as decoded, as written and as sent (what an upstream would echo)
    secrets = {v for k, v in query if is_secret_name(k)}
    for text in (f"?{parts.query}", f"?{encoded}"):
        secrets |= {m[3] for m in PAIR.finditer(text) if is_secret_name(m[2])}
    return Address(
        origin=f"{parts.scheme}://{hostport}",
        path=parts.path.rstrip("/"),
        query=encoded,
        display=shown,
        basic_auth=basic,
        password=unquote(parts.password) if parts.password else None,
        secrets=tuple(sorted(s for s in secrets if s)),
    )


def clean_api_key(api_key: str | None) -> str | None:
    """The key without surrounding whitespace (None for an empty one); raises
    ``ConfigurationError`` (without the key) when a control character is left inside it."""
    if api_key is None:
        return None
    key = api_key.strip()
    if _CONTROL.search(key):
        raise ConfigurationError("api_key contains a control character (CR, LF, NUL, ...)")
    try:
        key.encode("latin-1")
    except UnicodeEncodeError:
        raise ConfigurationError("api_key is not latin-1 text (it becomes a header)") from None
    return key or None


def check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers as a plain dict, each one checked (see the module docstring). Raises
    ``ConfigurationError`` naming the first bad header; never shows a value."""
    checked: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not _TOKEN.match(name):
            raise ConfigurationError(f"header name {name!r} is not a valid HTTP token")
        if name.lower() in _FRAMING:
            raise ConfigurationError(f"header {name!r} is set by the transport, not by callers")
        if not isinstance(value, str):
            raise ConfigurationError(f"header {name!r}: the value must be a string")
        if _CONTROL.search(value):
            raise ConfigurationError(
                f"header {name!r}: the value contains a control character (CR, LF, NUL, ...)"
            )
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            raise ConfigurationError(f"header {name!r}: the value is not latin-1 text") from None
        checked[name] = value
    return checked


def resolve_proxy(url: URL, proxy: str | None, trust_env: bool) -> URL | None:
    """The proxy for requests to ``url``: ``proxy`` when given; else, with ``trust_env``, the
    environment's proxy for its scheme (``ALL_PROXY`` as a fallback) unless ``NO_PROXY``
    covers the host; else None. Raises ``ConfigurationError`` for a proxy aiohttp cannot use
    (only ``http://`` and ``https://`` proxies are supported; no SOCKS)."""
    if proxy is None and trust_env:
        found = urllib.request.getproxies()
        host = url.raw_host or ""
        netloc = f"{host}:{url.port}" if url.explicit_port else host
        bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
        if found and not bypass(netloc, found):
            proxy = found.get(url.scheme) or found.get("all")
    if not proxy:
        return None
    parsed = URL(proxy)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        shown = str(parsed.with_user(None)) if parsed.host else "the proxy"
        raise ConfigurationError(f"{shown}: only http:// and https:// proxies are supported")
    return parsed


def proxy_authorization(proxy: URL | None) -> str | None:
    """The ``Proxy-Authorization`` value for a proxy URL with ``user:password@``."""
    if proxy is None or (proxy.user is None and proxy.password is None):
        return None
    token = f"{proxy.user or ''}:{proxy.password or ''}".encode()
    return f"Basic {base64.b64encode(token).decode('ascii')}"


class Redactor:
    """Scrubs secrets from text that batchclient keeps or shows (see the module docstring).
    Secrets shorter than 6 characters are not scrubbed (they would match ordinary text)."""

    def __init__(self, secrets: set[str]) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= 6}, key=len, reverse=True)
        self._raw = [s.encode("utf-8", "replace") for s in self._secrets]

    @classmethod
    def of(cls, headers: Mapping[str, str], *extra: str | None) -> Redactor:
        """The secrets among ``headers`` (credential-like names) and ``extra`` values."""
        found: set[str] = {s for s in extra if s}
        for name, value in headers.items():
            lower = name.lower()
            if any(word in lower for word in _CREDENTIAL_WORDS):
                found.add(value)
                scheme, _, credential = value.partition(" ")
                if credential and scheme.isalpha():
                    found.add(credential.strip())  # "Bearer sk-...": the key on its own too
                    if scheme.lower() == "basic":
                        found.update(_basic_parts(credential.strip()))
        return cls(found)

    def text(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "[redacted]")
        return redact_query(USERINFO.sub(r"\1", text))

    def raw(self, raw: bytes | bytearray) -> bytes | bytearray:
        for secret in self._raw:
            if secret in raw:
                raw = raw.replace(secret, b"[redacted]")
        return redact_query_raw(raw)

    def excerpt(self, raw: bytes | bytearray, limit: int = 200) -> str:
        """The start of ``raw`` for a message: scrubbed first (a secret across the cut would
        otherwise show in part), then cut."""
        longest = len(self._raw[0]) if self._raw else 0
        return repr(bytes(self.raw(raw[: limit + longest])[:limit]))


def _basic_parts(token: str) -> set[str]:
    try:
        decoded = base64.b64decode(token, validate=True).decode("utf-8")
    except ValueError:
        return set()
    password = decoded.partition(":")[2]
    return {decoded, password} if password else {decoded}
