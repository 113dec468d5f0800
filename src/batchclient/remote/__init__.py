"""The remote fan-out provider: OpenAI-compatible endpoints over HTTP (aiohttp).

``docs/remote.md`` explains the knobs and algorithms (the transport and its options, adaptive
concurrency, throttling and announced quotas, rpm/tpm, many endpoints).
"""

from ._client import RemoteBatchInference, RemoteEndpoint, RemoteProvider
from ._endpoints import LaneStats
from ._settings import (
    AdaptiveConcurrency,
    Ejection,
    HttpOptions,
    RateLimits,
    RetryPolicy,
    Timeouts,
)

__all__ = [
    "AdaptiveConcurrency",
    "Ejection",
    "HttpOptions",
    "LaneStats",
    "RateLimits",
    "RemoteBatchInference",
    "RemoteEndpoint",
    "RemoteProvider",
    "RetryPolicy",
    "Timeouts",
]
