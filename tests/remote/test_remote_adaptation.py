"""Adaptation that holds for any server, against real loopback stubs: refusals at once or only
after working as long as a success takes, 429 or 503, with or without ``Retry-After`` (seconds
or an HTTP date), and a capacity that changes mid-run; and quotas announced in every header
family (OpenAI, Azure, gateways). Small capacities and short runs test the mechanism and the
direction; ``bench/remote_adaptation.py`` and ``bench/remote_quota.py`` measure full-length
figures."""

from __future__ import annotations

import statistics
import time

import anyio
import pytest

from batchclient import RemoteBatchInference
from batchclient._routing.quota import HeaderQuota, announces_quota, parse_reset
from batchclient._routing.retry import retry_after_of
from batchclient.remote import AdaptiveConcurrency, RetryPolicy
from batchclient.testing import StubServer

FAST = RetryPolicy(backoff_initial_s=0.02, backoff_max_s=0.1)
QUICK = AdaptiveConcurrency(initial=4, cooldown_s=0.2)


def convos(n: int, prefix: str = "n") -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"{prefix}{i}"}] for i in range(n)]


async def run_sampling_limits(
    stub: StubServer, n: int, adaptive: AdaptiveConcurrency | bool = True
) -> tuple[list[tuple[float, int]], float]:
    """Send ``n`` requests; the concurrency limit every 20 ms (seconds since the start, limit)
    and the elapsed time."""
    limits: list[tuple[float, int]] = []
    async with RemoteBatchInference(stub.url, retry=FAST, max_retries=20, adaptive=adaptive) as c:
        started = time.monotonic()

        async def watch() -> None:
            while True:
                limits.append((time.monotonic() - started, c.provider.concurrency_limit() or 0))
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            result = await c.batch_chat_completion("smollm2", convos(n))
            tg.cancel_scope.cancel()
        elapsed = time.monotonic() - started
    assert all(r.error is None for r in result.batch), result.errors[:3]
    return limits, elapsed


SERVERS = [
    (True, 429, "1"),  # an overloaded backend behind a queue
    (True, 503, "date:1"),
    pytest.param(True, 429, None, marks=pytest.mark.heavy),
    pytest.param(False, 503, None, marks=pytest.mark.heavy),  # a gateway counting connections
    pytest.param(False, 429, "date:1", marks=pytest.mark.heavy),
]


@pytest.mark.parametrize(("after_work", "status", "retry_after"), SERVERS)
async def test_the_limit_settles_at_the_capacity_however_the_server_refuses(
    after_work: bool, status: int, retry_after: str | None
) -> None:
    """Capacity 6 at 30 ms. Refusing only after working used to look like a server holding
    almost nothing (what was in flight when the refusal came back), and the limit collapsed to
    a few requests: a third of the capacity. Now the limit counts what the server was serving
    when the refused request arrived, and sits at the capacity."""
    with StubServer(
        latency_s=0.03,
        capacity=6,
        capacity_status=status,
        capacity_retry_after=retry_after,
        reject_after_work=after_work,
    ) as stub:
        limits, _ = await run_sampling_limits(stub, 150, adaptive=QUICK)
    refused = stub.stats.by_status[status]
    assert refused / stub.stats.requests < 0.15, stub.stats.by_status
    late = [limit for t, limit in limits if t > 0.3]
    assert late, "the run was shorter than expected"
    assert 5 <= statistics.median(late) <= 7, late
    assert min(late) >= 3, late  # no collapse toward the minimum


@pytest.mark.parametrize("after_work", [True, False])
async def test_a_request_a_full_server_refused_goes_again_when_a_slot_frees(
    after_work: bool,
) -> None:
    """Capacity 4 at 0.3 s, refusing with ``Retry-After: 30``; a cold client starts at 8 in
    flight. The 4 refused requests went again only after their 30 s, so the call took over
    30 s for 1.5 s of work; at a gateway that refuses at once, the first refusals (the only
    answers yet) also paused the whole replica. Now a refusal the capacity explains sends its
    request again as soon as a slot frees under the new limit, and the call ends in seconds.
    A request refused a second time waits as the server says."""
    with StubServer(
        latency_s=0.3,  # the first 8 all arrive while 4 are served, on a busy machine too
        capacity=4,
        capacity_retry_after="30",
        reject_after_work=after_work,
    ) as stub:
        adaptive = AdaptiveConcurrency(initial=8, cooldown_s=60.0)  # no probing in this run
        async with RemoteBatchInference(stub.url, retry=FAST, adaptive=adaptive) as c:
            started = time.monotonic()
            result = await c.batch_chat_completion("smollm2", convos(20))
            elapsed = time.monotonic() - started
            [stats] = c.replica_stats()
    assert all(r.error is None for r in result.batch), result.errors[:3]
    assert stub.stats.by_status[429] == 4 and stats.concurrency_limit == 4
    assert elapsed < 10.0, elapsed


