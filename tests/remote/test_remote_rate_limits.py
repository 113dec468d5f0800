"""rpm/tpm limits and a plain in-flight limit on the remote provider, and timeouts that count
from dispatch (never the time spent queued behind a limit), against the real loopback stub
server with periods scaled down to a second."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from aiolimiter import AsyncLimiter

from batchclient import RemoteBatchInference, SamplingParams
from batchclient.remote import RateLimits
from batchclient.testing import StubServer
from remote_util import convo, lane


async def test_a_max_in_flight_limit_works_alone() -> None:
    """A self-hosted server: no rpm/tpm, just at most 5 in flight, and no other waiting
    (bespokelabsai/curator #377)."""
    with StubServer(latency_s=0.1) as stub:
        async with RemoteBatchInference(stub.url, max_concurrency=5, adaptive=False) as client:
            started = time.monotonic()
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(50)]
            )
            elapsed = time.monotonic() - started
    assert all(r.error is None for r in result.batch)
    assert stub.stats.max_in_flight == 5
    # 10 rounds of 0.1 s; an unwanted rate-limit wait would cost seconds more
    assert 0.95 <= elapsed < 4.0


@pytest.mark.slow  # seconds of waiting: the full suite runs it
async def test_rpm_holds_across_concurrent_calls_on_one_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rpm=10 per 1 s period, shared by two concurrent calls of 15: the bucket starts full (a
    burst of 10), then lets 10 per second through: 30 requests take about 2 s (litellm #5783:
    limits per call instead of per client)."""
    arrivals: list[float] = []
    # whether each acquisition found room in the bucket as it asked: counted, not timed, since
    # a busy machine can spread ten requests sent at once over more than a second
    at_once: list[bool] = []
    real_acquire = AsyncLimiter.acquire

    async def spy(self: AsyncLimiter, amount: float = 1) -> None:
        at_once.append(self.has_capacity(amount))
        await real_acquire(self, amount)

    monkeypatch.setattr(AsyncLimiter, "acquire", spy)

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
    assert stub.stats.requests == 30
    # 20 requests past the burst at 10 per second, from the calls' start: a busy machine can
    # delay the burst's arrival, which shortens the span from it to the last (1.0 s, once)
    assert 1.8 <= max(arrivals) - started < 5.0
    # The limiter's bound, from the calls' start (a busy machine only delays arrivals, which
    # keeps them inside it): by t seconds, at most the burst of 10 plus 10 per second.
    ordered = sorted(arrivals)
    for count, t in enumerate(ordered, start=1):
        assert count <= 11 + 10 * (t - started), f"{count} requests {t - started:.2f} s in"
    # the documented full bucket: the first 10 acquisitions take no wait, where an empty
    # bucket would make each wait a tenth of a second; the shared bucket makes the rest wait
    assert len(at_once) == 30
    assert at_once[:10] == [True] * 10
    assert not all(at_once[10:]), "no request waited: the limit was not applied"


async def test_tpm_estimates_are_settled_with_real_usage() -> None:
    """tpm=2,000 per second with ``max_tokens=900``: each request is charged ~900 tokens up
    front, so without settling only about 2 could start per second. The stub's answers use a
    handful of tokens; refunding the difference lets the 20 requests through quickly
    (bespokelabsai/curator #401)."""
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
    assert elapsed < 6.0  # without settling: ~9 s; with it, a fraction of a second


async def test_the_output_token_estimate_learns_from_usage() -> None:
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
    stats = client.replica_stats()
    return stats[0].output_tokens_estimate if stats else None


@pytest.mark.slow
async def test_timeouts_count_from_dispatch_not_from_queueing() -> None:
    """One in flight, 0.1 s each, 30 requests: the last waits ~2.9 s in the queue, longer than
    the 1 s timeout, and still succeeds; likewise behind an rpm bucket of 2 per second, where
    the last of 8 waits ~3 s (infiniflow/ragflow PR #17192). The answers take a tenth of the
    timeout, which leaves a busy machine room."""
    with StubServer(latency_s=0.1) as stub:
        async with RemoteBatchInference(
            stub.url, max_concurrency=1, adaptive=False, timeout_s=1.0, max_retries=0
        ) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(30)]
            )
        async with RemoteBatchInference(
            stub.url, rpm=2, rate_limits=RateLimits(period_s=1.0), timeout_s=1.0, max_retries=0
        ) as client:
            started = time.monotonic()
            limited = await client.batch_chat_completion(
                "smollm2", [convo(f"r{i}") for i in range(8)]
            )
            limited_s = time.monotonic() - started
    assert all(r.error is None for r in result.batch + limited.batch)
    assert limited_s > 2.5  # the bucket did hold the last requests back longer than 1 s
    latencies = [r.metric("latency") for r in result.batch]
    assert all(lat is not None and lat < 1.0 for lat in latencies)  # from dispatch
