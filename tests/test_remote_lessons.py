"""Peer lessons 1-10 and 20 (``shared/reference/peer-lessons.md``) and case C13, each against
the real loopback stub server. Time constants are scaled down through constructor knobs so each
test takes seconds."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from typing import Any

import anyio
import pytest

from batchclient import (
    BatchFailedError,
    BatchProgress,
    RemoteBatchInference,
    RemoteEndpoint,
    SamplingParams,
)
from batchclient.remote import AdaptiveConcurrency, Ejection, RateLimits, RetryPolicy
from batchclient.testing import Fault, StubReply, StubServer
from batchclient.testing import _stub as stub_module  # the stub's text and Retry-After helpers

FAST = {"retry": RetryPolicy(backoff_initial_s=0.02, backoff_max_s=0.1)}


def convo(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def lane(client: RemoteBatchInference, url: str | None = None, model: str = "smollm2") -> Any:
    for stats in client.endpoint_stats():
        if stats.model == model and (url is None or stats.url == url.rstrip("/")):
            return stats
    raise AssertionError(f"no lane for {url} {model}")


# ---------------------------------------------------------------------------- lesson 1


@pytest.mark.parametrize(
    "body",
    [
        {"choices": [{"message": {"content": "all good"}}]},  # looks like a success
        {"error": {"message": "Please slow down"}},  # no "rate limit" words for a text check
        b"",  # no body at all
    ],
)
async def test_lesson01_a_real_429_backs_off_whatever_its_body_says(body: Any) -> None:
    reply = StubReply(status=429, raw=body) if isinstance(body, bytes) else StubReply(429, body)
    with StubServer(faults=[Fault(reply, last_attempt=1)]) as stub:
        async with RemoteBatchInference(
            stub.url, adaptive=AdaptiveConcurrency(initial=8), **FAST
        ) as client:
            result = await client.batch_chat_completion("smollm2", [convo("a"), convo("b")])
            stats = lane(client)
    assert [r.text for r in result.batch] == ["echo: a", "echo: b"]
    assert stub.stats.by_status[429] == 2
    assert stats.throttled == 2 and stats.cuts == 1  # a throttle signal, and one cut per burst


# ---------------------------------------------------------------------------- lesson 2


async def test_lesson02_retry_after_pauses_the_endpoint_when_throttling_is_endpoint_wide() -> None:
    """Every answer is ``429 Retry-After: 1`` for a moment: no request at all reaches the
    endpoint for that second (not only the throttled ones). An isolated 429 holds only its
    own request (tests/test_remote_throttling.py)."""
    arrivals: list[float] = []
    first: list[float] = []

    def handler(body: dict[str, Any], attempt: int) -> StubReply | None:
        now = time.monotonic()
        arrivals.append(now)
        if not first:
            first.append(now)
        if now - first[0] < 0.1:
            return StubReply(status=429, headers={"Retry-After": "1"})
        return None

    with StubServer(latency_s=0.05, handler=handler) as stub:
        async with RemoteBatchInference(
            stub.url, max_concurrency=8, adaptive=False, **FAST
        ) as client:
            batch = [convo(f"n{i}") for i in range(80)]
            result = await client.batch_chat_completion("smollm2", batch)
    assert all(r.error is None for r in result.batch)
    t429 = max(t for t in arrivals if t - first[0] < 0.1)
    # nothing new is sent until the second is over
    during = [t for t in arrivals if t429 + 0.02 < t < first[0] + 0.98]
    assert during == [], f"{len(during)} requests sent during the pause"
    assert any(t >= first[0] + 0.98 for t in arrivals), "dispatch never resumed"
    assert stub.stats.by_status[429] == 8  # the first wave, each retried once


# ---------------------------------------------------------------------------- lesson 3


async def test_lesson03_steady_retry_after_still_reaches_the_minimum_and_recovers() -> None:
    """For 2.5 s every answer is ``429 Retry-After: 0.4``; the limit must still walk down to its
    minimum (the cool-down is ours, not the server's hint), then recover once answers succeed."""
    storm = Fault(StubReply(status=429), retry_after="0.4", until_s=2.5)
    limits: list[tuple[float, int]] = []
    with StubServer(latency_s=0.02, faults=[storm]) as stub:
        async with RemoteBatchInference(
            stub.url,
            adaptive=AdaptiveConcurrency(
                initial=16, minimum=2, decrease_factor=0.5, cooldown_s=0.3
            ),
            max_retries=20,
            **FAST,
        ) as client:
            started = stub._started  # the storm's clock

            async def watch() -> None:
                while True:
                    stats = client.endpoint_stats()
                    if stats:
                        limits.append((time.monotonic() - started, stats[0].concurrency_limit))
                    await anyio.sleep(0.05)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                result = await client.batch_chat_completion(
                    "smollm2", [convo(f"n{i}") for i in range(1500)]
                )
                tg.cancel_scope.cancel()
    assert all(r.error is None for r in result.batch)
    assert stub.stats.by_status[429] > 0
    during = [v for t, v in limits if t < 2.5]
    after = [v for t, v in limits if t > 3.0]
    assert min(during) == 2  # reached the minimum while throttled
    assert after and max(after) >= 8  # and grew back afterwards


# ---------------------------------------------------------------------------- lesson 4


@pytest.mark.parametrize(
    ("status", "message", "code"),
    [
        (400, "This model's maximum context length is 2048 tokens", "context_length_exceeded"),
        (401, "Invalid API key", "authentication_error"),
        (403, "Forbidden", "permission_denied"),
        (404, "The model `x` does not exist", "model_not_found"),
    ],
)
async def test_lesson04_non_retryable_errors_fail_on_the_first_attempt_with_one_clear_error(
    status: int, message: str, code: str
) -> None:
    reply = StubReply(status=status, body={"error": {"message": message}})
    with StubServer(faults=[Fault(reply)]) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            started = time.monotonic()
            with pytest.raises(BatchFailedError) as raised:
                await client.batch_chat_completion(
                    "smollm2", [convo(f"n{i}") for i in range(20)], raise_on_error=True
                )
            elapsed = time.monotonic() - started
    assert stub.stats.requests == 20  # one attempt each, no retries
    assert elapsed < 2.0
    errors = raised.value.errors
    assert len(errors) == 20
    assert {(e.code, e.status_code) for _, e in errors} == {(code, status)}
    assert f"20 item(s) failed; first: item 0: {code}: {message}" in str(raised.value)


# ---------------------------------------------------------------------------- lesson 5


async def test_lesson05_every_429_is_one_signal_to_the_limiter() -> None:
    """No hidden retries: the stub's count of 429s, the client's throttle count and the extra
    requests all agree."""
    with StubServer(faults=[Fault(StubReply(status=429), last_attempt=1)]) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            await client.batch_chat_completion("smollm2", [convo(f"n{i}") for i in range(10)])
            stats = lane(client)
    assert stub.stats.by_status[429] == 10
    assert stats.throttled == 10
    assert stats.sent == stub.stats.requests == 20


# ---------------------------------------------------------------------------- lesson 6


async def test_lesson06_adaptive_limits_are_per_endpoint_and_model() -> None:
    def throttle_model_a(body: dict[str, Any], attempt: int) -> StubReply | None:
        return StubReply(status=429) if body.get("model") == "a" and attempt == 1 else None

    models = ("a", "b")
    with (
        StubServer(handler=throttle_model_a, models=models) as hot,
        StubServer(models=models) as calm,
    ):
        async with RemoteBatchInference(
            [hot.url, calm.url], adaptive=AdaptiveConcurrency(initial=8), **FAST
        ) as client:
            async with anyio.create_task_group() as tg:
                for model in models:
                    batch = [convo(f"{model}{i}") for i in range(60)]
                    tg.start_soon(client.batch_chat_completion, model, batch)
            cut = {(s.url, s.model): s.cuts for s in client.endpoint_stats()}
    assert cut[(hot.url, "a")] >= 1
    assert cut[(hot.url, "b")] == 0
    assert cut[(calm.url, "a")] == 0 and cut[(calm.url, "b")] == 0


# ---------------------------------------------------------------------------- lesson 7


async def test_lesson07_an_exhausted_429_reaches_callers_and_metrics_as_429() -> None:
    seen: list[BatchProgress] = []
    with StubServer(faults=[Fault(StubReply(status=429), match="hot")]) as stub:
        async with RemoteBatchInference(stub.url, max_retries=2, **FAST) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo("hot"), convo("cold")], progress=seen.append
            )
            stats = lane(client)
    err = result.batch[0].error
    assert err is not None and (err.code, err.status_code) == ("rate_limited", 429)
    assert result.batch[1].error is None
    assert stats.throttled == 3 and stats.failed == 0  # a throttle, not a server failure
    assert (seen[-1].completed, seen[-1].failed) == (1, 1)


