"""Callers waiting on one piece of shared work (a group of requests sent as one request)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["settled_on_failure"]


@contextlib.contextmanager
def settled_on_failure(waiters: Sequence[asyncio.Future[Any]]) -> Iterator[None]:
    """Around the work that answers ``waiters``: an exception (a bug) is given to every waiter
    still waiting rather than leaving it to wait forever, and swallowed; a cancellation (the
    provider stopping) cancels them and goes on."""
    try:
        yield
    except Exception as exc:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(exc)
    except BaseException:
        for waiter in waiters:
            waiter.cancel()
        raise
