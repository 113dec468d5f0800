"""Endpoints, their (endpoint, model) lanes, and the dispatcher that hands out request slots.

- A **lane** is one (endpoint, model): its own adaptive concurrency limit and counters (limits
  are per endpoint and model, not per API key: inspect_ai PR #3984).
- An **endpoint** is one replica: its HTTP pool, rpm/tpm buckets, health and ``Retry-After``
  pause. All lanes of an endpoint share its pause and its health.
- The **dispatcher** gives each attempt a slot on the least-loaded usable lane of its model
  (fewest in flight relative to its limit; only endpoints with rpm/tpm room while any has some;
  the endpoint of the previous failed attempt last). With no free slot the attempt queues
  (first come, first served per model) and is handed a slot directly when one frees up, a pause
  ends or an ejected endpoint returns.
- **Prefix affinity**: an attempt with a prefix key (:mod:`.._core.prefix`: the context of a
  scoring request, the leading messages of a chat) goes to the usable endpoint with room that
  ranks first for that key by rendezvous hashing (highest ``hash((key, endpoint number))``),
  so requests that share a prefix meet the KV cache that prefix already filled; when that
  endpoint's lane is full, to the next in the key's ranking (the load spills in a fixed order,
  so the second replica's cache warms for it too). Attempts without a key go least-loaded.
  Queued attempts take whatever slot frees first (the queue stays first come, first served):
  under saturation affinity yields to keeping every replica busy.
- **Throttles**: a 429/503/529 holds the request that got it until its ``Retry-After`` (the
  caller's retry waits it); the other requests go on. The endpoint as a whole is paused only when
  the throttling is endpoint-wide: most of its recent answers (as many as it has in flight, at
  least 4) were throttles, none was a success since the refused request was sent (within the
  last second: a server still serving some is at its capacity, which the limit finds, as when
  its capacity falls), and the server said until when. When the pause ends, each lane
  restarts at half its limit and regains one slot per success (a gradual restart, not a burst).
  A request that was itself told ``Retry-After`` and has waited it is not held by later pauses
  (it does what the server asked) and is served before new requests. (Pausing the endpoint for
  every ``Retry-After``, as inspect_ai #5137 proposed, drove a concurrency-limited server at a
  third of its capacity: each excess request stopped the others, which were succeeding.)
- **Announced quota**: an endpoint whose answers carry ``x-ratelimit-*`` headers is held, for
  every request, while the quota they announce has no room, until their reset time
  (:mod:`.quota`).
- **Ejection**: ``eject_after`` consecutive connection failures or 5xx answers (500, 502, 504,
  52x) take an endpoint out for ``eject_s`` seconds; its requests go elsewhere. On its return one
  more failure ejects it again. If every endpoint is out, attempts fail fast with
  :class:`EndpointUnavailable` (retried by the caller until its attempts run out: never a hang).
  A 5xx never ejects the last endpoint still in (backoff paces it instead); a connection failure
  may.

Times are read from the dispatcher's ``clock`` (``time.monotonic``; the lanes' adaptive limits
read the same one), so tests drive ejection, pauses and holds on a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .adaptive import AdaptiveLimit, AdaptiveSettings
from .quota import HeaderQuota
from .rates import RateBuckets

__all__ = ["Dispatcher", "EndpointUnavailable", "Lane", "LaneStats", "Replica"]


class EndpointUnavailable(Exception):
    """Every endpoint is ejected; ``wait_s`` is when the first one returns."""

    def __init__(self, message: str, wait_s: float):
        super().__init__(message)
        self.wait_s = wait_s


@dataclass
class LaneStats:
    """What one (endpoint, model) lane has seen. ``concurrency_limit`` is its current limit;
    ``throttled`` counts 429/503/529 answers (each one signal: no hidden retries, mlflow #24404);
    ``cuts`` how often the limit was cut."""

    url: str
    model: str
    concurrency_limit: int
    in_flight: int
    sent: int
    succeeded: int
    throttled: int
    failed: int
    cuts: int
    ejected: bool
    paused_s: float
    output_tokens_estimate: float


@dataclass(eq=False)
class Lane:
    endpoint: Replica
    model: str
    control: AdaptiveLimit
    in_use: int = 0
    ramp: float = math.inf  # after a pause: the slots allowed while restarting
    sent: int = 0
    succeeded: int = 0
    throttled: int = 0
    failed: int = 0
    flying: dict[int, float] = field(default_factory=dict)  # sent, unanswered: send times
    # (sent, answered) times of the latest successes, in answer order: who the server was
    # serving when a refused request arrived, once its refusal comes back (maybe much later)
    answered: deque[tuple[float, float]] = field(default_factory=deque)

    def sending(self, sent_at: float) -> int:
        """Register a request sent at ``sent_at``; returns its token for :meth:`landed`."""
        self.sent += 1
        token = self.sent
        self.flying[token] = sent_at
        return token

    def landed(self, token: int) -> None:
        self.flying.pop(token, None)

    def served_at(self, sent_at: float) -> int:
        """How many requests the server was serving when a request sent at ``sent_at``
        arrived: those sent before it that were answered with success after it was sent, and
        those still unanswered (refused ones were not being served). Counted when its refusal
        comes back, which an overloaded backend may send only after working on it: what is in
        flight by then says nothing, what overlapped its arrival does."""
        count = sum(1 for t in self.flying.values() if t < sent_at)
        for sent, done in reversed(self.answered):
            if done <= sent_at:
                break
            if sent < sent_at:
                count += 1
        return count

    def serving_since(self, since: float) -> bool:
        """Whether a success was answered after ``since``: a server that refuses most requests
        but still serves some is at its capacity (which the limit finds), not rate-limited
        (which pauses the endpoint)."""
        return bool(self.answered) and self.answered[-1][1] > since

    def free(self) -> int:
        limit = self.control.limit
        if self.ramp < limit:
            limit = int(self.ramp)
        return limit - self.in_use


@dataclass(eq=False)
class Replica:
    """One replica. ``base_url`` is its URL as shown (no userinfo, no query), or names a
    replica that is not an HTTP endpoint; ``pool`` is what sends to it, which only its provider
    uses: the remote provider's HTTP ``Transport``, the Ray provider's actor handle (anything
    with an async ``close()``, which :meth:`Dispatcher.close` calls)."""

    base_url: str
    pool: Any
    rates: RateBuckets
    settings: AdaptiveSettings
    adaptive: bool
    lanes: dict[str, Lane] = field(default_factory=dict)
    quota: HeaderQuota = field(default_factory=HeaderQuota)
    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=512))  # True: throttled
    paused_until: float = 0.0  # endpoint-wide throttle (requests told Retry-After pass)
    held_until: float = 0.0  # announced quota without room (holds every request)
    failures: int = 0  # consecutive
    ejected_until: float = 0.0
    ejections: int = 0
    last_error: str = ""
    number: int = 0  # its position among the dispatcher's endpoints: the rendezvous salt
    clock: Callable[[], float] = time.monotonic  # the dispatcher's

    def in_flight(self) -> int:
        return sum(lane.in_use for lane in self.lanes.values())

    def lane(self, model: str) -> Lane:
        lane = self.lanes.get(model)
        if lane is None:
            control = AdaptiveLimit(self.settings, self.adaptive, clock=self.clock)
            lane = self.lanes[model] = Lane(self, model, control)
            # enough for every success that can overlap one request: at most the limit was in
            # flight when it arrived, and as many again may be answered before its refusal
            lane.answered = deque(maxlen=max(256, 4 * self.settings.maximum))
        return lane


Waiter = tuple["Replica | None", "int | None", "asyncio.Future[Lane]"]  # avoid, key, slot
_NEW, _RETRY = 0, 1  # queues: new requests; retries that already waited their Retry-After


class Dispatcher:
    """Hands out lane slots across endpoints (see the module docstring). ``clock``: seconds,
    monotonic; the ``sent_at`` times handed to the outcome calls are read from it too."""

    def __init__(
        self,
        endpoints: list[Replica],
        *,
        eject_after: int,
        eject_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoints = endpoints
        self.clock = clock
        for number, ep in enumerate(endpoints):
            ep.number = number
            ep.clock = clock
        self.eject_after = eject_after
        self.eject_s = eject_s
        self._waiters: dict[tuple[str, int], deque[Waiter]] = {}

    # ------------------------------------------------------------------ choosing a lane

    def _pick(
        self,
        model: str,
        avoid: Replica | None,
        past_pause: bool = False,
        key: int | None = None,
    ) -> Lane | None:
        """The least-loaded lane with a free slot (with a prefix ``key``: the first with one in
        the key's rendezvous ranking), or None. While some usable endpoint has rpm/tpm room,
        endpoints without it are skipped (better to wait for a slot there than to hold one here
        waiting for the bucket); the endpoint to avoid comes last."""
        now = self.clock()
        if len(self.endpoints) == 1:  # the common case, kept cheap
            ep = self.endpoints[0]
            if (
                ep.ejected_until > now
                or (ep.paused_until > now and not past_pause)
                or (ep.quota.active and self._held(ep, now))
            ):
                return None
            lane = ep.lane(model)
            return lane if lane.free() > 0 else None
        usable = [
            ep
            for ep in self.endpoints
            if ep.ejected_until <= now
            and (ep.paused_until <= now or past_pause)
            and not (ep.quota.active and self._held(ep, now))
        ]
        with_room = [ep for ep in usable if not ep.rates.active or ep.rates.has_capacity(0.0)]
        best: Lane | None = None
        best_score: tuple[bool, float | int] | None = None
        for ep in with_room or usable:
            lane = ep.lane(model)
            if lane.free() <= 0:
                continue
            if key is None:
                score = (ep is avoid, lane.in_use / max(lane.control.limit, 1))
            else:
                score = (ep is avoid, -hash((key, ep.number)))
            if best_score is None or score < best_score:
                best, best_score = lane, score
        return best

    def _held(self, ep: Replica, now: float) -> bool:
        """Whether the endpoint's announced quota has no room now (then it is held until the
        quota's reset, or until the next answer reports it when the reset is unknown)."""
        if ep.held_until > now:
            return True
        until = ep.quota.hold_until(now, ep.in_flight())
        if until is None:
            return False
        if until != math.inf:
            ep.held_until = until
            asyncio.get_running_loop().call_later(until - now, self._grant_all)
        return True

    def try_acquire(
        self,
        model: str,
        avoid: Replica | None = None,
        past_pause: bool = False,
        key: int | None = None,
    ) -> Lane | None:
        if self._waiters.get((model, _RETRY)) or (
            not past_pause and self._waiters.get((model, _NEW))
        ):
            return None  # first come, first served
        lane = self._pick(model, avoid, past_pause, key)
        if lane is not None:
            lane.in_use += 1
            if lane.endpoint.quota.active:
                lane.endpoint.quota.reserve()
        return lane

    async def acquire(
        self,
        model: str,
        avoid: Replica | None = None,
        past_pause: bool = False,
        key: int | None = None,
    ) -> Lane:
        """A slot on a lane for ``model`` (``lane.in_use`` already counts it); waits while
        every usable lane is full or paused (``past_pause``: the caller already waited the
        ``Retry-After`` it was given, so pauses do not hold it; ``key``: the request's prefix
        key, for affinity). Raises
        :class:`EndpointUnavailable` when every endpoint is ejected."""
        lane = self.try_acquire(model, avoid, past_pause, key)
        if lane is not None:
            return lane
        self._check_available()
        fut: asyncio.Future[Lane] = asyncio.get_running_loop().create_future()
        queue = self._waiters.setdefault((model, _RETRY if past_pause else _NEW), deque())
        entry: Waiter = (avoid, key, fut)
        queue.append(entry)
        self._grant(model)
        try:
            return await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result())  # granted as we were cancelled: give it back
            else:
                with contextlib.suppress(ValueError):  # already handed on
                    queue.remove(entry)
            raise

    def _check_available(self) -> None:
        problem = self._unavailable()
        if problem is not None:
            raise problem

    def _unavailable(self) -> EndpointUnavailable | None:
        now = self.clock()
        back = [ep.ejected_until for ep in self.endpoints]
        if not all(t > now for t in back):
            return None
        detail = "; ".join(f"{ep.base_url}: {ep.last_error}" for ep in self.endpoints)
        return EndpointUnavailable(
            f"every endpoint is ejected after repeated failures ({detail})", min(back) - now
        )

    def release(self, lane: Lane) -> None:
        lane.in_use -= 1
        self._grant(lane.model)

    def _grant(self, model: str) -> None:
        for kind in (_RETRY, _NEW):
            queue = self._waiters.get((model, kind))
            while queue:
                avoid, key, fut = queue[0]
                if fut.done():
                    queue.popleft()
                    continue
                lane = self._pick(model, avoid, kind == _RETRY, key)
                if lane is None:
                    break
                queue.popleft()
                lane.in_use += 1
                if lane.endpoint.quota.active:
                    lane.endpoint.quota.reserve()
                fut.set_result(lane)

    def _grant_all(self) -> None:
        for model in {model for model, _ in self._waiters}:
            self._grant(model)

    def waiting(self, model: str) -> int:
        waiters = self._waiters  # read once per success: no generator
        return len(waiters.get((model, _NEW)) or ()) + len(waiters.get((model, _RETRY)) or ())

    # ------------------------------------------------------------------ outcomes

    def on_success(self, lane: Lane, sent_at: float) -> None:
        ep = lane.endpoint
        ep.failures = 0
        ep.recent.append(False)
        lane.succeeded += 1
        lane.answered.append((sent_at, self.clock()))
        saturated = lane.in_use >= lane.control.limit or self.waiting(lane.model) > 0
        lane.control.on_success(sent_at, saturated)
        if lane.ramp != math.inf:
            lane.ramp += 1
            if lane.ramp >= lane.control.limit:
                lane.ramp = math.inf

    def on_throttle(
        self, lane: Lane, sent_at: float, retry_after_s: float | None, *, quota_zero: bool = False
    ) -> None:
        """A 429/503/529 answer. ``quota_zero``: its quota headers say the quota is used up
        (the quota hold paces that; the concurrency limit is left alone). Otherwise an
        endpoint-wide throttle (see :meth:`endpoint_wide`) cuts the limit as a rate limit and
        pauses the endpoint for ``retry_after_s``; an isolated one shows the server's capacity
        to the limit: the requests it was serving when this one arrived
        (:meth:`Lane.served_at`)."""
        lane.throttled += 1
        ep = lane.endpoint
        ep.recent.append(True)
        if quota_zero:
            if retry_after_s is not None and retry_after_s > 0:
                ep.quota.refused_until(self.clock(), retry_after_s)
            return
        if self.endpoint_wide(ep) and not lane.serving_since(max(sent_at, self.clock() - 1.0)):
            lane.control.on_throttle(sent_at)
            if retry_after_s is not None and retry_after_s > 0:
                self.pause(ep, self.clock() + retry_after_s)
        else:
            served = lane.served_at(sent_at) if lane.sent else lane.in_use - 1
            lane.control.on_throttle(sent_at, served=served)

    @staticmethod
    def endpoint_wide(ep: Replica) -> bool:
        """Whether most of the endpoint's recent answers were throttles: of the last ``k``
        (``k`` = its requests in flight, at least 4), at least 4 and more than half."""
        recent = ep.recent
        k = min(len(recent), max(4, ep.in_flight()))
        throttled = sum(itertools.islice(reversed(recent), k))
        return throttled >= 4 and 2 * throttled > k

    def on_failure(self, lane: Lane, message: str, *, connection: bool) -> None:
        """A connection failure or a 5xx answer (not a throttle): counts toward ejection."""
        ep = lane.endpoint
        lane.failed += 1
        ep.failures += 1
        ep.last_error = message
        if ep.failures < self.eject_after or ep.ejected_until > self.clock():
            return
        others_in = any(e is not ep and e.ejected_until <= self.clock() for e in self.endpoints)
        if connection or others_in:
            self.eject(ep)

    def pause(self, ep: Replica, until: float) -> None:
        """Stop new dispatches to ``ep`` until ``until`` (monotonic time), then restart it
        gradually."""
        if until <= ep.paused_until:
            return
        ep.paused_until = until
        loop = asyncio.get_running_loop()
        loop.call_later(until - self.clock(), self._pause_ended, ep, until)

    def _pause_ended(self, ep: Replica, until: float) -> None:
        if ep.paused_until != until:  # extended meanwhile: a later timer ends it
            return
        for lane in ep.lanes.values():
            lane.ramp = max(lane.control.settings.minimum, math.ceil(lane.control.limit / 2))
        self._grant_all()

    def eject(self, ep: Replica) -> None:
        ep.ejected_until = self.clock() + self.eject_s
        ep.ejections += 1
        ep.failures = self.eject_after - 1  # on probation when it returns
        asyncio.get_running_loop().call_later(self.eject_s, self._grant_all)
        problem = self._unavailable()
        if problem is None:
            self._grant_all()
            return
        # nobody can serve the queued attempts now: fail them so they back off and retry
        for queue in self._waiters.values():
            while queue:
                *_, fut = queue.popleft()
                if not fut.done():
                    fut.set_exception(problem)

    def readmit(self, ep: Replica) -> None:
        """Take an ejected endpoint back now (its owner knows it is healthy again, e.g. a
        restarted replica), and hand it the queued attempts."""
        ep.ejected_until = 0.0
        ep.failures = 0
        self._grant_all()

    # ------------------------------------------------------------------ reporting

    def stats(self) -> list[LaneStats]:
        now = self.clock()
        return [
            LaneStats(
                url=ep.base_url,
                model=lane.model,
                concurrency_limit=lane.control.limit,
                in_flight=lane.in_use,
                sent=lane.sent,
                succeeded=lane.succeeded,
                throttled=lane.throttled,
                failed=lane.failed,
                cuts=lane.control.cuts,
                ejected=ep.ejected_until > now,
                paused_s=max(0.0, ep.paused_until - now, ep.held_until - now),
                output_tokens_estimate=ep.rates.output_tokens_estimate,
            )
            for ep in self.endpoints
            for lane in ep.lanes.values()
        ]

    def concurrency_limit(self) -> int:
        """The sum of the current limits of the endpoints that are in (for progress reports)."""
        now = self.clock()
        total = 0
        for ep in self.endpoints:
            if ep.ejected_until > now:
                continue
            if ep.lanes:
                total += sum(lane.control.limit for lane in ep.lanes.values())
            else:
                total += AdaptiveLimit(ep.settings, ep.adaptive).limit
        return total

    async def close(self) -> None:
        """Close every endpoint's connections."""
        for ep in self.endpoints:
            await ep.pool.close()