@pytest.mark.slow
@pytest.mark.heavy
async def test_the_limit_follows_a_capacity_that_grows_and_shrinks() -> None:
    """Capacity 6, then 12 from 1.2 s, then 3 from 2.6 s, refused after working with
    ``Retry-After: 1``: the limit finds each (and a capacity that falls is not taken for a rate
    limit: the server still serves, so the endpoint is not paused)."""
    with StubServer(
        latency_s=0.05,
        capacity=6,
        capacity_schedule=[(1.2, 12), (2.6, 3)],
        capacity_retry_after="1",
        reject_after_work=True,
    ) as stub:
        limits, elapsed = await run_sampling_limits(stub, 480, adaptive=QUICK)
    assert elapsed > 3.4, "the run ended before the last phase"

    def median_between(start: float, end: float) -> float:
        return statistics.median(limit for t, limit in limits if start < t < end)

    assert 5 <= median_between(0.7, 1.2) <= 7
    assert median_between(2.2, 2.6) >= 10  # grew toward 12
    assert median_between(3.0, elapsed) <= 4  # followed the fall to 3
    refused = stub.stats.by_status[429]
    assert refused / stub.stats.requests < 0.15, stub.stats.by_status


@pytest.mark.parametrize(
    "style",
    ["seconds", "epoch", "azure", "generic", pytest.param("openai", marks=pytest.mark.heavy)],
)
async def test_a_quota_in_any_header_family_is_used_without_429s(style: str) -> None:
    """20 requests per window (0.5 s; 1 s on the wall clock for epoch resets) announced as each
    family writes it: no more than the window allows, and at most one 429 per window where
    the server announces no reset (Azure: a refusal's ``retry-after-ms`` tells it) or only
    its whole second (epoch)."""
    period = 1.0 if style == "epoch" else 0.5
    with StubServer(latency_s=0.02) as free:  # the same work without a quota, just before
        async with RemoteBatchInference(free.url, retry=FAST, max_retries=20) as client:
            started = time.monotonic()
            await client.batch_chat_completion("smollm2", convos(50))
            free_s = time.monotonic() - started
    with StubServer(
        latency_s=0.02, quota=(20, period), quota_style=style, quota_retry_after=True
    ) as stub:
        async with RemoteBatchInference(stub.url, retry=FAST, max_retries=20) as client:
            started = time.monotonic()
            result = await client.batch_chat_completion("smollm2", convos(50))
            elapsed = time.monotonic() - started
    assert all(r.error is None for r in result.batch)
    windows = elapsed / period + 1
    # Azure announces no reset: at most one refusal per window. An epoch reset is exact, with
    # no margin: requests sent just before it that a loaded machine writes out just after it
    # count in the new window, and as many of the client's next burst are refused; at most a
    # window's quota in all (a client that ignored the quota would see 30 refused at once)
    allowed = {"azure": 1 + windows, "epoch": 20.0}.get(style, 2.0)
    refused = stub.stats.by_status[429]
    assert refused <= allowed, (stub.stats.by_status, elapsed)
    # the quota is used, not left idle: at most a window lost to each refusal (a loaded machine
    # that stalls this process sends a burst the server refuses, and a window passes), plus
    # what the same work took without a quota on this machine just before
    bound = period * (50 / 20 + 2 + refused) + free_s
    assert elapsed < bound, (stub.stats.by_status, elapsed, free_s)


# ---------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("230ms", 0.23),
        ("1m30.5s", 90.5),
        ("0.25", 0.25),
        ("1000000030", 30.0),  # epoch seconds
        ("1000000030500", 30.5),  # epoch milliseconds
        ("999999990", None),  # long past
        ("1000900000", None),  # more than a week away
        ("soon", None),
    ],
)
def test_parse_reset(text: str, seconds: float | None) -> None:
    got = parse_reset(text, wall=1_000_000_000.0)
    assert got == seconds if seconds is None else got == pytest.approx(seconds)


def test_retry_after_ms_is_preferred_and_capped() -> None:
    assert retry_after_of({"retry-after-ms": "250", "retry-after": "1"}, cap_s=60) == 0.25
    assert retry_after_of({"retry-after-ms": "junk", "retry-after": "2"}, cap_s=60) == 2.0
    assert retry_after_of({"retry-after-ms": "90000"}, cap_s=60) == 60.0
    assert retry_after_of({}, cap_s=60) is None


def test_every_header_family_is_recognised() -> None:
    for name in (
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-remaining",
        "ratelimit-remaining",
    ):
        assert announces_quota({name: "3"})
    assert not announces_quota({"x-ratelimit-limit-requests": "3"})


def test_a_token_quota_learns_what_the_server_counts_per_estimated_token() -> None:
    """The client estimates 28 tokens a request; the server counts 21: after two reports the
    estimate is scaled by 0.75, so the quota is used, not left a quarter idle."""
    quota = HeaderQuota()
    reports = []
    for i in range(3):
        marks = quota.on_send(28.0)
        remaining = str(2100 - 21 * (i + 1))
        reports.append(({"x-ratelimit-remaining-tokens": remaining}, marks))
    for headers, marks in reports:
        quota.observe(headers, marks, now=1.0)
    assert quota.tokens.scale == pytest.approx(0.75)


def test_a_refusal_without_an_announced_reset_holds_until_its_retry_after() -> None:
    quota = HeaderQuota()
    marks = quota.on_send(1.0)
    assert quota.observe({"x-ratelimit-remaining-requests": "0"}, marks, now=5.0)
    assert quota.hold_until(5.0, in_flight=0) is None  # nothing known: one goes to find out
    quota.refused_until(5.0, 0.4)
    assert quota.hold_until(5.1, in_flight=0) == pytest.approx(5.4)
    assert quota.hold_until(5.5, in_flight=0) is None
