"""The remote fan-out provider: OpenAI-compatible ``/v1/chat/completions`` endpoints.

``docs/remote.md`` explains the knobs and algorithms (adaptive concurrency, Retry-After pauses,
rpm/tpm, many endpoints, the HTTP path).
"""

from ._client import RemoteBatchInference, RemoteEndpoint, RemoteProvider
from ._endpoints import LaneStats
from ._settings import AdaptiveConcurrency, Ejection, RateLimits, RetryPolicy, Timeouts

__all__ = [
    "AdaptiveConcurrency",
    "Ejection",
    "LaneStats",
    "RateLimits",
    "RemoteBatchInference",
    "RemoteEndpoint",
    "RemoteProvider",
    "RetryPolicy",
    "Timeouts",
]
