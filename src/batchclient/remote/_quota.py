"""Pacing from the quota a server announces in its answers' headers (OpenAI's
``x-ratelimit-*``), so that dispatch slows down before the quota runs out, with no ``rpm`` /
``tpm`` set by the user.

Headers read (OpenAI, "Rate limits" guide; also sent by Azure OpenAI, Groq, vLLM routers and
most gateways that copy them):

- ``x-ratelimit-limit-requests`` / ``-tokens``: the quota per window;
- ``x-ratelimit-remaining-requests`` / ``-tokens``: what is left after this request was counted;
- ``x-ratelimit-reset-requests`` / ``-tokens``: the time until the quota is back to its limit,
  as a Go duration (``1s``, ``6m0s``, ``230ms``, ``1m30.5s``) or plain seconds.

Unknown, negative or malformed values are ignored, never fatal.

The model: the server counts a request when it arrives and reports what remains. The freshest
report (the answer to the request sent last) is the baseline; every request sent since then is
subtracted from it (their answers are not back yet), so the estimate does not run ahead of the
server. While the estimate has no room for a request, the endpoint is held until the reported
reset time; at the reset the remaining quota is taken to be the announced limit again, minus
what is sent from then on, until the next report arrives. A server whose quota refills
gradually (OpenAI's) is used at its rate either way: holding until it is full and then sending
a burst of the limit averages out to the limit per window.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["HeaderQuota", "parse_duration"]

_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|us|µs|ns|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_MAX_DURATION_S = 7 * 86400.0  # a week: anything longer is not a rate-limit window


def parse_duration(value: str | None) -> float | None:
    """Seconds from a Go-style duration (``1m30.5s``, ``230ms``, ``6m0s``) or a plain number
    of seconds; None when absent, malformed, negative or longer than a week."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                return None
            seconds += float(match.group(1)) * _UNIT_S[match.group(2)]
            pos = match.end()
        if pos == 0 or pos != len(text):
            return None
    if not math.isfinite(seconds) or not 0 <= seconds <= _MAX_DURATION_S:
        return None
    return seconds


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


@dataclass
class _Dimension:
    """One quota (requests or tokens). ``sent`` counts what this client sent; ``remaining``
    is as of the moment ``sent`` was ``base``; ``reset_at`` is a monotonic time."""

    name: str
    limit: float | None = None
    remaining: float = math.inf
    base: float = 0.0
    reset_at: float = math.inf
    seen_mark: float = -1.0  # the send mark of the freshest report taken
    sent: float = 0.0
    active: bool = False

    def observe(self, headers: Mapping[str, str], mark: float, now: float) -> bool:
        """Take this answer's report if it is the freshest; True when its quota is at zero."""
        remaining = _number(headers.get(f"x-ratelimit-remaining-{self.name}"))
        if remaining is None:
            return False
        if mark >= self.seen_mark:
            self.seen_mark = mark
            self.active = True
            self.remaining = remaining
            self.base = mark
            limit = _number(headers.get(f"x-ratelimit-limit-{self.name}"))
            if limit is not None and limit > 0:
                self.limit = limit
            reset = parse_duration(headers.get(f"x-ratelimit-reset-{self.name}"))
            self.reset_at = now + reset if reset is not None else math.inf
        return remaining <= 0

    def available(self, now: float) -> float:
        if now >= self.reset_at:  # the window turned over: back to the limit from here on
            self.remaining = self.limit if self.limit is not None else math.inf
            self.base = self.seen_mark = self.sent
            self.reset_at = math.inf
        return self.remaining - (self.sent - self.base)


@dataclass
class HeaderQuota:
    """The announced request and token quotas of one endpoint. Inactive (free) until an
    answer carries the headers. ``max_hold_s``: the longest hold (seconds; the longest
    ``Retry-After`` honoured), after which requests go and find out."""

    max_hold_s: float = 60.0
    requests: _Dimension = field(default_factory=lambda: _Dimension("requests"))
    tokens: _Dimension = field(default_factory=lambda: _Dimension("tokens"))
    last_cost: float = 1.0
    pending: int = 0  # slots handed out whose request is not sent yet

    @property
    def active(self) -> bool:
        return self.requests.active or self.tokens.active

    def reserve(self) -> None:
        """A slot was handed out: count its request now, before it is sent (the dispatcher
        hands out many slots in one go, and each must see the others)."""
        self.pending += 1

    def unreserve(self) -> None:
        """A slot handed out was given back without sending."""
        self.pending = max(0, self.pending - 1)

    def on_send(self, tokens: float) -> tuple[float, float]:
        """Count one request of ``tokens`` estimated tokens; returns its send marks (what had
        been sent up to and including it), to hand back to :meth:`observe` with its answer."""
        self.unreserve()
        self.requests.sent += 1
        self.tokens.sent += tokens
        if tokens > 0:
            self.last_cost = tokens
        return self.requests.sent, self.tokens.sent

    def observe(self, headers: Mapping[str, str], marks: tuple[float, float], now: float) -> bool:
        """Read an answer's ``x-ratelimit-*`` headers; True when it says a quota is at zero.
        ``marks`` are what :meth:`on_send` returned for the answered request."""
        zero = self.requests.observe(headers, marks[0], now)
        return self.tokens.observe(headers, marks[1], now) or zero

    def hold_until(self, now: float, in_flight: int) -> float | None:
        """None when a request may be sent now; otherwise until when to hold (``math.inf``:
        until the next report, which an answer in flight will bring)."""
        until = None
        pending = float(self.pending)
        for dim, cost in ((self.requests, 1.0), (self.tokens, self.last_cost)):
            if dim.active and dim.available(now) - pending * cost < cost:
                if dim.reset_at == math.inf and in_flight == 0:
                    continue  # no report is on its way: send one to learn where things stand
                until = dim.reset_at if until is None else max(until, dim.reset_at)
        return until if until is None or until == math.inf else min(until, now + self.max_hold_s)

    def reset_in(self, now: float) -> float | None:
        """Seconds until the next known reset of a quota that is used up, else None."""
        waits = [
            dim.reset_at - now
            for dim in (self.requests, self.tokens)
            if dim.active
            and dim.remaining - (dim.sent - dim.base) <= 0
            and dim.reset_at > now
            and dim.reset_at != math.inf
        ]
        return max(waits) if waits else None
