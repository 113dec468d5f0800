"""The adaptive concurrency controller's rules, on a fake clock (no sleeping)."""

from __future__ import annotations

import math

import pytest

from batchclient._routing.adaptive import AdaptiveLimit, AdaptiveSettings


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def controller(**kw: float) -> tuple[AdaptiveLimit, Clock]:
    clock = Clock()
    settings = AdaptiveSettings(**{"initial": 8, "minimum": 1, "maximum": 64, **kw})  # type: ignore[arg-type]
    return AdaptiveLimit(settings, clock=clock), clock


def test_slow_start_doubles_per_round_until_the_first_throttle() -> None:
    c, clock = controller()
    for _ in range(8):  # one round of 8 saturated successes
        c.on_success(clock(), saturated=True)
    assert c.limit == 16
    clock.t = 1.0
    assert c.on_throttle(sent_at=0.5)
    assert c.limit == int(16.0 * 0.8)


def test_slow_start_doubles_only_once_a_whole_round_came_back() -> None:
    """Per success, +1 let a round's successes raise the limit before its refusals arrived (an
    overloaded backend refuses as late as it answers), and a second overshoot followed. Now
    the limit doubles when a whole round succeeded, and a throttle within the round stops it."""
    c, clock = controller()
    for _ in range(7):
        c.on_success(clock(), saturated=True)
    assert c.limit == 8  # a round of 8 is not complete yet
    c.on_success(clock(), saturated=True)
    assert c.limit == 16
    for _ in range(12):  # the next round: 12 of 16 succeed, then the server says it is full
        c.on_success(clock(), saturated=True)
    assert c.limit == 16
    clock.t = 0.1
    c.on_throttle(sent_at=0.05, served=12)
    assert (c.limit, c.slow_start) == (12, False)


def test_a_probe_that_held_lets_the_next_go_and_lucky_probes_slow_the_probing() -> None:
    """Above the ceiling, a success sent after a probe step lets the next step go at once, and
    three steps that held restart slow start (a server that grew is found within a cool-down).
    A client counts requests still on their way as in flight, so a step can hold by luck: when
    a later step is refused at the same capacity, the next probe waits twice as long (at most
    two cool-downs)."""
    c, clock = controller(initial=30, cooldown_s=1.0)
    clock.t = 10.0
    c.on_throttle(sent_at=9.0, served=24)
    assert (c.limit, c.ceiling) == (24, 24)
    clock.t = 10.2
    for _ in range(100):  # growth up to the ceiling; no step above it within a cool-down
        c.on_success(sent_at=10.1, saturated=True)
    clock.t = 11.1
    c.on_success(sent_at=11.0, saturated=True)  # the first probe step
    assert c.limit == 25
    clock.t = 11.2
    c.on_success(sent_at=11.15, saturated=True)  # sent after it and answered: it held
    assert (c.limit, c.ceiling) == (26, 24)
    clock.t = 11.3
    c.on_success(sent_at=11.25, saturated=True)  # and the next: the server has grown
    assert (c.limit, c.ceiling, c.slow_start) == (27, None, True)
    clock.t = 11.4
    assert not c.on_throttle(sent_at=11.35, served=24)  # the same 24 again: it was luck
    assert (c.limit, c.ceiling, c.probe_wait, c.cuts) == (24, 24, 2.0, 1)
    clock.t = 12.5
    for _ in range(100):
        c.on_success(sent_at=12.4, saturated=True)
    assert c.limit == 24  # 1.1 s later: the next probe waits its 2 s
    clock.t = 13.5
    c.on_success(sent_at=13.4, saturated=True)
    assert c.limit == 25


def test_after_a_throttle_growth_is_additive() -> None:
    c, clock = controller(initial=20, cooldown_s=1.0)
    clock.t = 1.0
    c.on_throttle(sent_at=0.9)
    assert c.limit == 16
    clock.t = 2.0
    for _ in range(17):  # a round at limit ~16: + max(1, 5 % of 16) = +1 (1/limit per success)
        c.on_success(sent_at=1.5, saturated=True)
    assert c.limit == 17
    for _ in range(17):
        c.on_success(sent_at=1.5, saturated=True)
    assert c.limit == 18


def test_no_growth_when_the_limit_is_not_used_or_the_request_predates_a_throttle() -> None:
    c, clock = controller()
    for _ in range(50):
        c.on_success(0.0, saturated=False)
    assert c.limit == 8
    clock.t = 5.0
    c.on_throttle(sent_at=4.0)
    limit = c.limit
    for _ in range(50):
        c.on_success(sent_at=4.5, saturated=True)  # was in flight when the throttle came
    assert c.limit == limit


def test_one_cut_per_cooldown_and_none_for_requests_sent_before_the_cut() -> None:
    c, clock = controller(initial=40, cooldown_s=2.0)
    clock.t = 10.0
    assert c.on_throttle(sent_at=9.9)
    assert c.limit == 32
    clock.t = 10.5
    assert not c.on_throttle(sent_at=10.2)  # inside the cool-down
    clock.t = 13.0
    assert not c.on_throttle(sent_at=9.95)  # the same burst as the first cut
    assert c.on_throttle(sent_at=12.0)
    assert c.limit == 25


def test_a_throttle_sets_the_limit_to_what_the_server_was_serving() -> None:
    """A refusal shows the capacity: the limit goes to it at once (no cut to 80 % of it: a
    refusal that came after a full service time means the server is full, not overloaded)."""
    c, clock = controller(initial=30, cooldown_s=1.0)
    clock.t = 10.0
    assert c.on_throttle(sent_at=9.0, served=24)
    assert (c.limit, c.ceiling, c.cuts) == (24, 24, 1)
    clock.t = 10.5  # inside the cool-down too: never above what the server just served
    assert c.on_throttle(sent_at=10.2, served=20)
    assert c.limit == 20
    assert not c.on_throttle(sent_at=10.1, served=5)  # the same burst: ignored
    assert c.limit == 20


