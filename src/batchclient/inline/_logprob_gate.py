"""Keeps two kinds of log-probability requests out of each other's engine steps.

vLLM 0.32's sampler answers every request of an engine step in ``logprob_token_ids`` terms as
soon as one request of the step names the tokens it wants (``vllm/v1/sample/sampler.py``,
"prefer logprob_token_ids"): the others' top-k alternatives become that request's entries,
padded with token 0 at ``-inf``. batchclient's one-token scoring names its choices that way, so
a chat or completion asking ``top_logprobs`` that ran in the same step as a scoring request got
``<|endoftext|>`` at -9999.0 among its alternatives (measured: 8 of 8 chat answers changed
when 256 scoring requests ran beside them). Requests that read only their sampled token's own
log-probability (``logprobs=0``: forced scoring, plain chat) are right either way and pass.

:class:`LogprobGate` lets one side at a time into the engine: ``named`` (requests with
``logprob_token_ids``) or ``top`` (requests asking one or more alternatives). A request of the
other side waits until the side in the engine drains; while one waits, new requests of the side
in the engine wait too, so neither side starves. Requests of one side run together as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio

__all__ = ["LogprobGate", "Side", "side_of"]

Side = Literal["named", "top"]


def side_of(params: Any) -> Side | None:
    """The gate side of vLLM ``SamplingParams``: ``named`` with ``logprob_token_ids``, ``top``
    with ``logprobs`` of 1 or more, None otherwise (it passes)."""
    if getattr(params, "logprob_token_ids", None):
        return "named"
    if (getattr(params, "logprobs", None) or 0) >= 1:
        return "top"
    return None


class LogprobGate:
    """One side at a time (module docstring)."""

    def __init__(self) -> None:
        self._changed = anyio.Condition()
        self.inside: dict[Side, int] = {"named": 0, "top": 0}
        self._waiting: dict[Side, int] = {"named": 0, "top": 0}

    @asynccontextmanager
    async def enter(self, side: Side | None) -> AsyncIterator[None]:
        """Hold a place for a request of ``side`` while it runs (None: no wait)."""
        if side is None:
            yield
            return
        other: Side = "top" if side == "named" else "named"
        async with self._changed:
            self._waiting[side] += 1
            try:
                # the other side is in, or waits for this side to drain: wait for a turn
                while self.inside[other] or (self._waiting[other] and self.inside[side]):
                    await self._changed.wait()
            finally:
                self._waiting[side] -= 1
            self.inside[side] += 1
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                async with self._changed:
                    self.inside[side] -= 1
                    self._changed.notify_all()
