"""Which flow a request belongs to: the batch it is part of (and that batch's priority), or a
one-request call that someone is waiting on. A *flow* is the fair-queuing term: the requests a
scheduler keeps apart and shares capacity between (the router's *lanes*, ``_routing``, are
something else: a replica's slots for one model).

The jobs set the flow around a batch's run (:func:`batch_flow`); the server's one-request
routes mark their call :func:`interactive`. A context variable carries it down to whatever
provider wrapper schedules requests (the server's fair gate), through the scheduler's worker
tasks, which inherit their context. Nothing here changes how a request runs: a provider that
does not look at the flow ignores it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

__all__ = ["Flow", "Priority", "batch_flow", "current_flow", "interactive", "priority_of"]


class Priority(IntEnum):
    """Tiers, lowest value first: a one-request call, then a batch's ``metadata.priority``."""

    interactive = 0
    high = 1
    normal = 2
    low = 3


BATCH_PRIORITIES = ("high", "normal", "low")
"""The values ``metadata.priority`` may take (absent: ``normal``)."""


@dataclass(frozen=True)
class Flow:
    """``batch``: the batch id, None for requests outside a batch (calls)."""

    batch: str | None
    priority: Priority


_CALLS = Flow(None, Priority.normal)
_FLOW: ContextVar[Flow] = ContextVar("batchclient_flow", default=_CALLS)


def current_flow() -> Flow:
    """The flow of the request being executed now (default: a call at normal priority)."""
    return _FLOW.get()


def priority_of(metadata: dict[str, Any] | str | None) -> Priority:
    """The priority a batch's metadata (a dict, or its JSON text as stored) asks for:
    ``metadata["priority"]`` of ``high`` / ``normal`` / ``low`` (any case); else normal."""
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return Priority.normal
    value = metadata.get("priority") if isinstance(metadata, dict) else None
    if isinstance(value, str) and value.strip().lower() in BATCH_PRIORITIES:
        return Priority[value.strip().lower()]
    return Priority.normal


@contextmanager
def batch_flow(batch_id: str, metadata: dict[str, Any] | str | None) -> Iterator[None]:
    """Requests executed inside belong to batch ``batch_id`` at its metadata's priority."""
    token = _FLOW.set(Flow(batch_id, priority_of(metadata)))
    try:
        yield
    finally:
        _FLOW.reset(token)


@contextmanager
def interactive() -> Iterator[None]:
    """Requests executed inside are one-request calls a client is waiting on: they go ahead of
    batch lines."""
    token = _FLOW.set(Flow(None, Priority.interactive))
    try:
        yield
    finally:
        _FLOW.reset(token)
