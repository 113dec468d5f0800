"""The remote fan-out provider: OpenAI-compatible servers (one or several replicas) over HTTP
(aiohttp).

``docs/remote.md`` explains the knobs and algorithms (the transport and its options, adaptive
concurrency, throttling and announced quotas, rpm/tpm, many replicas).
"""

from .._routing.dispatch import LaneStats
from .._routing.settings import AdaptiveConcurrency, Ejection, RateLimits, RetryPolicy
from ._client import RemoteBatchInference, RemoteProvider
from ._options import RemoteOptions
from ._settings import HttpOptions, Timeouts
from ._setup import RemoteReplica

__all__ = [
    "AdaptiveConcurrency",
    "Ejection",
    "HttpOptions",
    "LaneStats",
    "RateLimits",
    "RemoteBatchInference",
    "RemoteOptions",
    "RemoteProvider",
    "RemoteReplica",
    "RetryPolicy",
    "Timeouts",
]