# ---------------------------------------------------------------------------- lesson 8


async def test_lesson08_a_max_in_flight_limit_works_alone() -> None:
    """A self-hosted server: no rpm/tpm, just at most 5 in flight, and no other waiting."""
    with StubServer(latency_s=0.1) as stub:
        async with RemoteBatchInference(stub.url, max_concurrency=5, adaptive=False) as client:
            started = time.monotonic()
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(50)]
            )
            elapsed = time.monotonic() - started
    assert all(r.error is None for r in result.batch)
    assert stub.stats.max_in_flight == 5
    assert 0.95 <= elapsed < 2.0  # 10 rounds of 0.1 s, no rate-limit waits


# ---------------------------------------------------------------------------- lesson 9


async def test_lesson09_rpm_holds_across_concurrent_calls_on_one_client() -> None:
    """rpm=10 per 1 s period, shared by two concurrent calls of 15: the bucket starts full (a
    burst of 10), then lets 10 per second through: 30 requests take about 2 s."""
    arrivals: list[float] = []

    def record(body: dict[str, Any], attempt: int) -> None:
        arrivals.append(time.monotonic())

    with StubServer(handler=record) as stub:
        async with RemoteBatchInference(
            stub.url, rpm=10, rate_limits=RateLimits(period_s=1.0)
        ) as client:
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for call in range(2):
                    batch = [convo(f"c{call}-{i}") for i in range(15)]
                    tg.start_soon(client.batch_chat_completion, "smollm2", batch)
            elapsed = time.monotonic() - started
    assert stub.stats.requests == 30
    assert 1.8 <= elapsed < 3.5
    first = sorted(t - started for t in arrivals)
    # the documented full bucket: a burst of 10 at once, plus what drips in (10/s) meanwhile
    assert 10 <= sum(1 for t in first if t < 0.3) <= 14
    for window_start in (0.5, 1.0, 1.5):  # then at most ~10 per second
        assert sum(1 for t in first if window_start <= t < window_start + 1.0) <= 11


