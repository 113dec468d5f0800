"""Embedding inputs sent in groups: several one-input ``/v1/embeddings`` requests, in flight at
the same moment with the same parameters, go as one request whose ``input`` is a list (the
OpenAI API's form; the answer's ``data[i].index`` says which input each vector is). Each caller
still gets its own result, shaped exactly like the answer to its own one-input request.

Why: a server pays a fixed cost per HTTP request (parsing, scheduling, the answer), which for
small embedding models is most of the work; a vLLM server embeds a list in one pass.

- **Forming**: a request opens a group for its (parameters, text or token ids) and the group
  is sent when it holds ``size`` inputs or after ``hold_s`` (the requests the scheduler hands
  over together arrive within that), whichever is first. Requests whose ``input`` is already a
  list of inputs (a batch-file line) are sent as they are.
- **Refusals**: a group refused with 400, 413 or 422 (one input too long for the context, a
  body too large) is split in halves, each sent again, down to single inputs: only the input
  the server refuses on its own gets the error. Any other failure (after the provider's
  retries) is every input's error.
- **Malformed answers**: a vector missing for an input (wrong count, a missing or repeated
  ``index``) is a ``bad_upstream_response`` for that input only; nothing raises.
- **Usage**: the group's ``prompt_tokens`` is shared out over its inputs (token ids: their
  length; text: in proportion to its length), so the items' counts add up to the server's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from .._core.request import Result, failed
from .._core.waiters import settled_on_failure
from ..errors import ErrorCode

__all__ = ["SPLIT_STATUS", "EmbeddingGroups"]

SPLIT_STATUS = frozenset({400, 413, 422})
"""Refusals of a group that one input may cause on its own: the group is split and resent."""

Send = Callable[[dict[str, Any]], Awaitable[Result]]


@dataclass(eq=False)
class _Group:
    template: dict[str, Any]
    inputs: list[Any] = field(default_factory=list)
    waiters: list[asyncio.Future[Result]] = field(default_factory=list)


class EmbeddingGroups:
    """Groups one-input embedding requests; ``send`` sends one body (with the provider's
    routing and retries) and returns its result."""

    def __init__(self, size: int, send: Send, hold_s: float = 0.002) -> None:
        self.size = size
        self.hold_s = hold_s
        self._send = send
        self._open: dict[bytes, _Group] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def execute(self, body: dict[str, Any]) -> Result:
        key = _group_key(body)
        if key is None or self.size <= 1:
            return await self._send(body)
        loop = asyncio.get_running_loop()
        group = self._open.get(key)
        if group is None:
            template = {k: v for k, v in body.items() if k != "input"}
            group = self._open[key] = _Group(template)
            loop.call_later(self.hold_s, self._close, key, group)
        waiter: asyncio.Future[Result] = loop.create_future()
        group.inputs.append(body["input"])
        group.waiters.append(waiter)
        if len(group.inputs) >= self.size:
            self._close(key, group)
        return await waiter

    def _close(self, key: bytes, group: _Group) -> None:
        if self._open.get(key) is not group:
            return  # already sent (it filled up before its hold ended)
        del self._open[key]
        task = asyncio.ensure_future(self._run(group.template, group.inputs, group.waiters))
        self._tasks.add(task)  # a strong reference until it ends
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self,
        template: dict[str, Any],
        inputs: list[Any],
        waiters: list[asyncio.Future[Result]],
    ) -> None:
        if all(w.done() for w in waiters):
            return  # every caller was cancelled
        with settled_on_failure(waiters):
            if len(inputs) == 1:
                result = await self._send({**template, "input": inputs[0]})
                _give(waiters[0], result)
                return
            result = await self._send({**template, "input": inputs})
            if result.error is not None and result.status_code in SPLIT_STATUS:
                half = len(inputs) // 2
                await asyncio.gather(
                    self._run(template, inputs[:half], waiters[:half]),
                    self._run(template, inputs[half:], waiters[half:]),
                )
                return
            for waiter, part in zip(waiters, split_result(result, inputs), strict=True):
                _give(waiter, part)


def _give(waiter: asyncio.Future[Result], result: Result) -> None:
    if not waiter.done():
        waiter.set_result(result)


def _group_key(body: dict[str, Any]) -> bytes | None:
    """What requests must share to go in one group: every field but ``input``, and the kind of
    input (a list mixing texts and token ids is not a valid ``input``). None: not grouped."""
    value = body.get("input")
    if isinstance(value, str):
        kind = b"t"
    elif isinstance(value, list) and value and all(type(v) is int for v in value):
        kind = b"i"
    else:
        return None
    rest = {k: v for k, v in body.items() if k != "input"}
    try:
        return kind + orjson.dumps(rest, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


def split_result(result: Result, inputs: list[Any]) -> list[Result]:
    """One result per input from the result of their group: on success the input's own
    one-vector answer (``index`` 0, its share of ``usage``), its own error where the answer has
    no vector for it; on failure the group's error for each."""
    n = len(inputs)
    if result.error is not None or result.body is None:
        return [_copy(result, result.body) for _ in range(n)]
    body = result.body
    data = body.get("data")
    entries: dict[int, dict[str, Any]] = {}
    repeated: set[int] = set()
    for entry in data if isinstance(data, list) else ():
        index = entry.get("index") if isinstance(entry, dict) else None
        if type(index) is not int or not 0 <= index < n:
            continue
        if index in entries:
            repeated.add(index)
        entries[index] = entry
    shares = _token_shares((body.get("usage") or {}).get("prompt_tokens"), inputs)
    parts = []
    for i in range(n):
        entry = entries.get(i)
        if entry is None or i in repeated:
            why = "repeated" if i in repeated else "missing"
            bad = failed(
                ErrorCode.bad_upstream_response,
                f"the answer to a group of {n} inputs has its vector for input {i} {why} "
                f"({len(data) if isinstance(data, list) else 0} vectors)",
            )
            assert bad.error is not None
            bad.error.status_code = result.status_code
            bad.latency_s, bad.attempts = result.latency_s, result.attempts
            bad.request_id = result.request_id
            parts.append(bad)
            continue
        own: dict[str, Any] = {k: v for k, v in body.items() if k not in ("data", "usage")}
        own["data"] = [{**entry, "index": 0}]
        if shares is not None:
            own["usage"] = {"prompt_tokens": shares[i], "total_tokens": shares[i]}
        parts.append(_copy(result, own))
    return parts


def _copy(result: Result, body: dict[str, Any] | None) -> Result:
    return Result(
        status_code=result.status_code,
        body=body,
        error=result.error,
        request_id=result.request_id,
        ttft_s=result.ttft_s,
        latency_s=result.latency_s,
        attempts=result.attempts,
        extra=dict(result.extra),
    )


def _token_shares(total: Any, inputs: list[Any]) -> list[int] | None:
    """``total`` prompt tokens shared out over ``inputs`` in proportion to their size (token
    ids: their count; text: its length), as whole numbers adding up to ``total``."""
    if type(total) is not int or total < 0:
        return None
    sizes = [max(1, len(v)) for v in inputs]
    whole = sum(sizes)
    shares = [total * s // whole for s in sizes]
    rest = total - sum(shares)
    by_remainder = sorted(range(len(sizes)), key=lambda i: -((total * sizes[i]) % whole))
    for i in by_remainder[:rest]:
        shares[i] += 1
    return shares
