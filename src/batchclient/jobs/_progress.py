"""Progress and ETA of running batches: :class:`ProgressTracker` fills ``Batch.progress``.

The estimate is remaining × elapsed ÷ finished, smoothed: the first observation of a batch
takes its average rate since ``in_progress_at``; each later one (at least :data:`MIN_GAP_S`
after the last) blends the rate over the gap into it with weight ``1 - exp(-gap / TAU_S)``, an
exponentially weighted average in time. So a batch resumed after a restart (whose average
includes the downtime), or one whose first lines came from the result cache, converges to its
current rate within about a minute of observations, and two polls a millisecond apart do not
make the figure jump. Whoever observes (a server answering ``GET /v1/batches/...``, ``batchclient
jobs status``) gets the same figure the batch's record gives; a process that looked once has
only the average.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..types import Batch, BatchEta

TAU_S = 30.0
"""Time constant of the smoothing, seconds."""
MIN_GAP_S = 1.0
"""Observations closer than this to the last one reuse its rate."""
MAX_TRACKED = 10_000
"""Most batches remembered; the oldest observation is forgotten beyond it."""
RUNNING = frozenset({"in_progress", "finalizing"})


@dataclass(slots=True)
class _Seen:
    at: float
    done: int
    rate: float | None


def eta(batch: Batch, rate: float | None) -> BatchEta:
    """The progress of ``batch`` finishing ``rate`` lines per second (None: unknown)."""
    counts = batch.request_counts
    done = counts.completed + counts.failed
    remaining = max(counts.total - done, 0)
    fraction = min(done / counts.total, 1.0) if counts.total else 0.0
    if batch.status == "finalizing" or remaining == 0:
        return BatchEta(completed_fraction=fraction, requests_per_s=rate, eta_s=0.0)
    seconds = remaining / rate if rate else None
    return BatchEta(completed_fraction=fraction, requests_per_s=rate, eta_s=seconds)


class ProgressTracker:
    """Remembers each running batch's last observation (in memory, one per job manager)."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def annotate(self, batch: Batch, now: float | None = None) -> Batch:
        """``batch`` with ``progress`` set while it runs with a known line count (else left
        None, and the batch forgotten)."""
        if batch.status not in RUNNING or batch.request_counts.total <= 0:
            self._seen.pop(batch.id, None)
            return batch
        now = time.time() if now is None else now
        counts = batch.request_counts
        done = counts.completed + counts.failed
        seen = self._seen.get(batch.id)
        if seen is None or done < seen.done or (seen.rate is None and done > seen.done):
            # first look, a batch started over, or the first lines since a look without any
            started = batch.in_progress_at or batch.created_at
            elapsed = now - started
            rate = done / elapsed if done and elapsed > 0 else None
            seen = self._remember(batch.id, _Seen(now, done, rate))
        elif now - seen.at >= MIN_GAP_S:
            gap = now - seen.at
            recent = (done - seen.done) / gap
            weight = 1.0 - math.exp(-gap / TAU_S)
            rate = recent if seen.rate is None else weight * recent + (1 - weight) * seen.rate
            seen = self._remember(batch.id, _Seen(now, done, rate))
        batch.progress = eta(batch, seen.rate)
        return batch

    def _remember(self, batch_id: str, seen: _Seen) -> _Seen:
        self._seen.pop(batch_id, None)  # re-inserted last: the dict's order is the age
        self._seen[batch_id] = seen
        if len(self._seen) > MAX_TRACKED:
            del self._seen[next(iter(self._seen))]
        return seen
