"""Helpers shared by the remote provider's tests: short retry backoff, one-turn conversations,
a lane's counters, and a stub handler that throttles a first wave."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from batchclient import RemoteBatchInference
from batchclient.remote import RetryPolicy
from batchclient.testing import StubReply

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


@dataclass
class FirstWave:
    """A stub ``handler`` answering ``429 Retry-After: 1`` to the first ``size`` first attempts
    (a client's first wave, counted rather than timed, so a busy machine that spreads the wave
    out cannot let part of it through). ``arrivals``: when every request arrived;
    ``refused``: when the refused ones did (``time.monotonic``)."""

    size: int
    arrivals: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)

    def __call__(self, body: dict[str, Any], attempt: int) -> StubReply | None:
        now = time.monotonic()
        self.arrivals.append(now)
        if attempt == 1 and len(self.refused) < self.size:
            self.refused.append(now)
            return StubReply(status=429, headers={"Retry-After": "1"})
        return None