async def test_lesson09_tpm_estimates_are_settled_with_real_usage() -> None:
    """tpm=2,000 per second with ``max_tokens=900``: each request is charged ~900 tokens up
    front, so without settling only about 2 could start per second. The stub's answers use a
    handful of tokens; refunding the difference lets the 20 requests through quickly."""
    with StubServer(latency_s=0.02) as stub:
        async with RemoteBatchInference(
            stub.url, tpm=2000, rate_limits=RateLimits(period_s=1.0)
        ) as client:
            started = time.monotonic()
            result = await client.batch_chat_completion(
                "smollm2",
                [convo(f"n{i}") for i in range(20)],
                sampling_params=SamplingParams(max_tokens=900),
            )
            elapsed = time.monotonic() - started
    assert all(r.error is None for r in result.batch)
    assert elapsed < 3.0  # without settling: ~9 s


async def test_lesson09_the_output_token_estimate_learns_from_usage() -> None:
    with StubServer() as stub:
        async with RemoteBatchInference(
            stub.url, tpm=1_000_000, rate_limits=RateLimits(initial_output_tokens=256)
        ) as client:
            assert lane_estimate(client) is None
            result = await client.batch_chat_completion(
                "smollm2",
                [convo("one two three")] * 30,  # "echo: one two three": 4 tokens
            )
            estimate = lane(client).output_tokens_estimate
    assert all(r.metric("completion_tokens") == 4 for r in result.batch)
    assert estimate == pytest.approx(4.0, abs=0.01)


def lane_estimate(client: RemoteBatchInference) -> float | None:
    stats = client.endpoint_stats()
    return stats[0].output_tokens_estimate if stats else None


# ---------------------------------------------------------------------------- lesson 10


async def test_lesson10_timeouts_count_from_dispatch_not_from_queueing() -> None:
    """Two in flight, 0.3 s each, 10 requests: the last waits ~1.2 s in the queue, longer than
    the 0.5 s timeout, and still succeeds (also behind an rpm bucket)."""
    with StubServer(latency_s=0.3) as stub:
        async with RemoteBatchInference(
            stub.url, max_concurrency=2, adaptive=False, timeout=0.5, max_retries=0
        ) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(10)]
            )
        async with RemoteBatchInference(
            stub.url, rpm=4, rate_limits=RateLimits(period_s=1.0), timeout=0.5, max_retries=0
        ) as client:
            limited = await client.batch_chat_completion(
                "smollm2", [convo(f"r{i}") for i in range(8)]
            )
    assert all(r.error is None for r in result.batch + limited.batch)
    latencies = [r.metric("latency") for r in result.batch]
    assert all(lat is not None and lat < 0.5 for lat in latencies)  # from dispatch


