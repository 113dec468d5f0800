"""Secrets out of URLs that batchclient shows, logs or stores, by their place in the URL:

- ``user:password@`` (userinfo) is removed;
- the value of a query parameter named like a secret (:func:`is_secret_name`: ``api_key``,
  ``key``, ``token``, ``access_token``, ``sig``, ``signature``, ``password``, ``secret``,
  ``x-api-key``, ``X-Amz-Signature``, ... case-insensitive) becomes ``[redacted]``, whatever
  the value (even one too short for literal scrubbing).

Used by the remote provider (its ``Redactor`` also scrubs the literal secrets it knows) and the
Batch API client. Pure functions over text; nothing here knows about HTTP clients.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = [
    "PAIR",
    "USERINFO",
    "is_secret_name",
    "redact_query",
    "redact_query_raw",
    "redact_url",
]

USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]*@")
# Words that make a query parameter's value a credential when they are a whole part of its
# name (split on "-", "_", "."): api_key, x-api-key, access_token, sig, X-Amz-Signature.
_SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "accesstoken", "secret", "password", "passwd", "pwd", "sig",
     "signature", "credential", "credentials", "auth"}
)  # fmt: skip
_NAME_PARTS = re.compile(r"[-_.]+")
# One query pair in text: after "?", "&" or ";", up to the next separator, space or quote.
PAIR = re.compile(r"([?&;])([^=&;#?\s\"'<>]+)=([^&;#\s\"'<>]*)")
_PAIR_RAW = re.compile(rb"([?&;])([^=&;#?\s\"'<>]+)=([^&;#\s\"'<>]*)")


def is_secret_name(name: str) -> bool:
    """Whether a query parameter's value is a credential, by its name (case-insensitive)."""
    lower = unquote(name).lower()
    return lower in _SECRET_WORDS or any(p in _SECRET_WORDS for p in _NAME_PARTS.split(lower))


def redact_query(text: str) -> str:
    """``text`` with the value of every secret-named query pair replaced by ``[redacted]``."""
    return PAIR.sub(_redact_pair, text)


def _redact_pair(match: re.Match[str]) -> str:
    sep, name, value = match.groups()
    return f"{sep}{name}=[redacted]" if value and is_secret_name(name) else match.group(0)


def _redact_pair_raw(match: re.Match[bytes]) -> bytes:
    sep, name, value = match.groups()
    secret = value and is_secret_name(name.decode("latin-1"))
    return sep + name + b"=[redacted]" if secret else match.group(0)


def redact_query_raw(raw: bytes | bytearray) -> bytes | bytearray:
    """:func:`redact_query` of raw bytes (an upstream's answer, before it is kept)."""
    if b"=" not in raw:
        return raw
    return _PAIR_RAW.sub(_redact_pair_raw, raw)


def redact_url(text: str) -> str:
    """``text`` (a URL, or a message quoting some) without userinfo or secret query values."""
    return redact_query(USERINFO.sub(r"\1", text))
