"""Requests-per-minute and tokens-per-minute limits of one replica (aiolimiter leaky buckets).

- ``rpm``: each request takes 1 from a bucket of ``rpm`` per ``period_s``.
- ``tpm``: each request takes its estimated token cost before it is sent (the prompt's
  estimate, :func:`batchclient._core.prompt_tokens.estimate_prompt_tokens`, the one dry runs
  use without a tokenizer: about 4 characters per token, token ids one each; plus
  ``max_tokens``, else the mean ``completion_tokens`` seen so far), settled with the answer's
  real ``usage.total_tokens`` afterwards (as curator does: curator #401, #300). No tokenizer
  here: the estimate is charged on the hot path of every request, and the answer corrects it.
- The buckets start full; one request never takes more than the whole budget, so it cannot wait
  forever. They live on the replica, so every call and every job of one client shares them
  (litellm #5783, #10875).

Details and defaults: ``docs/remote.md`` ("Rate limits").
"""

from __future__ import annotations

from typing import Any

from aiolimiter import AsyncLimiter

from .._core.prompt_tokens import estimate_prompt_tokens

__all__ = ["RateBuckets"]


class RateBuckets:
    """The rpm/tpm buckets of one replica (either may be None) and the learned output size."""

    def __init__(
        self,
        rpm: float | None,
        tpm: float | None,
        *,
        period_s: float = 60.0,
        initial_output_tokens: int = 256,
    ) -> None:
        self.requests = AsyncLimiter(rpm, period_s) if rpm else None
        self.tokens = AsyncLimiter(tpm, period_s) if tpm else None
        self.active = self.requests is not None or self.tokens is not None
        """Whether any bucket is set (read twice per request: a plain attribute)."""
        self.output_tokens_estimate = float(initial_output_tokens)
        self._answers = 0

    def estimate(self, body: dict[str, Any]) -> float:
        """The token cost charged before sending ``body``."""
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        output = float(max_tokens) if max_tokens else self.output_tokens_estimate
        cost = estimate_prompt_tokens(body) + output
        return min(cost, self.tokens.max_rate) if self.tokens is not None else cost

    def has_capacity(self, cost: float) -> bool:
        if self.requests is not None and not self.requests.has_capacity(1):
            return False
        return self.tokens is None or self.tokens.has_capacity(cost)

    async def acquire(self, cost: float) -> None:
        """Wait until one request of ``cost`` tokens fits both buckets, and take it."""
        if self.requests is not None:
            await self.requests.acquire(1)
        if self.tokens is not None:
            await self.tokens.acquire(cost)

    def settle(self, charged: float, usage: Any) -> None:
        """Correct the token bucket with the answer's real ``usage`` and learn the output size.
        ``charged`` is what :meth:`estimate` took for this request."""
        if not isinstance(usage, dict):
            return
        completion = usage.get("completion_tokens")
        if isinstance(completion, int | float):
            self._answers += 1
            # a running mean: every answer counts the same, so the estimate converges
            self.output_tokens_estimate += (completion - self.output_tokens_estimate) / min(
                self._answers, 1000
            )
        total = usage.get("total_tokens")
        if self.tokens is not None and isinstance(total, int | float):
            _adjust(self.tokens, float(total) - charged)


def _adjust(limiter: AsyncLimiter, delta: float) -> None:
    """Charge (``delta`` > 0) or refund (< 0) a leaky bucket after the fact. aiolimiter has no
    public call for this; its level and waker are stable across 1.x (pinned >=1.1)."""
    limiter._leak()
    limiter._level = max(0.0, limiter._level + delta)
    if limiter._waiters:  # re-time the next wake-up for the new level
        limiter._wake_next()
