"""Prompt caching on Anthropic Message Batches: one ``cache_control`` mark per request, on the
last content block it shares with another request of its remote batch.

Anthropic caches a prompt's prefix up to a block marked ``cache_control``, in the order tools,
system, messages; a later request with the same prefix reads it at a tenth of the input price
(Anthropic's prompt caching guide). A 1-hour cache write costs twice the input price, a
5-minute one 1.25x; Anthropic's batch processing guide recommends the 1-hour TTL for batches,
whose requests run over far more than 5 minutes. So a prefix is marked only where it pays:

- shared by at least two requests of the remote batch (one alone would only pay for the write);
- at least the model's minimum cacheable length (:func:`min_tokens`; shorter prefixes are not
  cached, so a mark would do nothing), estimated at :data:`BYTES_PER_TOKEN` bytes of JSON per
  token;
- on the *last* block the request shares, so the longest shared prefix is what is cached:
  for a few-shot eval, the system text and the examples, not the question.

A request's own marks (a ``cache_control`` on a content part of its OpenAI body, or a top-level
``cache_control``) are kept as sent; a request that already has 4 (Anthropic's limit) gets no
more. The marks are decided when a part's requests are sent (:func:`mark_shared_prefixes` over
every request of that remote batch), from its file alone, so a part sent again gets the same.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

__all__ = [
    "BYTES_PER_TOKEN",
    "CACHE_MARK",
    "MAX_MARKS",
    "count_marks",
    "mark_shared_prefixes",
    "min_tokens",
]

CACHE_MARK = {"type": "ephemeral", "ttl": "1h"}
"""The mark put on a shared prefix's last block (a new dict each time it is used)."""

MAX_MARKS = 4
"""Anthropic's most ``cache_control`` breakpoints in one request."""

BYTES_PER_TOKEN = 4
"""Bytes of JSON per token for the length estimate (English text runs about 4 characters per
token; the JSON's punctuation makes bytes an overestimate of the text, so the estimate errs
toward marking)."""

_MIN_TOKENS: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-6", 4096),
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
)
_DEFAULT_MIN_TOKENS = 1024


def min_tokens(model: str) -> int:
    """The shortest prefix ``model`` caches, in tokens, from the table in Anthropic's prompt
    caching guide: 4,096 for Claude Opus 4.6 and 4.5 and Haiku 4.5, 2,048 for Claude Haiku 3.5
    and 3, 1,024 for the others (Sonnet 4.x, Opus 4.1 and 4, Sonnet 3.7) and for models the
    table does not name."""
    for prefix, tokens in _MIN_TOKENS:
        if model.startswith(prefix):
            return tokens
    return _DEFAULT_MIN_TOKENS


def _positions(params: dict[str, Any]) -> list[tuple[str, Any]]:
    """A request's content blocks in prompt order: ``(role, block)`` for the system text (a
    string is one block) and each message's content blocks."""
    out: list[tuple[str, Any]] = []
    system = params.get("system")
    if isinstance(system, str) and system:
        out.append(("system", system))
    elif isinstance(system, list):
        out += [("system", block) for block in system]
    for message in params.get("messages") or ():
        if not isinstance(message, dict):
            continue
        role = str(message.get("role"))
        content = message.get("content")
        if isinstance(content, str):
            out.append((role, content))
        elif isinstance(content, list):
            out += [(role, block) for block in content]
    return out


def count_marks(params: dict[str, Any]) -> int:
    """The ``cache_control`` marks a request already carries (on tools, system and message
    blocks, and at its top level)."""
    blocks = [block for _, block in _positions(params)] + list(params.get("tools") or ())
    marks = sum(isinstance(b, dict) and b.get("cache_control") is not None for b in blocks)
    return marks + (params.get("cache_control") is not None)


def _chain(params: dict[str, Any]) -> list[tuple[bytes, int]]:
    """``(digest, bytes so far)`` of the prompt up to and including each position: a hash
    chain seeded with what comes before the messages in Anthropic's cache order (model, tools,
    tool choice), so equal digests mean equal prefixes."""
    seed = orjson.dumps([params.get("model"), params.get("tools"), params.get("tool_choice")])
    digest = hashlib.blake2b(seed, digest_size=16).digest()
    size = 0
    out = []
    for role, block in _positions(params):
        if isinstance(block, dict) and "cache_control" in block:  # a mark is not content
            block = {k: v for k, v in block.items() if k != "cache_control"}
        data = orjson.dumps([role, block])
        size += len(data)
        digest = hashlib.blake2b(digest + data, digest_size=16).digest()
        out.append((digest, size))
    return out


def mark_shared_prefixes(requests: list[dict[str, Any]]) -> int:
    """Mark each request's last block shared with another of ``requests`` (Message Batches
    request objects, ``{"custom_id", "params"}``, changed in place) with :data:`CACHE_MARK`,
    where that shared prefix is long enough for its model and the request has room for a mark
    (module docstring). Returns how many requests were marked."""
    chains = [_chain(r["params"]) for r in requests]
    seen: dict[bytes, int] = {}
    for chain in chains:
        for digest, _ in chain:
            seen[digest] = seen.get(digest, 0) + 1
    marked = 0
    for request, chain in zip(requests, chains, strict=True):
        shared = [i for i, (digest, _) in enumerate(chain) if seen[digest] > 1]
        if not shared:
            continue
        last = shared[-1]  # shared prefixes nest: the last one is the longest
        params = request["params"]
        long_enough = chain[last][1] >= min_tokens(str(params.get("model"))) * BYTES_PER_TOKEN
        if not long_enough or count_marks(params) >= MAX_MARKS:
            continue
        if _mark(params, last):
            marked += 1
    return marked


def _mark(params: dict[str, Any], index: int) -> bool:
    """Put the mark on the block at position ``index``; False where it already has one."""
    position = 0
    system = params.get("system")
    if isinstance(system, str) and system:
        if index == 0:
            params["system"] = [{"type": "text", "text": system, "cache_control": dict(CACHE_MARK)}]
            return True
        position = 1
    elif isinstance(system, list):
        if index < len(system):
            return _mark_block(system, index)
        position = len(system)
    for message in params.get("messages") or ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        count = 1 if isinstance(content, str) else len(content) if isinstance(content, list) else 0
        if index < position + count:
            if isinstance(content, str):
                message["content"] = [{"type": "text", "text": content}]
                return _mark_block(message["content"], 0)
            assert isinstance(content, list)
            return _mark_block(content, index - position)
        position += count
    return False


def _mark_block(blocks: list[Any], i: int) -> bool:
    block = blocks[i]
    if not isinstance(block, dict) or block.get("cache_control") is not None:
        return False
    block["cache_control"] = dict(CACHE_MARK)
    return True
