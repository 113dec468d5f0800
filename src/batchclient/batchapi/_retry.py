"""Retries of one remote batch API call, for every backend: tenacity, with the remote provider's
wait (:class:`~batchclient._routing.retry.RetryWait`), which is capped before it is computed too
large to hold (a float overflows at the 1,024th doubling), so a remote batch polled for days
through an outage keeps being polled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_never

from .._routing.retry import RETRYABLE_STATUS, RetryWait, parse_retry_after
from .._routing.settings import RetryPolicy

__all__ = ["ApiError", "Retrier"]

T = TypeVar("T")


class ApiError(Exception):
    """A call that failed: ``status`` (None: no HTTP answer) and the server's message.
    ``transient`` when retrying could help; ``retry_after_s`` the server's ``Retry-After``."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        transient: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient
        self.retry_after_s = retry_after_s

    @classmethod
    def http(
        cls, what: str, status: int, message: str, retry_after: str | None, cap_s: float
    ) -> ApiError:
        """``what`` answered HTTP ``status``: transient for 408, 409, 429 and 5xx, to be retried
        after the server's ``Retry-After`` (at most ``cap_s`` seconds) when it sent one."""
        return cls(
            f"{what}: HTTP {status}: {message}"[:500],
            status=status,
            transient=status in RETRYABLE_STATUS,
            retry_after_s=parse_retry_after(retry_after, cap_s=cap_s),
        )


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, ApiError) and exc.transient


class Retrier:
    """``max_retries`` retries of a transient :class:`ApiError` (a connection error, a timeout,
    408/409/429/5xx, a malformed answer), after the server's ``Retry-After`` when it sent one,
    else after ``retry``'s backoff (:class:`~batchclient.remote.RetryPolicy`)."""

    def __init__(self, max_retries: int, retry: RetryPolicy) -> None:
        self.max_retries = max_retries
        self.retry = retry
        # jitter of at most the first wait: tiny backoffs (tests) stay tiny
        self._wait = RetryWait(
            initial_s=retry.backoff_initial_s,
            max_s=retry.backoff_max_s,
            jitter_s=min(0.5, retry.backoff_initial_s),
        )

    def attempts(self, *, forever: bool = False) -> AsyncRetrying:
        """tenacity's attempts (``async for attempt in ...: with attempt: ...``): a transient
        :class:`ApiError` raised in one is retried ``max_retries`` times (``forever``: without
        limit); the last failure is raised."""
        return AsyncRetrying(
            stop=stop_never if forever else stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception(_transient),
            reraise=True,
        )

    async def call(self, fn: Callable[[], Awaitable[T]], *, forever: bool = False) -> T:
        """Run ``fn`` (one attempt), retrying transient failures (``forever``: without limit,
        as a poll of a remote batch that keeps running while its server has a bad hour)."""
        async for attempt in self.attempts(forever=forever):
            with attempt:
                return await fn()
        raise AssertionError("unreachable: tenacity either returns or reraises")
