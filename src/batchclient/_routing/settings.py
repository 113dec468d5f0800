"""The policies of the replica router and of retries, with every default in one place (the
remote provider takes all four; the Batch API client takes ``RetryPolicy``).

The remote provider takes them as ``adaptive=``, ``retry=``, ``rate_limits=`` and
``ejection=`` (``batchclient.remote`` exports them); ``docs/remote.md`` explains each algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._options import Option

__all__ = ["PREFIX_AFFINITY", "AdaptiveConcurrency", "Ejection", "RateLimits", "RetryPolicy"]

PREFIX_AFFINITY = Option(
    True,
    "With several replicas, send requests that share a prefix (a scoring context, a chat's "
    "leading messages) to the replica that prefix ranks first while it has room "
    "(docs/scale-out.md, Prefix affinity); False: every request to the least-loaded replica.",
)
"""The ``prefix_affinity`` option of every provider that routes over replicas."""


@dataclass(frozen=True)
class AdaptiveConcurrency:
    """The adaptive in-flight limit of each (replica, model): it starts at ``initial``, grows
    while requests succeed and, on 429/503/529, is set to the capacity the server showed (what it
    was serving when it refused) or cut, within ``[minimum, max_concurrency]``.

    ``initial``: requests in flight at the start (None: ``min(16, max_concurrency)``).
    ``minimum``: the floor (requests). ``increase_ratio``: growth per round trip after the first
    throttle, as a fraction of the limit (at least one request). ``decrease_factor``: the limit
    is multiplied by this on a throttle the capacity does not explain (a rate limit).
    ``cooldown_s``: seconds between two cuts, and between two probes above the capacity (never
    the server's ``Retry-After``).
    """

    initial: int | None = None
    minimum: int = 1
    increase_ratio: float = 0.05
    decrease_factor: float = 0.8
    cooldown_s: float = 1.0


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures (connection errors, timeouts, 408/409/429/5xx) are retried; the
    number of retries is ``max_retries``.

    ``backoff_initial_s`` doubling up to ``backoff_max_s`` (seconds, with up to 0.5 s of
    jitter) when the server did not say when to retry; ``retry_after_cap_s``: the longest
    ``Retry-After`` honoured (seconds).
    """

    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_cap_s: float = 60.0


@dataclass(frozen=True)
class RateLimits:
    """How ``rpm`` / ``tpm`` are applied: ``period_s`` is their period (seconds);
    ``initial_output_tokens`` the output-size estimate charged to ``tpm`` for a request without
    ``max_tokens`` before any answer has been seen (then learned from ``usage``)."""

    period_s: float = 60.0
    initial_output_tokens: int = 256


@dataclass(frozen=True)
class Ejection:
    """When a failing replica is taken out: after ``after`` consecutive connection failures or
    5xx answers, for ``duration_s`` seconds; meanwhile it is asked ``GET /models`` every
    ``probe_s`` seconds and taken back as soon as it answers 200 (``probe_s=0``: no probing,
    back after ``duration_s``). The last replica in service is taken out only when it refuses
    connections (``docs/remote.md``)."""

    after: int = 3
    duration_s: float = 10.0
    probe_s: float = 1.0
