"""One engine pass for every one-token continuation of a context: the choices of a
multiple-choice question (``" A"`` ... ``" D"`` after the same question) are scored by one
generation request whose ``logprob_token_ids`` lists all their tokens, not one request each.

Why: each request of the one-token way reads the shared prefix from vLLM's prefix cache, but
the last, partly filled KV block of its context is computed again for every choice, and every
request costs the engine a scheduling step and a sampled token. One request per context
computes the context once.

- **Forming**: a one-token scoring request opens a group for its (engine, model, context), or
  joins the open one; the group is sent ``hold_s`` (2 ms) after it was opened, or at once when
  it holds :data:`MAX_NEXT_TOKENS` distinct tokens (vLLM's limit on ``logprob_token_ids``).
  The scheduler hands a question's choices over one after another
  (:mod:`batchclient._core.prefix`), so they arrive well within the hold.
- **Answers**: each request gets the result a request of its own would have got (its token's
  log-probability and the greedy token's, from the same logits row); requests of the same
  token share one. ``usage.prompt_tokens_details.cached_tokens`` is the engine's count for the
  first token of a group and the whole context for the others (computed once for all).
- **Refusals**: a token id outside the vocabulary is that request's ``invalid_request``
  before anything is sent, and the others are scored without it. A group refused as a whole as
  ``invalid_request`` is sent again one token at a time, so only the request at fault gets the
  error; any other failure (the context too long, the engine down) is every request's, as it
  would have been alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .._core.request import Result
from .._core.waiters import settled_on_failure
from ..errors import ErrorCode

__all__ = ["MAX_NEXT_TOKENS", "NextTokenGroups", "copy_result"]

MAX_NEXT_TOKENS = 128
"""The most token ids one request scores: vLLM's ``MAX_LOGPROB_TOKEN_IDS``
(``vllm/sampling_params.py``), the width of the sampler's rows."""

Score = Callable[[Any, str, list[int], list[int]], Awaitable[list[Result]]]
"""``score(engine, model, context, tokens)`` -> one result per token, in order."""


@dataclass(eq=False)
class _Group:
    engine: Any
    model: str
    context: list[int]
    tokens: list[int] = field(default_factory=list)
    waiters: dict[int, list[asyncio.Future[Result]]] = field(default_factory=dict)


class NextTokenGroups:
    """Merges one-token scoring requests over the same context into one ``score`` call."""

    def __init__(self, score: Score, hold_s: float = 0.002) -> None:
        self.hold_s = hold_s
        self._score = score
        self._open: dict[tuple[int, str, tuple[int, ...]], _Group] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def execute(self, engine: Any, model: str, context: list[int], token: int) -> Result:
        """The result of scoring ``token`` after ``context``, scored with the other tokens of
        that context in flight within ``hold_s``."""
        key = (id(engine), model, tuple(context))
        loop = asyncio.get_running_loop()
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = _Group(engine, model, context)
            loop.call_later(self.hold_s, self._close, key, group)
        waiter: asyncio.Future[Result] = loop.create_future()
        waiting = group.waiters.get(token)
        if waiting is None:
            group.tokens.append(token)
            waiting = group.waiters[token] = []
        waiting.append(waiter)
        if len(group.tokens) >= MAX_NEXT_TOKENS:
            self._close(key, group)
        return await waiter

    def _close(self, key: tuple[int, str, tuple[int, ...]], group: _Group) -> None:
        if self._open.get(key) is not group:
            return  # already sent (it filled up before its hold ended)
        del self._open[key]
        task = asyncio.ensure_future(self._run(group))
        self._tasks.add(task)  # a strong reference until it ends
        task.add_done_callback(self._tasks.discard)

    async def _run(self, group: _Group) -> None:
        waiters = [w for ws in group.waiters.values() for w in ws]
        if all(w.done() for w in waiters):
            return  # every caller was cancelled
        with settled_on_failure(waiters):
            results = await self._score(group.engine, group.model, group.context, group.tokens)
            # the whole request refused (each result the same refusal): find the token at fault
            if len(group.tokens) > 1 and all(_bad_request(r) for r in results):
                alone = await asyncio.gather(
                    *(
                        self._score(group.engine, group.model, group.context, [token])
                        for token in group.tokens
                    )
                )
                results = [r for (r,) in alone]
            for token, result in zip(group.tokens, results, strict=True):
                for n, waiter in enumerate(group.waiters[token]):
                    if not waiter.done():
                        waiter.set_result(result if n == 0 else copy_result(result))


def _bad_request(result: Result) -> bool:
    return result.error is not None and result.error.code == ErrorCode.invalid_request


def copy_result(result: Result) -> Result:
    """A result of its own for another request (bodies are per item)."""
    return dataclasses.replace(
        result,
        body=None if result.body is None else dict(result.body),
        error=None if result.error is None else result.error.model_copy(),
        extra=dict(result.extra),
    )
