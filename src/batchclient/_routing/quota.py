"""Pacing from the quota a server announces in its answers' headers, so that dispatch slows
down before the quota runs out, with no ``rpm`` / ``tpm`` set by the user.

Headers read (the first family present wins, per quota):

- OpenAI (its "Rate limits" guide; also Groq, Together, vLLM routers and most gateways that copy
  it): ``x-ratelimit-limit-requests`` / ``-tokens`` (the quota per period),
  ``x-ratelimit-remaining-requests`` / ``-tokens`` (what is left after this request was
  counted), ``x-ratelimit-reset-requests`` / ``-tokens`` (the time until the quota is back to its
  limit);
- Azure OpenAI: ``x-ratelimit-remaining-requests`` / ``-tokens`` only, no limit and no reset;
  its 429s say when to come back in ``retry-after-ms`` (read by :mod:`.retry`), which is then
  taken as the reset of the quota at zero, and the limit is taken to be the most ever left
  (plus the request just counted);
- API gateways in front of vLLM (Kong, Envoy, nginx modules) and the IETF draft: unsuffixed
  ``x-ratelimit-limit`` / ``-remaining`` / ``-reset`` or ``ratelimit-limit`` / ``-remaining`` /
  ``-reset``: a request quota.

A reset is a Go duration (``1s``, ``6m0s``, ``230ms``, ``1m30.5s``), plain seconds (``0.23``),
or the epoch second it happens (a number above 10^9; above 10^12, epoch milliseconds). Unknown,
negative or malformed values are ignored, never fatal.

The model: the server counts a request when it arrives and reports what remains. The freshest
report (the answer to the request sent last) is the baseline; every request sent since then is
subtracted from it (their answers are not back yet), so the estimate does not run ahead of the
server. While the estimate has no room for a request, the replica is held until the reported
reset time; at the reset the remaining quota is taken to be the announced limit again, minus
what is sent from then on, until the next report arrives. A server whose quota refills
gradually (OpenAI's) is used at its rate either way: holding until it is full and then sending
a burst of the limit averages out to the limit per period. A token quota is counted with this
client's estimate of each request (no tokenizer), scaled by what the server really counts, learned
from how far ``remaining`` falls between two reports. With no reset announced, one
request at a time goes to learn where the quota stands, and a refusal's ``Retry-After`` holds
the replica until then.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["HeaderQuota", "announces_quota", "parse_duration", "parse_reset"]

_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|us|µs|ns|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_MAX_DURATION_S = 7 * 86400.0  # a week: anything longer is not a rate-limit period


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


_EPOCH_S = 1e9  # a reset number above this is an epoch time (2001 on), not a duration
_EPOCH_MS = 1e12


def parse_reset(value: str | None, *, wall: float | None = None) -> float | None:
    """Seconds until a quota's reset: a duration (:func:`parse_duration`) or an epoch time in
    seconds (or milliseconds); ``wall`` is the current epoch time (``time.time()`` if None).
    None when absent, malformed, past by more than a second, or more than a week away."""
    if not value:
        return None
    number = _number(value)
    if number is None or number < _EPOCH_S:
        return parse_duration(value)
    epoch = number / 1000.0 if number >= _EPOCH_MS else number
    seconds = epoch - (time.time() if wall is None else wall)
    if not -1.0 <= seconds <= _MAX_DURATION_S:
        return None
    return max(0.0, seconds)


# (limit, remaining, reset) header names, in order of preference, per quota
_FAMILIES = {
    "requests": (
        (
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ),
        ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"),
        ("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"),
    ),
    "tokens": (
        ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
    ),
}
_REMAINING = tuple(family[1] for families in _FAMILIES.values() for family in families)


def announces_quota(headers: Mapping[str, str]) -> bool:
    """Whether an answer carries a remaining-quota header of any family read here."""
    for name in _REMAINING:  # noqa: SIM110 (once per answer: a loop costs less than any())
        if name in headers:
            return True
    return False


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
    # what the server counts per unit this client counts (tokens: the server's count over our
    # estimate, learned from how far ``remaining`` falls between two reports of one period)
    scale: float = 1.0
    report: tuple[float, float] | None = None  # (mark, remaining) of the last report taken
    counted: float = 0.0  # decayed sums of the server's count and ours, for ``scale``
    estimated: float = 0.0

    def observe(self, headers: Mapping[str, str], mark: float, now: float) -> bool:
        """Take this answer's report if it is the freshest; True when its quota is at zero."""
        family = next((f for f in _FAMILIES[self.name] if f[1] in headers), None)
        remaining = _number(headers.get(family[1])) if family is not None else None
        if family is None or remaining is None:
            return False
        limit_name, _, reset_name = family
        if mark >= self.seen_mark:
            self._learn_scale(mark, remaining)
            self.seen_mark = mark
            self.active = True
            self.remaining = remaining
            self.base = mark
            limit = _number(headers.get(limit_name))
            if limit is not None and limit > 0:
                self.limit = limit
            else:  # none announced (Azure): at least what was left with this request counted
                self.limit = max(self.limit or 0.0, remaining + 1)
            reset = parse_reset(headers.get(reset_name))
            self.reset_at = now + reset if reset is not None else math.inf
        return remaining <= 0

    def _learn_scale(self, mark: float, remaining: float) -> None:
        """Compare the server's count with ours between the previous report and this one."""
        if self.name != "tokens":  # a request is one request on both sides
            return
        previous, self.report = self.report, (mark, remaining) if remaining > 0 else None
        if previous is None or mark <= previous[0] or not 0 < remaining <= previous[1]:
            # the first report, the quota refilled in between, or the quota is at zero (then
            # requests are refused, and the server does not count them: they would skew it)
            return
        self.counted = 0.9 * self.counted + (previous[1] - remaining)
        self.estimated = 0.9 * self.estimated + (mark - previous[0])
        if self.estimated > 0 and self.counted > 0:
            self.scale = min(20.0, max(0.05, self.counted / self.estimated))

    def available(self, now: float) -> float:
        """What is left for this client now, in the server's units."""
        if now >= self.reset_at:  # the period turned over: back to the limit from here on
            self.remaining = self.limit if self.limit is not None else math.inf
            self.base = self.seen_mark = self.sent
            self.reset_at = math.inf
            self.report = None
        return self.remaining - (self.sent - self.base) * self.scale


@dataclass
class HeaderQuota:
    """The announced request and token quotas of one replica. Inactive (free) until an
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
        if self.pending > 0:
            self.pending -= 1

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

    def refused_until(self, now: float, wait_s: float) -> None:
        """A refusal for a used-up quota said to come back in ``wait_s`` seconds: that is the
        reset of every quota at zero whose answers announce none (Azure's)."""
        for dim in (self.requests, self.tokens):
            if dim.active and dim.reset_at == math.inf and dim.available(now) <= 0:
                dim.reset_at = now + wait_s

    def hold_until(self, now: float, in_flight: int) -> float | None:
        """None when a request may be sent now; otherwise until when to hold (``math.inf``:
        until the next report, which an answer in flight will bring)."""
        until = None
        pending = float(self.pending)
        for dim, cost in ((self.requests, 1.0), (self.tokens, self.last_cost)):
            cost *= dim.scale
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
            and dim.remaining - (dim.sent - dim.base) * dim.scale <= 0
            and dim.reset_at > now
            and dim.reset_at != math.inf
        ]
        return max(waits) if waits else None