# ---------------------------------------------------------------------------- lesson 20


async def test_lesson20_a_dead_endpoint_is_ejected_and_later_batches_avoid_it() -> None:
    stubs = [StubServer(latency_s=0.02).start() for _ in range(3)]
    try:
        async with RemoteBatchInference(
            [s.url for s in stubs],
            max_concurrency=8,
            ejection=Ejection(duration_s=30.0),
            timeout=10.0,
            **FAST,
        ) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    client.batch_chat_completion, "smollm2", [convo(f"n{i}") for i in range(600)]
                )
                await anyio.sleep(0.4)
                await anyio.to_thread.run_sync(stubs[0].kill)
            sent_to_dead = lane(client, stubs[0].url).sent
            results = await client.batch_chat_completion(
                "smollm2", [convo(f"m{i}") for i in range(100)]
            )
            dead = lane(client, stubs[0].url)
    finally:
        for s in stubs:
            s.stop()
    assert all(r.error is None for r in results.batch)
    assert dead.ejected
    assert dead.sent == sent_to_dead  # not one attempt at the dead endpoint afterwards
    assert stubs[1].stats.by_status[200] + stubs[2].stats.by_status[200] >= 400


async def test_lesson20_the_whole_batch_succeeds_when_one_endpoint_dies_mid_run() -> None:
    stubs = [StubServer(latency_s=0.02).start() for _ in range(3)]
    box: dict[str, Any] = {}
    try:
        # timeout: an attempt caught on a connection the kill left half-open (no reset, no
        # answer, as with a crashed host) is retried elsewhere instead of waiting 600 s
        async with RemoteBatchInference([s.url for s in stubs], timeout=10.0, **FAST) as client:

            async def run() -> None:
                box["result"] = await client.batch_chat_completion(
                    "smollm2", [convo(f"n{i}") for i in range(600)]
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await anyio.sleep(0.4)
                await anyio.to_thread.run_sync(stubs[1].kill)
    finally:
        for s in stubs:
            s.stop()
    assert stubs[1].stats.requests > 0  # it did serve before it died
    assert all(r.error is None for r in box["result"].batch)


async def test_lesson20_all_endpoints_down_gives_clear_errors_fast() -> None:
    dead = [StubServer().start() for _ in range(2)]
    urls = [s.url for s in dead]
    for s in dead:
        s.kill()
    async with RemoteBatchInference(
        urls, max_retries=3, ejection=Ejection(after=2, duration_s=0.2), check_model=False, **FAST
    ) as client:
        with anyio.fail_after(10):
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(50)]
            )
    for item in result.batch:
        assert item.error is not None
        assert item.error.code in ("connection_error", "endpoint_unavailable")
        assert "127.0.0.1" in item.error.message


async def test_per_endpoint_limits_and_least_loaded_spread() -> None:
    """A small replica (at most 2 in flight) beside a large one (6): each gets at most its own
    limit and a share of the work in proportion; a per-endpoint rpm holds for its endpoint."""
    with StubServer(latency_s=0.05) as small, StubServer(latency_s=0.05) as large:
        endpoints = [RemoteEndpoint(small.url, max_concurrency=2), large.url]
        async with RemoteBatchInference(endpoints, max_concurrency=6, adaptive=False) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(160)]
            )
        assert all(r.error is None for r in result.batch)
        assert (small.stats.max_in_flight, large.stats.max_in_flight) == (2, 6)
        assert 25 <= small.stats.requests <= 55  # about 2/8 of 160
        with StubServer() as limited:
            endpoints = [RemoteEndpoint(limited.url, rpm=5), large.url]
            async with RemoteBatchInference(
                endpoints, rate_limits=RateLimits(period_s=1.0)
            ) as client:
                started = time.monotonic()
                await client.batch_chat_completion("smollm2", [convo(f"r{i}") for i in range(60)])
                elapsed = time.monotonic() - started
        assert limited.stats.requests <= 5 + 5 * elapsed + 1  # its own bucket, never more


