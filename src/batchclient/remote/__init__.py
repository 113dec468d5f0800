"""The remote fan-out provider: OpenAI-compatible ``/v1/chat/completions`` endpoints.

``docs/remote.md`` explains the knobs and algorithms (adaptive concurrency, Retry-After pauses,
rpm/tpm, many endpoints, the HTTP path).
"""

from ._client import RemoteBatchInference, RemoteEndpoint
from ._endpoints import LaneStats

__all__ = ["LaneStats", "RemoteBatchInference", "RemoteEndpoint"]
