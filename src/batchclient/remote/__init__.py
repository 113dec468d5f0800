"""The remote fan-out provider: OpenAI-compatible endpoints over HTTP (aiohttp).

``docs/remote.md`` explains the knobs and algorithms (the transport and its options, adaptive
concurrency, throttling and announced quotas, rpm/tpm, many endpoints).
"""

from .._routing.dispatch import LaneStats
from .._routing.settings import AdaptiveConcurrency, Ejection, RateLimits, RetryPolicy
from ._client import RemoteBatchInference, RemoteProvider
from ._options import RemoteOptions
from ._settings import HttpOptions, Timeouts
from ._setup import RemoteEndpoint

__all__ = [
    "AdaptiveConcurrency",
    "Ejection",
    "HttpOptions",
    "LaneStats",
    "RateLimits",
    "RemoteBatchInference",
    "RemoteEndpoint",
    "RemoteOptions",
    "RemoteProvider",
    "RetryPolicy",
    "Timeouts",
]
