"""The remote provider's settings objects, with every default in one place.

The everyday knobs (``max_concurrency``, ``max_retries``, ``timeout``, ``rpm``, ``tpm``,
``api_key``, ``headers``, ``default_query``, ``proxy``, ``verify``, ``state_dir``) are plain
keyword arguments of ``RemoteBatchInference``; these group the rest. ``docs/remote.md``
explains each algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AdaptiveConcurrency",
    "Ejection",
    "HttpOptions",
    "RateLimits",
    "RetryPolicy",
    "Timeouts",
]


@dataclass(frozen=True)
class AdaptiveConcurrency:
    """The adaptive in-flight limit of each (endpoint, model): it starts at ``initial``, grows
    while requests succeed and is cut on 429/503/529, within ``[minimum, max_concurrency]``.

    ``initial``: requests in flight at the start (None: ``min(16, max_concurrency)``).
    ``minimum``: the floor (requests). ``increase_ratio``: growth per round trip after the first
    throttle, as a fraction of the limit (at least one request). ``decrease_factor``: the limit
    is multiplied by this on a throttle. ``cooldown_s``: seconds between two cuts (never the
    server's ``Retry-After``).
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
    5xx answers, for ``duration_s`` seconds."""

    after: int = 3
    duration_s: float = 10.0


@dataclass(frozen=True)
class Timeouts:
    """Timeouts other than the per-attempt ``timeout``: ``connect_s`` to open a connection
    (also bounded by the attempt's own timeout), ``list_models_s`` for ``GET /models``
    (seconds)."""

    connect_s: float = 30.0
    list_models_s: float = 10.0


@dataclass(frozen=True)
class HttpOptions:
    """The transport's rarer settings.

    ``client_cert``: a client certificate for mutual TLS: a PEM file with the certificate (and
    its key), or ``(certificate file, key file)``; ``client_key_password`` decrypts the key.
    ``max_response_bytes``: the largest answer read, decompressed (default 64 MiB); a larger
    one is that item's ``response_too_large`` error. ``keepalive_expiry_s``: an idle
    keep-alive connection is closed after this many seconds (default 10; load balancers and
    NATs commonly drop idle connections after 30-350 s, servers such as uvicorn after 5 s).
    """

    client_cert: str | tuple[str, str] | None = None
    client_key_password: str | None = None
    max_response_bytes: int = 64 << 20
    keepalive_expiry_s: float = 10.0