async def test_a_retry_after_a_connection_error_prefers_another_endpoint() -> None:
    with (
        StubServer(faults=[Fault(StubReply(action="reset"))]) as flaky,
        StubServer() as good,
    ):
        async with RemoteBatchInference([flaky.url, good.url], **FAST) as client:
            result = await client.batch_chat_completion("smollm2", [convo("x")])
    assert result.batch[0].text == "echo: x"
    # the first attempt went to the first endpoint (a reset on the connection the model check
    # had used is tried once more on a fresh one, which is not an attempt)...
    assert 1 <= flaky.stats.requests <= 2
    assert good.stats.requests == 1  # ...and its retry elsewhere


async def test_an_endpoint_answering_5xx_repeatedly_is_ejected() -> None:
    with StubServer(faults=[Fault(StubReply(status=500))]) as broken, StubServer() as good:
        async with RemoteBatchInference(
            [broken.url, good.url],
            max_concurrency=2,
            adaptive=False,
            ejection=Ejection(duration_s=60),
            **FAST,
        ) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(40)]
            )
            stats = lane(client, broken.url)
    assert all(r.error is None for r in result.batch)
    assert stats.ejected and broken.stats.requests <= 4
    assert good.stats.by_status[200] == 40


# ---------------------------------------------------------------------------- case C13


async def test_c13_429_with_retry_after_seconds_date_and_none() -> None:
    """Case C13: 20 conversations, 8 in flight; the first 3 calls of each get 429 with
    ``Retry-After: 2``, an HTTP date 2 s ahead, or nothing. All succeed; each retry waits at
    least the server's value; attempts are bounded (4 each); concurrency drops while
    throttled. Then an item that is always throttled runs out and reports 429."""
    calls: dict[str, list[float]] = defaultdict(list)
    forms = ["2", "date:2", None]

    def handler(body: dict[str, Any], attempt: int) -> StubReply | None:
        text = stub_module._text_of(body)
        calls[text].append(time.monotonic())
        i = int(text.split("-")[1])
        if text.startswith("hot") or (text.startswith("item") and attempt <= 3):
            reply = StubReply(status=429, body={"error": {"message": "slow down"}})
            form = forms[i % 3]
            if form is not None:
                reply.headers["Retry-After"] = stub_module._retry_after_value(form)
            return reply
        return None

    limits: list[int] = []
    with StubServer(handler=handler) as stub:
        # This server throttles every item's first 3 calls whatever the load: a steady stream
        # of throttles for the whole run, which walks the limit toward its minimum (lesson 3)
        # and serialises the run behind the endpoint's pauses. A 10 s cool-down and a floor of
        # 4 keep the case at ~25 s; it passes with the defaults too, only slower.
        async with RemoteBatchInference(
            stub.url,
            max_concurrency=8,
            adaptive=AdaptiveConcurrency(minimum=4, cooldown_s=10.0),
            **FAST,
        ) as client:

            async def watch() -> None:
                while True:
                    limits.append(client.provider.concurrency_limit() or 0)
                    await anyio.sleep(0.05)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                result = await client.batch_chat_completion(
                    "smollm2", [convo(f"item-{i}") for i in range(20)]
                )
                tg.cancel_scope.cancel()
        async with RemoteBatchInference(stub.url, max_retries=2, **FAST) as client:
            exhausted = await client.batch_chat_completion(
                "smollm2", [convo("hot-2"), convo("cool-0")]
            )
    assert [r.text for r in result.batch] == [f"echo: item-{i}" for i in range(20)]
    for i in range(20):
        times = calls[f"item-{i}"]
        assert len(times) == 4, f"item {i}: {len(times)} calls"
        gaps = [b - a for a, b in itertools.pairwise(times)]
        if forms[i % 3] == "2":
            assert min(gaps) >= 2.0, (i, gaps)
        elif forms[i % 3] == "date:2":
            assert min(gaps) >= 1.0, (i, gaps)  # an HTTP date has one-second resolution
    assert limits[0] == 8
    assert min(limits) < 8  # concurrency dropped while throttled
    err = exhausted.batch[0].error
    assert err is not None and (err.code, err.status_code) == ("rate_limited", 429)
    assert len(calls["hot-2"]) == 3  # 1 + max_retries, then stop
    assert exhausted.batch[1].error is None
