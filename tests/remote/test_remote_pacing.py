"""Throttling that keeps the pipe full, against the loopback stub: a ``Retry-After`` holds the
request that got it, the endpoint pauses only for endpoint-wide throttling, and a quota the
server announces in ``x-ratelimit-*`` headers paces dispatch before it runs out."""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
import time
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchclient import RemoteBatchInference, SamplingParams
from batchclient._routing.quota import HeaderQuota, parse_duration
from batchclient.testing import StubReply, StubServer
from batchclient.testing import _stub as stub_module
from remote_util import FAST, FirstWave


def convos(n: int, prefix: str = "n") -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"{prefix}{i}"}] for i in range(n)]


# ---------------------------------------------------------------------------- Retry-After


@pytest.mark.slow
@pytest.mark.parametrize("retry_after", [None, "1"])
async def test_a_concurrency_limited_server_is_kept_full_with_few_429s(
    retry_after: str | None,
) -> None:
    """Capacity 6, 50 ms per answer: 120 req/s at most. Excess requests get 429 (with
    ``Retry-After: 1`` or without). Only they wait (the first refusal of a request, from a full
    server, only for a free slot); the others keep the server full."""
    with StubServer(
        latency_s=0.05, capacity=6, capacity_retry_after=retry_after, record_bodies=True
    ) as stub:
        ticks: list[float] = []  # this event loop's heartbeat: where it stalled, it has gaps

        async def tick() -> None:
            while True:
                ticks.append(time.monotonic())
                await anyio.sleep(0.01)

        async with RemoteBatchInference(stub.url, **FAST) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(tick)
                result = await client.batch_chat_completion("smollm2", convos(360))
                tg.cancel_scope.cancel()
            stats = client.replica_stats()[0]
    assert all(r.error is None for r in result.batch)
    share = stub.stats.by_status[429] / stub.stats.requests
    assert share < 0.05, share
    assert stats.concurrency_limit in range(5, 9) and stub.stats.max_in_flight >= 6
    # After a 429 in the steady state (one per probe) nothing paused: another request reached
    # the server within a second, where a pause honouring Retry-After (1 s) sends nothing else
    # for the second; and the refused request went again within the second too (it waited for
    # a slot, not for Retry-After). Idle, both take one answer's time (0.05 s); the bound is
    # the pause itself, so a loaded machine that slows the server and the client alike leaves
    # room. A window in which the event loop stalled says nothing and is skipped. Without
    # Retry-After the pause would be the retry backoff (under 0.1 s), too short to tell from a
    # slot freeing: there the check guards against pauses of a second or more. The steady
    # state: past the first and before the last 60 arrivals (half a second at the server's
    # rate).
    texts = [str(body["messages"][0]["content"]) for body in stub.stats.bodies]
    times = stub.stats.body_times
    seen: dict[str, int] = {}
    retried: list[tuple[int, int]] = []  # (refused attempt, its retry), by arrival
    for at, text in enumerate(texts):
        if text in seen:
            retried.append((seen[text], at))
        seen[text] = at
    assert retried and len(retried) == stub.stats.by_status[429]
    steady = [(a, b) for a, b in retried if 60 <= a < len(texts) - 60]
    for refused, retry in steady:
        other = next(
            t
            for t, text in zip(times[refused:], texts[refused:], strict=True)
            if text != texts[refused]
        )
        beats = [t for t in ticks if times[refused] - 0.05 <= t <= max(other, times[retry]) + 0.05]
        if max((b - a for a, b in itertools.pairwise(beats)), default=1.0) > 0.05:
            continue  # the whole process stalled (a busy machine): no request could go
        waited = other - times[refused]
        assert waited < 1.0, ("the endpoint stopped after a 429", refused, waited)
        waited = times[retry] - times[refused]
        assert waited < 1.0, ("the refused request waited out Retry-After", refused, waited)


async def test_an_isolated_retry_after_holds_only_its_request() -> None:
    arrivals: list[tuple[float, str]] = []

    def handler(body: dict[str, Any], attempt: int) -> StubReply | None:
        text = stub_module._text_of(body)
        arrivals.append((time.monotonic(), text))
        if text == "trigger" and attempt == 1:
            return StubReply(status=429, headers={"Retry-After": "1"})
        return None

    with StubServer(latency_s=0.05, handler=handler) as stub:
        async with RemoteBatchInference(
            stub.url, max_concurrency=8, adaptive=False, **FAST
        ) as client:
            result = await client.batch_chat_completion(
                "smollm2", [[{"role": "user", "content": "trigger"}], *convos(120)]
            )
    assert all(r.error is None for r in result.batch)
    t429, retried = (t for t, text in arrivals if text == "trigger")
    during = [t for t, _ in arrivals if t429 + 0.02 < t < t429 + 0.95]
    assert len(during) > 10  # the others went on (a pause would let none through)
    assert retried - t429 >= 1.0  # the throttled request waited what the server said
    assert stub.stats.requests == 122


async def test_endpoint_wide_throttling_pauses_new_dispatches() -> None:
    """Every answer to the first wave is ``429 Retry-After: 1``: that is endpoint-wide, so
    nothing new is sent until the second is over; then dispatch restarts gradually. The wave
    (8 = max_concurrency) is counted, not timed, so a busy machine cannot split it."""
    wave = FirstWave(8)
    with StubServer(latency_s=0.02, handler=wave) as stub:
        async with RemoteBatchInference(
            stub.url, max_concurrency=8, adaptive=False, **FAST
        ) as client:
            result = await client.batch_chat_completion("smollm2", convos(80))
    assert all(r.error is None for r in result.batch)
    first, throttled_until = wave.refused[0], wave.refused[-1]
    quiet = [t for t in wave.arrivals if throttled_until + 0.05 < t < first + 0.95]
    assert quiet == [], f"{len(quiet)} requests sent during the pause"
    assert any(t >= first + 0.95 for t in wave.arrivals), "dispatch never resumed"
    assert stub.stats.by_status[429] == 8


