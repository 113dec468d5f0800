"""Replicas, their (replica, model) lanes, and the dispatcher that hands out request slots.

- A **lane** is one (replica, model): its own adaptive concurrency limit and counters (limits
  are per replica and model, not per API key: inspect_ai PR #3984).
- A **replica** is one server instance: its HTTP pool (or Ray actor), rpm/tpm buckets, health and
  ``Retry-After`` pause. All lanes of a replica share its pause and its health.
- The **dispatcher** gives each attempt a slot on the least-loaded usable lane of its model
  (fewest in flight relative to its limit; only replicas with rpm/tpm room while any has some;
  the replica of the previous failed attempt last). With no free slot the attempt queues
  (first come, first served per model) and is handed a slot directly when one frees up, a pause
  ends or an ejected replica returns.
- **Prefix affinity**: an attempt with a prefix key (:mod:`.._core.prefix`: the context of a
  scoring request, the leading messages of a chat) goes to the usable replica with room that
  ranks first for that key by rendezvous hashing (highest ``hash((key, replica number))``),
  so requests that share a prefix meet the KV cache that prefix already filled; when that
  replica's lane is full, to the next in the key's ranking (the load spills in a fixed order,
  so the second replica's cache warms for it too). Attempts without a key go least-loaded.
  Queued attempts take whatever slot frees first (the queue stays first come, first served):
  under saturation affinity yields to keeping every replica busy.
- **Throttles**: a 429/503/529 holds the request that got it until its ``Retry-After`` (the
  caller's retry waits it); the other requests go on. The replica as a whole is paused only when
  the throttling is replica-wide: most of its recent answers (as many as it has in flight, at
  least 4) were throttles, none was a success since the refused request was sent (within the
  last second: a server still serving some is at its capacity, which the limit finds, as when
  its capacity falls), and the server said until when. When the pause ends, each lane
  restarts at half its limit and regains one slot per success (a gradual restart, not a burst).
  A request that was itself told ``Retry-After`` and has waited it is not held by later pauses
  (it does what the server asked) and is served before new requests. (Pausing the replica for
  every ``Retry-After``, as inspect_ai #5137 proposed, drove a concurrency-limited server at a
  third of its capacity: each excess request stopped the others, which were succeeding.)
- **Announced quota**: a replica whose answers carry ``x-ratelimit-*`` headers is held, for
  every request, while the quota they announce has no room, until their reset time
  (:mod:`.quota`).
- **Ejection**: ``eject_after`` consecutive connection failures or 5xx answers (500, 502, 504,
  52x) take a replica out for ``eject_s`` seconds; its requests go elsewhere. On its return one
  more failure ejects it again. If every replica is out, attempts fail fast with
  :class:`ReplicasUnavailable` (retried by the caller until its attempts run out: never a hang).
  Only the replica's own faults count: the failure of a request that already failed on a
  replica (the caller says so, ``counts=False``) says more about the request than about the
  replica, so one body that breaks every server it reaches does not eject them in turn. The
  last replica still in is ejected only when it refuses connections (nothing listens: a
  restart); a 5xx, a timeout or a connection it dropped is paced by backoff instead, since
  they may be one tenant's requests and ejecting would fail everyone's.
- **Probing**: with a ``probe`` (the remote provider's: ``GET /models``), an ejected replica is
  asked every ``probe_s`` seconds whether it answers, and readmitted on probation (one more
  failure ejects it again) as soon as it does, rather than at the end of ``eject_s``.
- **Nothing listening**: a refused connection to a replica that has never answered ejects it
  at once (no server there, or not yet). When every replica is in that state the attempts fail
  at once with a final :class:`ReplicasUnavailable` (not retried: a missing server is not a
  slow one, and backing off would only delay the error by the whole retry budget). A replica
  that has answered before and refuses now is restarting: its refusals count toward ejection
  and are retried like any connection failure, and so are refusals while another replica is
  in.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .adaptive import AdaptiveLimit, AdaptiveSettings
from .quota import HeaderQuota
from .rates import RateBuckets

__all__ = ["Dispatcher", "Lane", "LaneStats", "Replica", "ReplicasUnavailable"]


class ReplicasUnavailable(Exception):
    """Every replica is ejected; ``wait_s`` is when the first one returns. ``final``: nothing
    listens at any of them (each refused the connection and none has ever answered): retrying
    is pointless."""

    def __init__(self, message: str, wait_s: float, *, final: bool = False):
        super().__init__(message)
        self.wait_s = wait_s
        self.final = final


@dataclass
class LaneStats:
    """What one (replica, model) lane has seen. ``concurrency_limit`` is its current limit;
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
    replica: Replica
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
        (which pauses the replica)."""
        return bool(self.answered) and self.answered[-1][1] > since

    def free(self) -> int:
        limit = self.control.limit
        if self.ramp < limit:
            limit = int(self.ramp)
        return limit - self.in_use


@dataclass(eq=False)
class Replica:
    """One replica. ``base_url`` is its URL as shown (no userinfo, no query), or names a
    replica that is not an HTTP server; ``pool`` is what sends to it, which only its provider
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
    paused_until: float = 0.0  # replica-wide throttle (requests told Retry-After pass)
    held_until: float = 0.0  # announced quota without room (holds every request)
    failures: int = 0  # consecutive
    ejected_until: float = 0.0
    ejections: int = 0
    last_error: str = ""
    number: int = 0  # its position among the dispatcher's replicas: the rendezvous salt
    clock: Callable[[], float] = time.monotonic  # the dispatcher's
    answered: bool = False  # it has sent an HTTP answer (any status) at least once
    refused: bool = False  # its last connection attempt was refused

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
    """Hands out lane slots across replicas (see the module docstring). ``clock``: seconds,
    monotonic; the ``sent_at`` times handed to the outcome calls are read from it too."""

    def __init__(
        self,
        replicas: list[Replica],
        *,
        eject_after: int,
        eject_s: float,
        clock: Callable[[], float] = time.monotonic,
        probe: Callable[[Replica], Awaitable[bool]] | None = None,
        probe_s: float = 1.0,
    ) -> None:
        self.replicas = replicas
        self.probe, self.probe_s = probe, probe_s
        self._probes: dict[int, asyncio.Task[None]] = {}  # by replica number
        self.clock = clock
        for number, replica in enumerate(replicas):
            replica.number = number
            replica.clock = clock
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
        the key's rendezvous ranking), or None. While some usable replica has rpm/tpm room,
        replicas without it are skipped (better to wait for a slot there than to hold one here
        waiting for the bucket); the replica to avoid comes last."""
        now = self.clock()
        if len(self.replicas) == 1:  # the common case, kept cheap
            replica = self.replicas[0]
            if (
                replica.ejected_until > now
                or (replica.paused_until > now and not past_pause)
                or (replica.quota.active and self._held(replica, now))
            ):
                return None
            lane = replica.lane(model)
            return lane if lane.free() > 0 else None
        usable = [
            replica
            for replica in self.replicas
            if replica.ejected_until <= now
            and (replica.paused_until <= now or past_pause)
            and not (replica.quota.active and self._held(replica, now))
        ]
        with_room = [
            replica
            for replica in usable
            if not replica.rates.active or replica.rates.has_capacity(0.0)
        ]
        best: Lane | None = None
        best_score: tuple[bool, float | int] | None = None
        for replica in with_room or usable:
            lane = replica.lane(model)
            if lane.free() <= 0:
                continue
            if key is None:
                score = (replica is avoid, lane.in_use / max(lane.control.limit, 1))
            else:
                score = (replica is avoid, -hash((key, replica.number)))
            if best_score is None or score < best_score:
                best, best_score = lane, score
        return best

    def _held(self, replica: Replica, now: float) -> bool:
        """Whether the replica's announced quota has no room now (then it is held until the
        quota's reset, or until the next answer reports it when the reset is unknown)."""
        if replica.held_until > now:
            return True
        until = replica.quota.hold_until(now, replica.in_flight())
        if until is None:
            return False
        if until != math.inf:
            replica.held_until = until
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
            if lane.replica.quota.active:
                lane.replica.quota.reserve()
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
        :class:`ReplicasUnavailable` when every replica is ejected."""
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
        problem = self.unavailable()
        if problem is not None:
            raise problem

    def unavailable(self) -> ReplicasUnavailable | None:
        """What :meth:`acquire` raises now: None while some replica is in."""
        now = self.clock()
        back = [replica.ejected_until for replica in self.replicas]
        if not all(t > now for t in back):
            return None
        if self.nothing_listening():
            urls = ", ".join(replica.base_url for replica in self.replicas)
            return ReplicasUnavailable(
                f"nothing is listening at {urls} (connection refused; "
                f"{self.replicas[0].last_error}): start the server, or check base_url",
                min(back) - now,
                final=True,
            )
        detail = "; ".join(f"{replica.base_url}: {replica.last_error}" for replica in self.replicas)
        return ReplicasUnavailable(
            f"every replica is ejected after repeated failures ({detail})", min(back) - now
        )

    def nothing_listening(self) -> bool:
        """Whether every replica refused its last connection and none has ever answered."""
        return all(replica.refused and not replica.answered for replica in self.replicas)

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
                if lane.replica.quota.active:
                    lane.replica.quota.reserve()
                fut.set_result(lane)

    def _grant_all(self) -> None:
        for model in {model for model, _ in self._waiters}:
            self._grant(model)

    def waiting(self, model: str) -> int:
        waiters = self._waiters  # read once per success: no generator
        return len(waiters.get((model, _NEW)) or ()) + len(waiters.get((model, _RETRY)) or ())

    # ------------------------------------------------------------------ outcomes

    def on_success(self, lane: Lane, sent_at: float) -> None:
        replica = lane.replica
        replica.failures = 0
        replica.recent.append(False)
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
    ) -> bool:
        """A 429/503/529 answer. ``quota_zero``: its quota headers say the quota is used up
        (the quota hold paces that; the concurrency limit is left alone). Otherwise an
        replica-wide throttle (see :meth:`replica_wide`) cuts the limit as a rate limit and
        pauses the replica for ``retry_after_s``; an isolated one shows the server's capacity
        to the limit: the requests it was serving when this one arrived
        (:meth:`Lane.served_at`). Returns whether the server was full: an isolated throttle
        after which the limit is no more than what the server was serving (the request can go
        again as soon as a slot frees under it, without overloading the server)."""
        lane.throttled += 1
        replica = lane.replica
        replica.recent.append(True)
        if quota_zero:
            if retry_after_s is not None and retry_after_s > 0:
                replica.quota.refused_until(self.clock(), retry_after_s)
            return False
        served = lane.served_at(sent_at) if lane.sent else lane.in_use - 1
        # before the first success, refusals are all the answers there are: one that came
        # while earlier requests were still being served shows a capacity (a gateway refusing
        # the 25th request at once), not a rate limit that pauses the replica
        starting = lane.succeeded == 0 and served > 0
        if (
            not starting
            and self.replica_wide(replica)
            and not lane.serving_since(max(sent_at, self.clock() - 1.0))
        ):
            lane.control.on_throttle(sent_at)
            if retry_after_s is not None and retry_after_s > 0:
                self.pause(replica, self.clock() + retry_after_s)
            return False
        lane.control.on_throttle(sent_at, served=served)
        return lane.control.enabled and 0 < lane.control.limit <= served

    @staticmethod
    def replica_wide(replica: Replica) -> bool:
        """Whether most of the replica's recent answers were throttles: of the last ``k``
        (``k`` = its requests in flight, at least 4), at least 4 and more than half."""
        recent = replica.recent
        k = min(len(recent), max(4, replica.in_flight()))
        throttled = sum(itertools.islice(reversed(recent), k))
        return throttled >= 4 and 2 * throttled > k

    def on_failure(
        self,
        lane: Lane,
        message: str,
        *,
        connection: bool,
        refused: bool = False,
        counts: bool = True,
    ) -> None:
        """A connection failure, a timeout or a 5xx answer (not a throttle): counts toward
        ejection as the module docstring says. ``refused``: the connection was refused; a
        replica that never answered is then ejected at once (nothing listens there).
        ``counts``: False when the request already failed on a replica before (its failure
        does not count against this one, unless the connection was refused)."""
        replica = lane.replica
        lane.failed += 1
        replica.last_error = message
        replica.refused = refused
        if refused and not replica.answered:
            if replica.ejected_until <= self.clock():
                self.eject(replica)
            return
        if not counts and not refused:
            return
        replica.failures += 1
        if replica.failures < self.eject_after or replica.ejected_until > self.clock():
            return
        others_in = any(e is not replica and e.ejected_until <= self.clock() for e in self.replicas)
        if refused or others_in:
            self.eject(replica)

    def pause(self, replica: Replica, until: float) -> None:
        """Stop new dispatches to ``replica`` until ``until`` (monotonic time), then restart it
        gradually."""
        if until <= replica.paused_until:
            return
        replica.paused_until = until
        loop = asyncio.get_running_loop()
        loop.call_later(until - self.clock(), self._pause_ended, replica, until)

    def _pause_ended(self, replica: Replica, until: float) -> None:
        if replica.paused_until != until:  # extended meanwhile: a later timer ends it
            return
        for lane in replica.lanes.values():
            lane.ramp = max(lane.control.settings.minimum, math.ceil(lane.control.limit / 2))
        self._grant_all()

    def eject(self, replica: Replica) -> None:
        replica.ejected_until = self.clock() + self.eject_s
        replica.ejections += 1
        replica.failures = self.eject_after - 1  # on probation when it returns
        asyncio.get_running_loop().call_later(self.eject_s, self._grant_all)
        if self.probe is not None and replica.number not in self._probes:
            task = asyncio.get_running_loop().create_task(self._probe_until_back(replica))
            self._probes[replica.number] = task
        problem = self.unavailable()
        if problem is None:
            self._grant_all()
            return
        # nobody can serve the queued attempts now: fail them so they back off and retry
        for queue in self._waiters.values():
            while queue:
                *_, fut = queue.popleft()
                if not fut.done():
                    fut.set_exception(problem)

    def readmit(self, replica: Replica, *, probation: bool = False) -> None:
        """Take an ejected replica back now (its owner knows it is healthy again, e.g. a
        restarted replica), and hand it the queued attempts. ``probation``: one more failure
        ejects it again."""
        replica.ejected_until = 0.0
        replica.failures = self.eject_after - 1 if probation else 0
        self._grant_all()

    async def _probe_until_back(self, replica: Replica) -> None:
        """Ask ``replica`` every ``probe_s`` seconds while it is ejected; readmit it on
        probation once it answers."""
        assert self.probe is not None
        try:
            while replica.ejected_until > self.clock():
                await asyncio.sleep(self.probe_s)
                if replica.ejected_until <= self.clock():
                    return  # its time is up: back by itself
                if await self.probe(replica):
                    self.readmit(replica, probation=True)
                    return
        finally:
            self._probes.pop(replica.number, None)

    # ------------------------------------------------------------------ reporting

    def stats(self) -> list[LaneStats]:
        now = self.clock()
        return [
            LaneStats(
                url=replica.base_url,
                model=lane.model,
                concurrency_limit=lane.control.limit,
                in_flight=lane.in_use,
                sent=lane.sent,
                succeeded=lane.succeeded,
                throttled=lane.throttled,
                failed=lane.failed,
                cuts=lane.control.cuts,
                ejected=replica.ejected_until > now,
                paused_s=max(0.0, replica.paused_until - now, replica.held_until - now),
                output_tokens_estimate=replica.rates.output_tokens_estimate,
            )
            for replica in self.replicas
            for lane in replica.lanes.values()
        ]

    def concurrency_limit(self) -> int:
        """The sum of the current limits of the replicas that are in (for progress reports)."""
        now = self.clock()
        total = 0
        for replica in self.replicas:
            if replica.ejected_until > now:
                continue
            if replica.lanes:
                total += sum(lane.control.limit for lane in replica.lanes.values())
            else:
                total += AdaptiveLimit(replica.settings, replica.adaptive).limit
        return total

    async def close(self) -> None:
        """Stop probing and close every replica's connections."""
        probes = list(self._probes.values())
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        for replica in self.replicas:
            await replica.pool.close()
