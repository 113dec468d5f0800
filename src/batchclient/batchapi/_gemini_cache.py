"""Explicit context caching on the Gemini Batch API: a prefix shared by enough requests of a
remote batch is created once as a ``cachedContents`` resource, every request that shares it
names it (``cachedContent``) and sends only its last turn, and it is deleted when the batch
has ended.

Gemini bills a cached content's tokens at the cached-input price each time a request reads it,
and its storage by the token-hour (Gemini's pricing page: $1.00 per million tokens per hour
for Gemini 2.5 Flash, $4.50 for 2.5 Pro); a read saves the difference between the batch input
price and the cached price ($0.15 - $0.03 and $0.625 - $0.125 per million). An hour's storage
is paid back by about 8 (Flash) to 9 (Pro) reads, so ``prompt_caching="auto"`` creates one
only for a prefix that :data:`AUTO_MIN_REQUESTS` requests of the batch share; ``True`` for any
prefix two share. Below that, Gemini 2.5 and newer cache implicitly (nothing to send).

The prefix of a request is what a cached content can hold and what a request that reads one
may not set itself (Gemini refuses ``systemInstruction``, ``tools`` or ``toolConfig`` next to
``cachedContent``): those three and every turn but the last. It is cached only when it reaches
the model's minimum (:func:`min_tokens`), estimated at :data:`BYTES_PER_TOKEN` bytes of JSON per
token; a create Gemini refuses anyway (a prefix too short after all, a model without explicit
caching) leaves its requests as they were.

Each cached content lives :data:`TTL_S` seconds, extended while its batch runs (a poll renews
it once :data:`RENEW_AFTER_S` have passed), and is named after its batch's display name
(``<batch display name> prefix <n>``), so the batch's end finds every one made for it (a
create retried or made by a process that stopped before the batch) with one list call.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "AUTO_MIN_REQUESTS",
    "BYTES_PER_TOKEN",
    "RENEW_AFTER_S",
    "TTL_S",
    "SharedPrefix",
    "cache_name_prefix",
    "min_tokens",
    "reading",
    "shared_prefixes",
]

AUTO_MIN_REQUESTS = 10
"""Requests of one batch that must share a prefix before ``"auto"`` caches it: one hour of
storage paid back with room to spare (module docstring)."""

BYTES_PER_TOKEN = 4
"""Bytes of JSON per token for the length estimate (about 4 characters of English per token;
the JSON's punctuation makes it an overestimate, erring toward caching: a refused create
costs one call)."""

TTL_S = 3600
"""Seconds a cached content lives from its creation or last renewal (Gemini's default TTL)."""

RENEW_AFTER_S = 1200.0
"""Seconds between renewals of a running batch's cached contents."""

_PREFIX_FIELDS = ("systemInstruction", "tools", "toolConfig")

_MIN_TOKENS: tuple[tuple[str, int], ...] = (("gemini-2.5-", 2048),)
_DEFAULT_MIN_TOKENS = 4096


def min_tokens(model: str) -> int:
    """The shortest prefix ``model`` caches, in tokens, from Gemini's context caching guide:
    2,048 for Gemini 2.5 Flash and Pro, 4,096 for Gemini 3 and later (the guide's table has
    changed over time; the higher figure is kept where it did). ``models/`` is ignored."""
    name = model.removeprefix("models/")
    for prefix, tokens in _MIN_TOKENS:
        if name.startswith(prefix):
            return tokens
    return _DEFAULT_MIN_TOKENS


@dataclass
class SharedPrefix:
    """One prefix to cache: ``content`` (the cached content's ``contents``,
    ``systemInstruction``, ``tools``, ``toolConfig``) and the positions of the requests
    sharing it."""

    content: dict[str, Any]
    requests: list[int] = field(default_factory=list)


def _prefix(request: dict[str, Any]) -> dict[str, Any] | None:
    """The part of a ``GenerateContentRequest`` a cached content would hold, or None."""
    contents = request.get("contents")
    if not isinstance(contents, list) or not contents or "cachedContent" in request:
        return None
    prefix = {key: request[key] for key in _PREFIX_FIELDS if key in request}
    if len(contents) > 1:
        prefix["contents"] = contents[:-1]
    if "contents" not in prefix and "systemInstruction" not in prefix:
        return None  # tools alone are no prompt to cache
    return prefix


def shared_prefixes(
    requests: list[dict[str, Any]], model: str, min_requests: int
) -> list[SharedPrefix]:
    """The prefixes of ``requests`` (``GenerateContentRequest`` objects of one model) worth a
    cached content: at least :func:`min_tokens` long and shared by at least ``min_requests``
    requests, in order of first use."""
    least = min_tokens(model) * BYTES_PER_TOKEN
    groups: dict[bytes, SharedPrefix] = {}
    for at, request in enumerate(requests):
        prefix = _prefix(request)
        if prefix is None:
            continue
        data = orjson.dumps(prefix, option=orjson.OPT_SORT_KEYS)
        if len(data) < least:
            continue
        digest = hashlib.blake2b(data, digest_size=16).digest()
        groups.setdefault(digest, SharedPrefix(prefix)).requests.append(at)
    return [group for group in groups.values() if len(group.requests) >= min_requests]


def reading(request: dict[str, Any], name: str) -> dict[str, Any]:
    """``request`` reading the cached content ``name`` instead of sending its prefix."""
    out = {key: value for key, value in request.items() if key not in _PREFIX_FIELDS}
    out["contents"] = request["contents"][-1:]
    out["cachedContent"] = name
    return out


def cache_name_prefix(batch_display_name: str) -> str:
    """The display names of the cached contents made for a batch start with this."""
    return f"{batch_display_name} prefix "