# ---------------------------------------------------------------------------- announced quotas


def _median_per_half_second(arrivals: list[float]) -> float:
    """The requests that reach the server in the half second from each arrival, median."""
    arrivals = sorted(arrivals)
    return statistics.median(
        bisect.bisect_left(arrivals, t + 0.5) - i
        for i, t in enumerate(arrivals)
        if t + 0.5 <= arrivals[-1]
    )


@pytest.mark.slow
async def test_a_quota_announced_in_headers_is_used_without_429s() -> None:
    """A gateway allowing 40 requests per 0.5 s window, announced in ``x-ratelimit-*``
    headers, and no rpm set by the user: the client holds before the quota runs out, and
    still sends close to the quota (30 per half second), or where this machine cannot send
    that many, at least 3/4 of what the same client sends the same stub without a quota (the
    lower of two measures, just before and just after: a test beside it may load the machine
    for a few seconds)."""
    before = await _free_rate()
    with StubServer(latency_s=0.03, quota=(40, 0.5)) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            result = await client.batch_chat_completion("smollm2", convos(240))
    can_send = min(before, await _free_rate())
    assert all(r.error is None for r in result.batch)
    assert stub.stats.by_status[429] <= 2, stub.stats.by_status
    paced = _median_per_half_second(stub.stats.arrivals)
    assert paced >= min(30, 0.75 * can_send), (paced, can_send)


async def _free_rate() -> float:
    """Requests per half second this client sends a stub without a quota, on this machine now
    (240 in well under a second on a free machine)."""
    with StubServer(latency_s=0.03) as free:
        async with RemoteBatchInference(free.url, **FAST) as client:
            await client.batch_chat_completion("smollm2", convos(240))
    arrivals = sorted(free.stats.arrivals)
    return 0.5 * (len(arrivals) - 1) / max(arrivals[-1] - arrivals[0], 1e-3)


@pytest.mark.slow  # seconds of waiting: the full suite runs it
async def test_without_the_headers_the_same_gateway_answers_many_429s() -> None:
    """The control for the test above: the same quota, not announced."""
    with StubServer(latency_s=0.03, quota=(40, 0.5), quota_headers=False) as stub:
        async with RemoteBatchInference(stub.url, max_retries=20, **FAST) as client:
            await client.batch_chat_completion("smollm2", convos(120))
    assert stub.stats.by_status[429] > 24


@pytest.mark.slow
async def test_a_token_quota_announced_in_headers_paces_by_tokens() -> None:
    # each request: 1 prompt word + max_tokens 20 = 21 tokens; 420 per 0.5 s = 20 requests
    with StubServer(latency_s=0.02, token_quota=(420, 0.5)) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            result = await client.batch_chat_completion(
                "smollm2", convos(100), sampling_params=SamplingParams(max_tokens=20)
            )
    assert all(r.error is None for r in result.batch)
    assert stub.stats.by_status[429] <= 5, stub.stats.by_status


@pytest.mark.parametrize(
    "headers",
    [
        {"x-ratelimit-remaining-requests": "many", "x-ratelimit-reset-requests": "soon"},
        {"x-ratelimit-remaining-requests": "-3", "x-ratelimit-reset-requests": "-1s"},
        {"x-ratelimit-remaining-tokens": "1e400", "x-ratelimit-reset-tokens": "1e400s"},
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "99999h"},
        {"x-ratelimit-limit-requests": "NaN", "x-ratelimit-remaining-requests": "nan"},
    ],
)
async def test_malformed_quota_headers_are_ignored(headers: dict[str, str]) -> None:
    reply = StubReply(headers=headers)
    with StubServer(handler=lambda body, attempt: reply) as stub:
        async with RemoteBatchInference(stub.url, timeout_s=5, **FAST) as client:
            result = await client.batch_chat_completion("smollm2", convos(20))
    assert all(r.error is None for r in result.batch)


# ---------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("230ms", 0.23),
        ("1m30.5s", 90.5),
        ("2h", 7200.0),
        ("17.25", 17.25),
        ("500us", 0.0005),
        ("", None),
        ("1x", None),
        ("s", None),
        ("-1s", None),
        ("1s 2s", None),
        ("9999h", None),
    ],
)
def test_parse_duration(text: str, seconds: float | None) -> None:
    got = parse_duration(text)
    assert got == seconds if seconds is None else got == pytest.approx(seconds)


@given(st.text(max_size=40))
def test_parse_duration_never_raises(text: str) -> None:
    got = parse_duration(text)
    assert got is None or (math.isfinite(got) and got >= 0)


def test_the_quota_estimate_subtracts_what_was_sent_since_the_report() -> None:
    quota = HeaderQuota()
    marks = [quota.on_send(0.0) for _ in range(5)]  # five requests out
    quota.observe(
        {"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "200ms"},
        marks[0],
        now=10.0,
    )
    # the server had 3 left after the first; four more are on their way: none left
    assert quota.hold_until(10.0, in_flight=4) == pytest.approx(10.2)
    assert quota.hold_until(10.3, in_flight=4) is None  # the window turned over
    stale = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"}
    assert quota.observe(stale, marks[1], now=10.3)  # an older report: at zero, not taken
    assert quota.hold_until(10.3, in_flight=4) is None
