"""Progress and ETA of running batches: :class:`ProgressTracker` fills ``Batch.progress``.

The rate is an exponentially weighted average in time of the rates between observations: the
span from the batch's start to the first look, then each gap between two looks, weighted
``1 - exp(-span / TAU_S)`` and older spans decayed by the same factor, normalised by the total
weight. While the batch is young (spans short against :data:`TAU_S`) that is the average rate
since it started; later it follows the current rate with a 30 s time constant. So the first
seconds of a batch already give its rate (an average frozen at the first look kept a slow
first second in the estimate for minutes), a batch resumed after a restart (whose first span
includes the downtime) or one whose first lines came from the result cache converges to its
current rate within about a minute, and two polls a millisecond apart do not make the figure
jump (the time since the last kept observation counts for its share; observations are kept at
most every :data:`MIN_GAP_S`).

The start is when this process committed the batch's first result, to the microsecond, when the
job manager that runs it is the one asked (only what finished after it counts: the start-up and
the first requests' latency are not the rate at which the rest will finish); else
``in_progress_at``, whole seconds and before both (in the first seconds of a steady batch that
made the ETA 1.6x too long). Whoever observes (a server answering ``GET /v1/batches/...``,
``batchclient jobs status``) gets the same figure the batch's record gives.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..types import Batch, BatchEta

TAU_S = 30.0
"""Time constant of the smoothing, seconds."""
MIN_GAP_S = 1.0
"""Observations are kept (advance the average) at most this often, seconds."""
MAX_TRACKED = 10_000
"""Most batches remembered; the oldest observation is forgotten beyond it."""
RUNNING = frozenset({"in_progress", "finalizing"})


@dataclass(slots=True)
class _Seen:
    """The last kept observation: its time, the lines finished then, and the average so far
    as ``weighted`` (sum of weight x rate) over ``weight`` (sum of weights; 0: no span yet),
    from ``origin`` (the run's first commit, when known)."""

    at: float
    done: int
    weighted: float = 0.0
    weight: float = 0.0
    origin: tuple[float, int] | None = None

    def advanced(self, now: float, done: int) -> tuple[float, float]:
        """``(weighted, weight)`` with the span from this observation to ``now`` added."""
        gap = now - self.at
        if gap <= 0:
            return self.weighted, self.weight
        share = 1.0 - math.exp(-gap / TAU_S)
        recent = (done - self.done) / gap
        return share * recent + (1 - share) * self.weighted, share + (1 - share) * self.weight


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

    def annotate(
        self, batch: Batch, now: float | None = None, origin: tuple[float, int] | None = None
    ) -> Batch:
        """``batch`` with ``progress`` set while it runs with a known line count (else left
        None, and the batch forgotten). ``origin``: (unix time, lines finished then) of this
        process's first committed result of the batch, if it runs it; ``now``: unix time."""
        if batch.status not in RUNNING or batch.request_counts.total <= 0:
            self._seen.pop(batch.id, None)
            return batch
        now = time.time() if now is None else now
        counts = batch.request_counts
        done = counts.completed + counts.failed
        seen = self._seen.get(batch.id)
        if (
            seen is None
            or done < seen.done
            or (seen.weighted == 0 and done > seen.done)
            or (origin is not None and origin != seen.origin)
        ):
            # first look, a batch started over, the first lines since looks without any, or a
            # run (re)started here: from the start, an observation of no weight
            started, base = origin or (batch.in_progress_at or batch.created_at, 0)
            seen = _Seen(started, base, origin=origin)
        weighted, weight = seen.advanced(now, done)
        if seen.weight == 0 or now - seen.at >= MIN_GAP_S:
            self._remember(batch.id, _Seen(now, done, weighted, weight, seen.origin))
        batch.progress = eta(batch, weighted / weight if weighted > 0 else None)
        return batch

    def _remember(self, batch_id: str, seen: _Seen) -> _Seen:
        self._seen.pop(batch_id, None)  # re-inserted last: the dict's order is the age
        self._seen[batch_id] = seen
        if len(self._seen) > MAX_TRACKED:
            del self._seen[next(iter(self._seen))]
        return seen
