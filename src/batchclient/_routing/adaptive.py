"""Adaptive concurrency: how many requests one (replica, model) may have in flight.

An AIMD controller (TCP congestion control, RFC 5681; inspect_ai's adaptive connections) with a
capacity signal: slow start from ``initial`` until the first throttle, then growth by
``increase_ratio`` of the limit per round trip. A throttle (HTTP 429, 503, 529) that shows the
server's capacity (what it was serving when the refused request arrived, counted by
``dispatch``) sets the limit to that capacity at once; any other throttle cuts it by
``decrease_factor``, at most once per ``cooldown_s``, within ``[minimum, maximum]``. The
cool-down is our own constant, never the server's ``Retry-After`` (inspect_ai #5137: extending
it with every hint froze the limit).

- **Start** at ``initial`` and *slow-start*: the limit doubles each time a whole round (as many
  successes as the limit, each finding it in use) came back, until the first throttle.
  Source: inspect_ai adaptive connections (PR #3820: "doubles aggressively during slow-start
  until the first rate-limit episode"), TCP slow start. Not +1 per success: an overloaded
  backend refuses as late as it answers, so a round's successes came before its refusals and
  raised the limit into a second overshoot.
- **Grow** after that by ``max(1, increase_ratio * limit)`` per round trip (spread over the
  successes of one round: each adds that divided by the limit). inspect_ai: +5 % per round;
  promptfoo grows x1.5 after 5 successes, which overshoots more. Only successes of requests sent
  *after* the last throttle count (a success that was already in flight says nothing about the
  new limit), and only while the limit is actually used (no growth while the batch is smaller
  than the limit).
- **Capacity** from an isolated throttle: ``served``, the requests the server was serving when
  the refused one arrived (sent before it and answered with success after it was sent, or
  still unanswered; ``dispatch``). It does not depend on when the refusal comes back: a gateway
  refuses on arrival, an overloaded backend behind a queue only after working on the request as
  long as a success takes, and what is still in flight by then says nothing (counting that cut
  the limit toward 1 against such a server: 28-32 % of its capacity). A limit above the
  capacity is set to it at once: the server is full, not overloaded, so no backing off below
  what it serves. The capacity becomes a ceiling that growth crosses one step per cool-down (a
  probe, like TCP CUBIC's plateau near its last maximum); a refused probe sets the limit back
  without counting as a cut; a step that held (a request sent after it succeeded) lets the
  next go at once, and three that hold mean the server grew: the ceiling is forgotten and the
  limit slow-starts again to find the new capacity. One step can hold by luck (the client
  counts requests still on their way as in flight): growth refused at the same capacity again
  makes the next probe wait two cool-downs, and a refusal at that capacity is no cut.
- **Cut** by ``decrease_factor`` (inspect_ai: x0.8; promptfoo x0.5) on a throttle that the
  capacity does not explain (the limit was no more than what the server served: another
  client, a rate limit) and on a replica-wide one (``served`` None: most answers refused;
  ``dispatch`` also pauses the replica), at most once per ``cooldown_s``, and only for
  requests sent after the previous change (the other answers of the same burst report the same
  overload). A sustained throttle walks the limit to ``minimum`` in at most
  ``log(limit/minimum) / log(1/decrease_factor)`` cool-downs and it grows back as soon as
  requests succeed.
- **Bounds**: never above ``maximum`` (the user's ``max_concurrency``) nor below ``minimum``.

The controller is a plain object with an injectable clock so its rules are tested without
sleeping; the lane in :mod:`.dispatch` applies its integer ``limit``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["AdaptiveLimit", "AdaptiveSettings"]


@dataclass(frozen=True)
class AdaptiveSettings:
    """The controller's constants (see the module docstring for their sources).

    ``initial``/``minimum``/``maximum``: requests in flight. ``increase_ratio``: growth per
    round trip as a fraction of the limit (at least 1 request). ``decrease_factor``: the limit
    is multiplied by this on a throttle. ``cooldown_s``: seconds between two cuts.
    """

    initial: int = 16
    minimum: int = 1
    maximum: int = 64
    increase_ratio: float = 0.05
    decrease_factor: float = 0.8
    cooldown_s: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError("need 1 <= min_concurrency <= max_concurrency")
        if not 0 < self.decrease_factor < 1:
            raise ValueError("decrease_factor must be between 0 and 1")
        if self.increase_ratio < 0 or self.cooldown_s < 0:
            raise ValueError("increase_ratio and cooldown_s must be >= 0")


@dataclass
class AdaptiveLimit:
    """The AIMD state of one (replica, model). ``enabled=False`` pins it at ``maximum``."""

    settings: AdaptiveSettings
    enabled: bool = True
    clock: Callable[[], float] = time.monotonic
    value: float = field(init=False)
    slow_start: bool = field(init=False, default=True)
    last_cut: float = field(init=False, default=-math.inf)
    last_adjust: float = field(init=False, default=-math.inf)
    last_throttle: float = field(init=False, default=-math.inf)
    last_probe: float = field(init=False, default=-math.inf)
    ceiling: int | None = field(init=False, default=None)
    cuts: int = field(init=False, default=0)
    round_base: float = field(init=False, default=0.0)
    round_ok: int = field(init=False, default=0)
    probe_wait: float = field(init=False, default=0.0)
    past_ceiling: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        s = self.settings
        start = s.initial if self.enabled else s.maximum
        self.value = float(min(max(start, s.minimum), s.maximum))
        self._new_round()
        self.probe_wait = s.cooldown_s

    def _new_round(self) -> None:
        self.round_base, self.round_ok = self.value, 0

    @property
    def limit(self) -> int:
        return int(self.value)

    def on_success(self, sent_at: float, saturated: bool) -> bool:
        """A request sent at ``sent_at`` (clock time) succeeded; ``saturated``: the limit was
        fully used. Returns whether the integer limit grew."""
        if not self.enabled or not saturated or sent_at < self.last_throttle:
            return False
        before = self.limit
        s = self.settings
        if self.slow_start:
            # doubled once a whole round came back without a throttle (not +1 per success:
            # a round's successes then arrive before its refusals and send a second overshoot)
            self.round_ok += 1
            if self.round_ok < self.round_base:
                return False
            grown = 2.0 * self.round_base
        else:
            grown = self.value + max(1.0, s.increase_ratio * self.value) / max(self.value, 1.0)
        ceiling = self.ceiling
        if ceiling is not None and grown >= ceiling + 1:
            # above the capacity the server last showed: one probe step per probe wait; the
            # next at once when a request sent after the last step succeeded (it held)
            now = self.clock()
            held = self.limit > ceiling and sent_at >= self.last_probe
            if not held and now - self.last_probe < self.probe_wait:
                return False
            self.last_probe = now
            grown = float(max(self.limit, ceiling) + 1)
            # three steps held (one may be luck: the client counts requests still on their way
            # as in flight): the server has grown, find its new size
            if grown >= ceiling + 3:
                self.past_ceiling, self.ceiling = ceiling, None
                self.slow_start = True
        self.value = min(grown, float(s.maximum))
        if self.slow_start:
            self._new_round()
        return self.limit > before

    def on_throttle(self, sent_at: float, served: int | None = None) -> bool:
        """A request sent at ``sent_at`` (clock time) was throttled (429/503/529). Returns
        whether the limit was cut (a probe refused above the ceiling is not a cut).

        ``served``: how many requests the server was serving when this one arrived (the
        dispatcher counts them: sent before it and answered with success after it was sent, or
        still unanswered); None for a replica-wide throttle, a rate limit rather than a
        capacity. It is the capacity the server just showed, whether it refused at once or only
        after working as long as a success takes. A limit above it is set to it (the ceiling
        that growth then probes one step per cool-down); a limit the server already served
        and still refused means something else (another client, a rate limit): a cut by
        ``decrease_factor``, once per cool-down. Answers of requests sent before the last
        change are ignored (one burst, one signal)."""
        now = self.clock()
        self.last_throttle = now
        if not self.enabled:
            return False
        self.slow_start = False
        if sent_at < self.last_adjust:  # the same burst as the last change
            return False
        s = self.settings
        cooled = now - self.last_cut >= s.cooldown_s
        if served is None:
            if not cooled:
                return False
            self.ceiling = None  # a rate limit, not a capacity
            self.value = max(float(s.minimum), self.value * s.decrease_factor)
            self.last_cut = self.last_adjust = now
            self.cuts += 1
            return True
        cap = max(s.minimum, served)
        probing = self.ceiling is not None and self.limit > self.ceiling
        self.last_adjust = self.last_probe = now  # the next probe one probe wait from now
        if self.limit > cap:  # above what the server showed: to it, at once
            # the same capacity again (a probe, or a growth two lucky probes let through):
            # probe half as often, down to one probe per two cool-downs
            again = cap in (self.ceiling, self.past_ceiling)
            self.probe_wait = min(2 * self.probe_wait, 2 * s.cooldown_s) if again else s.cooldown_s
            probing = probing or self.past_ceiling == cap
            self.past_ceiling = None
            self.ceiling = cap
            self.value = float(cap)
            if probing:
                return False
            self.last_cut = now
            self.cuts += 1
            return True
        if self.ceiling is not None and cap >= self.ceiling:
            return False  # full at the capacity it showed before (a request already on its way)
        if not cooled:
            return False
        self.ceiling = None
        self.value = max(float(s.minimum), self.value * s.decrease_factor)
        self.last_cut = now
        self.cuts += 1
        return True
