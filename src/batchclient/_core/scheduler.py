"""The one primitive: run these requests, hand each result over as it completes.

``run_requests`` serves the synchronous ``batch_chat_completion`` (which slots results into
input order), the jobs (which commit each result to SQLite) and the benchmark (which records
timings) alike.

Design: ``max_in_flight`` worker tasks pull requests lazily from the input (a plain or async
iterable) and await the provider's ``execute`` for each. A slow request holds one worker, never a
whole chunk; the input is never materialised, so memory is bounded by ``max_in_flight`` whatever
the input size. The provider may gate further inside ``execute`` (the remote provider's
adaptive, per-replica limits). Cancelling the caller cancels every worker, which closes HTTP
requests and aborts engine requests in the providers' own ``finally`` blocks.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import anyio

from ..errors import ErrorCode
from ..types import BatchProgress, ProgressCallback
from .request import Request, Result, failed
from .usage import token_counts

Execute = Callable[[Request], Awaitable[Result]]
OnResult = Callable[[Request, Result], Awaitable[None] | None]


async def _aiter(
    items: Iterable[Request] | AsyncIterable[Request],
) -> AsyncIterator[Request]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def run_requests(
    execute: Execute,
    requests: Iterable[Request] | AsyncIterable[Request],
    *,
    max_in_flight: int,
    on_result: OnResult,
) -> None:
    """Run every request with at most ``max_in_flight`` in ``execute`` at once; call
    ``on_result(request, result)`` once per request as it completes (in completion order).

    ``execute`` must turn every failure of one request into a failed ``Result``; an
    exception that escapes it anyway (a bug) becomes that item's ``internal_error`` so the rest
    of the batch still finishes. Requests that already carry an ``error`` (refused before
    dispatch) are reported without being executed. Raises only what ``on_result`` raises, and
    cancellation.
    """
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be >= 1")
    is_async = inspect.iscoroutinefunction(on_result)
    if isinstance(requests, AsyncIterable):
        source: AsyncIterator[Request] = _aiter(requests)
        lock: anyio.Lock | None = anyio.Lock()
        shared = None
    else:
        shared = iter(requests)  # one iterator for every worker: pulled without awaiting
        lock = None

    async def worker() -> None:
        while True:
            if shared is not None:  # inline, not a coroutine: this runs once per request
                request = next(shared, None)
            else:
                assert lock is not None
                async with lock:
                    request = await anext(source, None)
            if request is None:
                return
            if request.error is not None:
                result = Result(status_code=None, body=None, error=request.error)
            else:
                try:
                    result = await execute(request)
                except Exception as exc:  # a bug in a provider: lose this item, not the batch
                    result = failed(ErrorCode.internal_error, f"{type(exc).__name__}: {exc}")
            if is_async:
                await on_result(request, result)  # type: ignore[misc]
            else:
                on_result(request, result)

    async with anyio.create_task_group() as tg:
        for _ in range(max_in_flight):
            tg.start_soon(worker)


@dataclass
class ProgressTracker:
    """Counts results and reports a :class:`BatchProgress` to a callback at most every
    ``interval_s`` seconds (and once at the end)."""

    total: int | None
    callback: ProgressCallback | None
    interval_s: float = 0.2
    concurrency_limit: Callable[[], int | None] = field(default=lambda: None)
    completed: int = 0
    failed: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    in_flight: int = 0
    started: float = field(default_factory=time.perf_counter)
    _last: float = 0.0

    def record(self, result: Result, ok: bool) -> None:
        if ok:
            self.completed += 1
        else:
            self.failed += 1
        cached = result.cached  # read once: this runs once per result
        if cached:
            self.cache_hits += 1
        usage = result.body.get("usage") if result.body else None
        refused = result.status_code is not None and not 200 <= result.status_code < 300
        # a cache hit generated nothing; a refusal's body (kept as sent) counts for nothing
        if isinstance(usage, dict) and not cached and not refused:
            self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.completion_tokens += int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details")
            if details is not None:  # read only where reported: this runs once per result
                self.cached_tokens += token_counts(usage).cached
        if self.callback is not None:
            now = time.perf_counter()
            if now - self._last >= self.interval_s:
                self._last = now
                self.callback(self.snapshot())

    def snapshot(self) -> BatchProgress:
        return BatchProgress(
            total=self.total,
            completed=self.completed,
            failed=self.failed,
            cache_hits=self.cache_hits,
            in_flight=self.in_flight,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            elapsed_s=time.perf_counter() - self.started,
            concurrency_limit=self.concurrency_limit(),
        )

    def finish(self) -> None:
        if self.callback is not None:
            self.callback(self.snapshot())
