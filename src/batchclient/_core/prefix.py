"""The shared prefix of a request, as a key: what requests that an engine could serve from the
same cached KV blocks have in common.

- **Scoring** (a ``score_span``): the context's token ids, the prompt before the scored
  continuation. The choices of one multiple-choice question share it.
- **Chat**: every message but the last (the system prompt and the few-shot turns before the
  question). A conversation of one message has no prefix worth keying.
- Anything else (text completions, embeddings): no key.

The key is Python's ``hash`` of that prefix: stable within a process, which is where replicas
are chosen (the remote client's dispatcher, the Ray driver); it is never stored or sent.

:func:`group_by_prefix` orders a batch call's requests so that those sharing a prefix are
dispatched one after the other, while the engine's prefix cache still holds it. It groups
within a bounded look-ahead (:data:`LOOK_AHEAD` requests at a time, each group where its first
member was) rather than sorting the whole input: the input is pulled lazily and never
materialised, a request is dispatched at most one look-ahead late, and inputs that are already
grouped (the choices of one question in a row, as lm-evaluation-harness sends them) keep their
order. Results are slotted by index, so callers still get them in input order.

:func:`mark_shared_prefixes` gives the chat requests of such a window whose prefix is long
enough to be cached and shared by another request of the window a ``prompt_cache_key``: a
stable digest of the prefix (the same in every process and run), which providers whose server
routes by it send (``prompt_caching``; OpenAI's prompt caching guide: requests with the same
prefix and key reach the same cache). Batch calls mark each look-ahead window; jobs and
``serve`` each block of lines they read.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from yarl import URL

from ..types import Endpoint
from .request import Request

__all__ = [
    "LOOK_AHEAD",
    "PROMPT_CACHE_MIN_TOKENS",
    "chat_prefix",
    "group_by_prefix",
    "keys_prompt_caches",
    "mark_shared_prefixes",
    "prefix_key",
]

LOOK_AHEAD = 256
"""Requests grouped at a time: a few times a provider's ``max_in_flight()``, so the groups
are dispatched close together, and little enough to cost nothing in memory or latency."""


PROMPT_CACHE_MIN_TOKENS = 1024
"""The shortest prefix given a ``prompt_cache_key``, in tokens: OpenAI caches prompts of 1,024
tokens or more (its prompt caching guide), so a shorter shared prefix gains nothing from one.
Measured in the prefix's JSON at :data:`BYTES_PER_TOKEN`."""

BYTES_PER_TOKEN = 4
"""Bytes of JSON text per token for that estimate (English text runs about 4 characters per
token with OpenAI's tokenizers; JSON punctuation makes it an overestimate of the bytes)."""


_CACHE_KEY_HOSTS = ("api.openai.com",)
_CACHE_KEY_DOMAINS = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")


def keys_prompt_caches(origin: str) -> bool:
    """Whether a server at ``origin`` (``scheme://host:port``) is OpenAI's or Azure OpenAI's,
    whose prompt caches are routed by ``prompt_cache_key`` (``prompt_caching="auto"`` sends it
    to these only: other servers may refuse a field they do not know)."""
    host = (URL(origin).host or "").lower().rstrip(".")
    return host in _CACHE_KEY_HOSTS or host.endswith(_CACHE_KEY_DOMAINS)


def chat_prefix(body: dict[str, Any]) -> bytes | None:
    """A chat body's prefix (every message but the last) as JSON, or None without one."""
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) > 1:
        try:
            return orjson.dumps(messages[:-1])
        except TypeError:  # content orjson cannot encode: the request fails later, unkeyed
            return None
    return None


def prefix_key(request: Request) -> int | None:
    """The key of ``request``'s shared prefix (module docstring), or None when it has none."""
    body = request.body
    if request.score_span is not None:
        start = request.score_span[0]
        prompt = body.get("prompt")
        if start > 0 and isinstance(prompt, list):
            return hash(tuple(prompt[:start]))
        return None
    prefix = chat_prefix(body)
    return None if prefix is None else hash(prefix)


def _chat_prefixes(requests: list[Request]) -> list[bytes | None]:
    """Each request's chat prefix as JSON (:func:`chat_prefix`), None for a request of
    another endpoint or refused before dispatch."""
    return [
        chat_prefix(r.body) if r.endpoint is Endpoint.chat_completions and r.error is None else None
        for r in requests
    ]


def mark_shared_prefixes(
    requests: list[Request], prefixes: list[bytes | None] | None = None
) -> None:
    """Set ``prompt_cache_key`` on every chat request of ``requests`` whose prefix (every
    message but the last) is at least :data:`PROMPT_CACHE_MIN_TOKENS` long and is shared by
    another request of ``requests``: ``"bc-"`` and 32 hex digits of the prefix's BLAKE2b
    digest, so requests with one prefix get one key and different prefixes different keys.
    Requests that share nothing, or share only a short prefix, get none. ``prefixes``: the
    requests' :func:`_chat_prefixes`, when the caller has them already."""
    if len(requests) < 2:
        return
    if prefixes is None:
        prefixes = _chat_prefixes(requests)
    least = PROMPT_CACHE_MIN_TOKENS * BYTES_PER_TOKEN
    seen: dict[bytes, int] = {}
    for prefix in prefixes:
        if prefix is not None and len(prefix) >= least:
            seen[prefix] = seen.get(prefix, 0) + 1
    keys: dict[bytes, str] = {}
    for request, prefix in zip(requests, prefixes, strict=True):
        if prefix is not None and seen.get(prefix, 0) > 1:
            key = keys.get(prefix)
            if key is None:
                key = keys[prefix] = "bc-" + hashlib.blake2b(prefix, digest_size=16).hexdigest()
            request.prompt_cache_key = key


def group_by_prefix(requests: Iterable[Request], look_ahead: int = LOOK_AHEAD) -> Iterator[Request]:
    """``requests`` with those that share a prefix key moved next to the first of them, within
    each run of ``look_ahead`` requests (module docstring); requests without a key stay put
    relative to the groups around them."""
    source = iter(requests)
    while chunk := list(itertools.islice(source, look_ahead)):
        prefixes = _chat_prefixes(chunk)  # each prefix encoded once, for both uses
        mark_shared_prefixes(chunk, prefixes)
        keys = [
            hash(prefix) if prefix is not None else prefix_key(request)
            for request, prefix in zip(chunk, prefixes, strict=True)
        ]
        keyed = [key for key in keys if key is not None]
        if len(set(keyed)) == len(keyed):  # nothing shared: as it came (no group built)
            yield from chunk
            continue
        groups: dict[object, list[Request]] = {}
        for request, key in zip(chunk, keys, strict=True):
            # unkeyed: a group of its own (its index is unique within the call)
            groups.setdefault(("k", key) if key is not None else request.index, []).append(request)
        for group in groups.values():
            yield from group