def test_a_throttle_within_what_the_server_served_cuts_once_per_cooldown() -> None:
    """Refused while the limit was no more than what the server was serving: not this
    client's concurrency (another client, a rate): a multiplicative cut, once per cool-down."""
    c, clock = controller(initial=20, cooldown_s=1.0)
    clock.t = 10.0
    assert c.on_throttle(sent_at=9.0, served=25)
    assert c.limit == 16 and c.ceiling is None
    clock.t = 10.5
    assert not c.on_throttle(sent_at=10.2, served=25)
    assert c.limit == 16
    clock.t = 11.2
    assert c.on_throttle(sent_at=11.1, served=16)
    assert c.limit == 12


def test_probes_that_hold_restart_slow_start() -> None:
    """A server that grew (24 -> 48 in flight): once probes above the old ceiling hold,
    the limit doubles per round trip again instead of creeping up 5 % per round."""
    c, clock = controller(initial=30, cooldown_s=1.0)
    clock.t = 10.0
    c.on_throttle(sent_at=9.0, served=24)
    for t in (11.1, 12.2):
        clock.t = t
        for _ in range(30):
            c.on_success(sent_at=t, saturated=True)
    assert c.ceiling is None and c.slow_start
    for _ in range(2):  # two round trips at the limit
        for _ in range(c.limit):
            c.on_success(sent_at=12.2, saturated=True)
    assert c.limit >= 48


def test_growth_probes_the_capacity_ceiling_one_step_per_cooldown() -> None:
    c, clock = controller(initial=30, cooldown_s=1.0)
    clock.t = 10.0
    c.on_throttle(sent_at=9.0, served=24)  # the server held 24
    assert (c.limit, c.ceiling) == (24, 24)
    clock.t = 10.2
    for _ in range(100):  # a whole cool-down's successes: no step above the ceiling yet
        c.on_success(sent_at=10.1, saturated=True)
    assert c.limit == 24
    clock.t = 11.1
    c.on_success(sent_at=11.0, saturated=True)  # the probe: one step
    assert c.limit == 25
    for _ in range(100):
        c.on_success(sent_at=11.0, saturated=True)
    assert c.limit == 25
    clock.t = 11.2
    assert not c.on_throttle(sent_at=11.15, served=24)  # probe refused: cap, no cut
    assert (c.limit, c.cuts) == (24, 1)
    # a server that grew: two probes hold, the ceiling is forgotten and growth is additive again
    for t in (12.3, 13.4):
        clock.t = t
        for _ in range(50):
            c.on_success(sent_at=t, saturated=True)
    assert c.limit >= 26 and c.ceiling is None
    for _ in range(60):
        c.on_success(sent_at=13.4, saturated=True)
    assert c.limit >= 28


def test_an_unexpected_throttle_below_the_ceiling_cuts() -> None:
    c, clock = controller(initial=30, cooldown_s=1.0)
    clock.t = 10.0
    c.on_throttle(sent_at=9.0, served=24)
    clock.t = 12.0  # capacity shrank (another client): a throttle at 24 with 11 beside
    assert c.on_throttle(sent_at=11.0, served=11)
    assert c.limit == 11 and c.cuts == 2


def test_bounds_are_never_crossed() -> None:
    c, clock = controller(initial=3, minimum=2, maximum=5, cooldown_s=0.0)
    for _ in range(100):
        c.on_success(clock(), saturated=True)
    assert c.limit == 5
    for i in range(100):
        clock.t = float(i + 1)
        c.on_throttle(sent_at=clock.t)
    assert c.limit == 2


def test_fixed_limit_when_not_adaptive() -> None:
    clock = Clock()
    c = AdaptiveLimit(AdaptiveSettings(initial=4, maximum=10), enabled=False, clock=clock)
    assert c.limit == 10
    clock.t = 5.0
    assert not c.on_throttle(sent_at=4.0)
    c.on_success(5.0, saturated=True)
    assert c.limit == 10


def test_a_steady_long_retry_after_walks_the_limit_to_its_minimum_and_it_recovers() -> None:
    """inspect_ai #5137's reproduction: a 429 every 2 s, each carrying an 89 s hint. Their
    controller cut once and froze; ours ignores the hint for its cool-down (15 s here, as
    theirs), so it reaches the minimum in a bounded number of cool-downs, then recovers."""
    c, clock = controller(initial=20, minimum=1, maximum=100, cooldown_s=15.0)
    reached_min_at = None
    for step in range(1, 401):
        clock.t = step * 2.0
        c.on_throttle(sent_at=clock.t - 1.0)  # each retry was sent after the previous cut
        if c.limit == 1 and reached_min_at is None:
            reached_min_at = clock.t
    cuts_needed = math.ceil(math.log(20) / math.log(1 / 0.8))
    assert reached_min_at is not None
    assert reached_min_at <= (cuts_needed + 1) * 16.0  # one cut per cool-down (+ 2 s cadence)
    # the throttle ends: successes of requests sent afterwards grow it back, round by round
    clock.t += 1.0
    rounds = 0
    while c.limit < 20 and rounds < 100:
        for _ in range(c.limit):
            c.on_success(sent_at=clock.t, saturated=True)
        rounds += 1
    assert c.limit >= 20 and rounds <= 25  # bounded: +max(1, 5 %) per round


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        AdaptiveSettings(minimum=5, maximum=4)
    with pytest.raises(ValueError):
        AdaptiveSettings(decrease_factor=1.0)
