"""Helpers shared by the remote provider's tests: short retry backoff, one-turn conversations,
and a lane's counters."""

from __future__ import annotations

from typing import Any

from batchclient import RemoteBatchInference
from batchclient.remote import RetryPolicy

FAST: dict[str, Any] = {"retry": RetryPolicy(backoff_initial_s=0.02, backoff_max_s=0.1)}
"""Retry backoff of 20-100 ms instead of 0.5-30 s, for tests that retry on purpose."""


def convo(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def lane(client: RemoteBatchInference, url: str | None = None, model: str = "smollm2") -> Any:
    """The ``replica_stats()`` entry of one (endpoint, model) lane."""
    for stats in client.replica_stats():
        if stats.model == model and (url is None or stats.url == url.rstrip("/")):
            return stats
    raise AssertionError(f"no lane for {url} {model}")
