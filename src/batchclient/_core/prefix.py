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
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import orjson

from .request import Request

__all__ = ["LOOK_AHEAD", "group_by_prefix", "prefix_key"]

LOOK_AHEAD = 256
"""Requests grouped at a time: a few times a provider's ``max_in_flight()``, so the groups
are dispatched close together, and little enough to cost nothing in memory or latency."""


def prefix_key(request: Request) -> int | None:
    """The key of ``request``'s shared prefix (module docstring), or None when it has none."""
    body = request.body
    if request.score_span is not None:
        start = request.score_span[0]
        prompt = body.get("prompt")
        if start > 0 and isinstance(prompt, list):
            return hash(tuple(prompt[:start]))
        return None
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) > 1:
        try:
            return hash(orjson.dumps(messages[:-1]))
        except TypeError:  # content orjson cannot encode: the request fails later, unkeyed
            return None
    return None


def group_by_prefix(requests: Iterable[Request], look_ahead: int = LOOK_AHEAD) -> Iterator[Request]:
    """``requests`` with those that share a prefix key moved next to the first of them, within
    each run of ``look_ahead`` requests (module docstring); requests without a key stay put
    relative to the groups around them."""
    source = iter(requests)
    while chunk := list(itertools.islice(source, look_ahead)):
        keys = [prefix_key(request) for request in chunk]
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
