"""What makes two requests "the same": canonical JSON, request digests and cache keys.

- :func:`canonical_json`: sorted keys, no whitespace, and integral floats written as integers
  (``0.0`` and ``0`` are one JSON number; RFC 8785, the JSON Canonicalization Scheme, writes
  numbers the same way), so two bodies that mean the same thing give the same bytes.
- :func:`request_digest`: SHA-256 of the endpoint and the canonical body (plus the tool prompt
  format, which changes the prompt without being in the body). Identical lines of a batch file
  have the same digest.
- :func:`is_deterministic`: whether identical requests get identical answers (``temperature``
  0, or an embeddings request). Only those are merged; sampled requests never are.
- :func:`cache_key`: the result cache's key: the digest, the provider's cache identity (which
  weights, which engine settings) and the repeat index (the k-th identical sampled request of a
  call or file is its own entry, so k samples stay k samples).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from .._core.request import Request
from ..types import Endpoint

__all__ = ["cache_key", "canonical_json", "is_deterministic", "number_repeats", "request_digest"]

_MAX_EXACT = 2**53  # integral floats beyond this are not exact integers in JSON parsers
# orjson writes an integral float below 1e16 (so every one below 2**53) as "1.0": without this
# pattern no float needs rewriting, and the walk over the value is skipped (the common case)
_INTEGRAL_FLOAT = re.compile(rb"\d\.0[,\]}]")


def _normalise(value: Any) -> Any:
    if isinstance(value, float):
        if value.is_integer() and abs(value) < _MAX_EXACT:
            return int(value)
        return value
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    return value


def canonical_json(value: Any) -> bytes:
    """``value`` as canonical JSON bytes: keys sorted at every level, no whitespace, UTF-8,
    integral floats as integers. Values orjson cannot write (integers over 64 bits) fall back to
    the standard library with the same rules."""
    try:
        raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        if _INTEGRAL_FLOAT.search(raw) is None:
            return raw
        return orjson.dumps(_normalise(value), option=orjson.OPT_SORT_KEYS)
    except TypeError:
        value = _normalise(value)
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
        )
        return text.encode()


def request_digest(
    endpoint: str, body: dict[str, Any], tool_prompt_format: str | None = None
) -> bytes:
    """SHA-256 (32 bytes) of what is asked: the endpoint, the canonical body and, when tools are
    written into the prompt, the format they are written in."""
    digest = hashlib.sha256(str(endpoint).encode())
    digest.update(b"\n")
    digest.update(canonical_json(body))
    if tool_prompt_format is not None:
        digest.update(b"\ntool_prompt_format=" + str(tool_prompt_format).encode())
    return digest.digest()


def is_deterministic(endpoint: str, body: dict[str, Any]) -> bool:
    """Whether identical requests get identical answers, so they may be sent once: an
    embeddings request, or ``temperature`` set to 0 (greedy decoding). A body without
    ``temperature`` is sampled (OpenAI's default is 1; servers may take it from the model's
    generation config), so it is not."""
    if endpoint == Endpoint.embeddings:
        return True
    temperature = body.get("temperature")
    return (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and (temperature == 0)
    )


def cache_key(digest: bytes, identity: bytes, repeat: int) -> str:
    """The result cache's key (64 hex characters) for a request digest, the provider's cache
    identity (canonical JSON bytes) and the repeat index."""
    h = hashlib.sha256(digest)
    h.update(b"\n")
    h.update(identity)
    h.update(b"\nrepeat=%d" % repeat)
    return h.hexdigest()


def number_repeats(requests: Iterable[Request]) -> Iterator[Request]:
    """``requests`` with ``repeat`` set: the k-th sampled request identical to earlier ones of
    the same call gets ``k`` (deterministic ones keep 0: one answer serves them all)."""
    seen: dict[bytes, int] = {}
    for request in requests:
        if request.error is None and not is_deterministic(request.endpoint, request.body):
            fmt = None if request.tool_prompt_format is None else str(request.tool_prompt_format)
            digest = request_digest(request.endpoint, request.body, fmt)
            request.repeat = seen.get(digest, 0)
            seen[digest] = request.repeat + 1
        yield request
