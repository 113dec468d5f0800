"""The retry policy of the remote provider (tenacity): what is retried, and how long to wait.

- Retried: connection errors, timeouts, HTTP 408, 409, 429 and 5xx (the statuses the openai SDK
  retries; OpenAI Batch contract, ``docs/design.md``), and 498 (Groq's ``capacity_exceeded``
  when its flex tier is full).
- Never retried: every other 4xx (400 context too long, 401, 403, 404 model not found, 422):
  they fail on the first attempt with their status (bespokelabsai/curator #213).
- Wait: the server's ``retry-after-ms`` (Azure OpenAI; milliseconds, preferred as the openai SDK
  does) or ``Retry-After`` (seconds or an HTTP date), capped at ``retry_after_cap_s``, plus up to
  10 % jitter when given; otherwise exponential backoff with jitter (tenacity's
  ``wait_exponential_jitter``). Only that request waits; the replica is paused as well when
  the throttling is replica-wide (``dispatch``).
- The first attempt runs outside tenacity (one ``AsyncRetrying`` per request costs about as much
  as the HTTP call on an instant server); only a request that failed once enters it.
- A request that runs out of attempts reports its last failure: a 429 stays ``rate_limited``
  with status 429 (BerriAI/litellm #23901 reported such 429s as 500s).

Step by step: ``docs/remote.md`` ("What happens to one request").
"""

from __future__ import annotations

import inspect
import math
import random
import time
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, wait_exponential_jitter

if TYPE_CHECKING:
    from .._core.request import Result

RETRYABLE_STATUS = frozenset({408, 409, 429, 498, 500, 502, 503, 504, 520, 521, 522, 524, 529})
# Throttles: they cap or cut the adaptive concurrency limit (and pause the replica when most
# answers are throttles and they carry Retry-After). 429 is a rate limit whatever its body says
# (openai-cookbook PRs #1050, #1254: checks of the body text that
# never fired); 503 and 529 are how servers say "overloaded" (vLLM, Anthropic), 498 how Groq says
# its flex tier is out of capacity.
THROTTLE_STATUS = frozenset({429, 498, 503, 529})
# Server failures: repeated ones eject the replica (its requests go to the other replicas).
EJECTING_STATUS = frozenset({500, 502, 504, 520, 521, 522, 524})


class RetryableFailure(Exception):
    """One failed attempt that may be retried: carries the result to report if it is the last,
    the server's ``Retry-After`` in seconds (already capped), if any, and the replica that
    failed, which the retry avoids when another is available. ``full``: a throttle from a
    server that was full (its capacity explains it, and the limit is now within what it
    served), so the request may go again as soon as a slot frees under that limit."""

    def __init__(
        self,
        result: Result,
        retry_after_s: float | None = None,
        *,
        replica: Any = None,
        full: bool = False,
    ):
        super().__init__(result.error.message if result.error else "retryable failure")
        self.result = result
        self.retry_after_s = retry_after_s
        self.replica = replica
        self.full = full


def parse_retry_after(value: str | None, *, cap_s: float, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date (RFC 9110
    §10.2.3). Capped at ``cap_s``; None when absent or unparseable; never negative."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, min(seconds, cap_s))


def retry_after_of(headers: Any, *, cap_s: float) -> float | None:
    """Seconds to wait from an answer's headers: ``retry-after-ms`` when it is a number (Azure
    OpenAI sends it; the openai SDK prefers it), else ``Retry-After``; capped at ``cap_s``."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            seconds = float(millis) / 1000.0
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds):
            return max(0.0, min(seconds, cap_s))
    return parse_retry_after(headers.get("retry-after"), cap_s=cap_s)


# The first wait is ``multiplier`` from tenacity 9.2.1 on, where ``initial`` is a deprecated alias
# that warns; older releases (which google-genai pins) know only ``initial``.
_FIRST_WAIT = (
    "multiplier"
    if "multiplier" in inspect.signature(wait_exponential_jitter.__init__).parameters
    else "initial"
)


class RetryWait:
    """tenacity ``wait``: the server's Retry-After (+ up to 10 % jitter) when it sent one, else
    exponential backoff with jitter (``initial_s`` doubling up to ``max_s``, + up to
    ``jitter_s``)."""

    def __init__(self, *, initial_s: float = 0.5, max_s: float = 30.0, jitter_s: float = 0.5):
        first_wait = {_FIRST_WAIT: initial_s}
        self._backoff = wait_exponential_jitter(**first_wait, max=max_s, jitter=jitter_s)

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        retry_after = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            return float(retry_after) * (1.0 + 0.1 * random.random()) + 0.01
        return float(self._backoff(state))
