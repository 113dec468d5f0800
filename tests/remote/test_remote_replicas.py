"""Several replicas behind one remote client: per-replica limits, least-loaded spread, and what
happens when a replica dies or keeps failing (ejection, retries elsewhere, clear errors when
all are down), against real loopback stub servers."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from batchclient import RemoteBatchInference
from batchclient.remote import Ejection, RateLimits, RemoteReplica
from batchclient.testing import Fault, StubReply, StubServer
from remote_util import FAST, convo, lane


async def test_a_dead_endpoint_is_ejected_and_later_batches_avoid_it() -> None:
    """A replica killed mid-run is ejected and later batches never try it (ray-project/ray
    #59522: a dead engine failed the whole job)."""
    stubs = [StubServer(latency_s=0.02).start() for _ in range(3)]
    try:
        async with RemoteBatchInference(
            [s.url for s in stubs],
            max_concurrency=8,
            ejection=Ejection(duration_s=30.0),
            timeout_s=10.0,
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


async def test_the_whole_batch_succeeds_when_one_endpoint_dies_mid_run() -> None:
    stubs = [StubServer(latency_s=0.02).start() for _ in range(3)]
    box: dict[str, Any] = {}
    try:
        # timeout: an attempt caught on a connection the kill left half-open (no reset, no
        # answer, as with a crashed host) is retried elsewhere after 3 s instead of 600 s
        async with RemoteBatchInference([s.url for s in stubs], timeout_s=3.0, **FAST) as client:

            async def run() -> None:
                box["result"] = await client.batch_chat_completion(
                    "smollm2", [convo(f"n{i}") for i in range(600)]
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                with anyio.fail_after(30):  # mid-run: once it has served some
                    while stubs[1].stats.requests < 20:
                        await anyio.sleep(0.01)
                await anyio.to_thread.run_sync(stubs[1].kill)
    finally:
        for s in stubs:
            s.stop()
    # the other two answered what it no longer could
    assert stubs[0].stats.by_status[200] + stubs[2].stats.by_status[200] > 300
    assert all(r.error is None for r in box["result"].batch)


async def test_all_endpoints_down_gives_clear_errors_fast() -> None:
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


@pytest.mark.slow  # seconds of waiting: the full suite runs it
async def test_per_endpoint_limits_and_least_loaded_spread() -> None:
    """A small replica (at most 2 in flight) beside a large one (6): each gets at most its own
    limit and a share of the work in proportion; a per-endpoint rpm holds for its endpoint."""
    with StubServer(latency_s=0.05) as small, StubServer(latency_s=0.05) as large:
        endpoints: list[str | RemoteReplica] = [
            RemoteReplica(small.url, max_concurrency=2),
            large.url,
        ]
        async with RemoteBatchInference(endpoints, max_concurrency=6, adaptive=False) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(160)]
            )
        assert all(r.error is None for r in result.batch)
        assert (small.stats.max_in_flight, large.stats.max_in_flight) == (2, 6)
        assert 25 <= small.stats.requests <= 55  # about 2/8 of 160
        with StubServer() as limited:
            endpoints = [RemoteReplica(limited.url, rpm=5), large.url]  # same type as above
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
            # no probing: the stub answers GET /models, so a call that a busy machine stretches
            # past a probe would take the replica back for one more failed pair
            ejection=Ejection(duration_s=60, probe_s=0),
            **FAST,
        ) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(40)]
            )
            stats = lane(client, broken.url)
    assert all(r.error is None for r in result.batch)
    assert stats.ejected and broken.stats.requests <= 4
    assert good.stats.by_status[200] == 40


async def test_ejection_and_return_follow_the_dispatchers_clock() -> None:
    """The dispatcher on a fake clock (no waiting): two connection failures eject a replica
    for ``eject_s``; attempts go to the other meanwhile; with both out, the error says when the
    first returns; once the clock passes that, it is back on probation (one more failure ejects
    it again)."""
    from batchclient._routing.adaptive import AdaptiveSettings
    from batchclient._routing.dispatch import Dispatcher, Replica, ReplicasUnavailable
    from batchclient._routing.rates import RateBuckets

    now = [1000.0]
    a, b = (
        Replica(url, None, RateBuckets(None, None), AdaptiveSettings(initial=4), adaptive=False)
        for url in ("http://a", "http://b")
    )
    dispatcher = Dispatcher([a, b], eject_after=2, eject_s=30.0, clock=lambda: now[0])

    a.answered = b.answered = True  # both answered before: refusals mean a restart

    def fail(replica: Replica) -> None:
        lane = replica.lane("m")
        dispatcher.on_failure(lane, "connection refused", connection=True, refused=True)

    fail(a)
    assert a.ejected_until == 0.0  # one failure is not enough
    fail(a)
    assert a.ejected_until == 1030.0 and a.lanes["m"].control.clock() == 1000.0
    picked = {dispatcher.try_acquire("m", key=k).replica.base_url for k in range(8)}  # type: ignore[union-attr]
    assert picked == {"http://b"}
    now[0] = 1010.0
    fail(b)
    fail(b)  # b out until 1040, a until 1030
    with pytest.raises(ReplicasUnavailable) as out:
        await dispatcher.acquire("m")
    assert out.value.wait_s == 20.0
    assert [s.ejected for s in dispatcher.stats()] == [True, True]
    now[0] = 1030.0
    assert dispatcher.try_acquire("m").replica is a  # type: ignore[union-attr]
    fail(a)  # on probation: one failure ejects it again
    assert a.ejected_until == 1060.0


async def test_only_the_replicas_own_faults_eject_it() -> None:
    """On a fake clock: dropped connections, 5xx answers and timeouts never eject the last
    replica in service (they may be one tenant's requests); refused connections do (nothing
    listens: a restart). A request that already failed on a replica does not count against
    the next one, so one body that breaks every server does not eject them in turn."""
    from batchclient._routing.adaptive import AdaptiveSettings
    from batchclient._routing.dispatch import Dispatcher, Replica
    from batchclient._routing.rates import RateBuckets

    now = [1000.0]
    a, b = (
        Replica(url, None, RateBuckets(None, None), AdaptiveSettings(initial=4), adaptive=False)
        for url in ("http://a", "http://b")
    )
    a.answered = b.answered = True
    dispatcher = Dispatcher([a, b], eject_after=2, eject_s=30.0, clock=lambda: now[0])
    for _ in range(3):  # the same request failing again on b, after a
        dispatcher.on_failure(b.lane("m"), "reset", connection=True, counts=False)
    assert b.ejected_until == 0.0 and b.failures == 0
    for _ in range(2):  # a's own dropped connections, with b in: out
        dispatcher.on_failure(a.lane("m"), "reset", connection=True)
    assert a.ejected_until == 1030.0
    for connection, message in [(True, "reset"), (False, "HTTP 502"), (False, "timeout")] * 2:
        dispatcher.on_failure(b.lane("m"), message, connection=connection)
    assert b.ejected_until == 0.0 and b.failures == 6  # the last one in: paced, not ejected
    dispatcher.on_failure(b.lane("m"), "refused", connection=True, refused=True)
    assert b.ejected_until == 1030.0


async def test_poison_requests_do_not_take_the_only_replica_out_for_the_others() -> None:
    """Four requests whose body makes the only upstream drop the connection fail (two attempts
    each, ``connection_error``); the ordinary requests sent right after are answered, not held
    for the 60 s of an ejection."""
    poison = Fault(StubReply(action="reset"), match="poison")
    with StubServer(faults=[poison]) as stub:
        async with RemoteBatchInference(
            stub.url, max_retries=1, ejection=Ejection(duration_s=60), **FAST
        ) as client:
            bad = await client.batch_chat_completion(
                "smollm2", [convo(f"poison {i}") for i in range(4)]
            )
            with anyio.fail_after(10):
                good = await client.batch_chat_completion(
                    "smollm2", [convo(f"fine {i}") for i in range(3)]
                )
            stats = lane(client, stub.url)
    assert [r.error.code if r.error else None for r in bad.batch] == ["connection_error"] * 4
    assert all(r.error is None for r in good.batch), [r.error for r in good.batch]
    assert not stats.ejected and stub.stats.by_status[200] == 3


async def test_an_ejected_replica_is_probed_and_back_as_soon_as_it_answers() -> None:
    """A replica answering 500 for its first second is ejected for 60 s; probed every 0.1 s
    (``GET /models``) it is back on probation at once, ejected again by its next 500, and
    serves again once its second is over, long before the 60 s."""
    flaky = Fault(StubReply(status=500), until_s=1.0)
    with StubServer(faults=[flaky], latency_s=0.01) as broken, StubServer(latency_s=0.01) as good:
        async with RemoteBatchInference(
            [broken.url, good.url],
            max_concurrency=2,
            adaptive=False,
            ejection=Ejection(duration_s=60, probe_s=0.1),
            **FAST,
        ) as client:
            started = time.monotonic()
            served = 0
            with anyio.fail_after(30):
                while broken.stats.by_status[200] == 0:
                    got = await client.batch_chat_completion(
                        "smollm2", [convo(f"n{served + i}") for i in range(4)]
                    )
                    assert all(r.error is None for r in got.batch)
                    served += 4
            back_after = time.monotonic() - started
            stats = lane(client, broken.url)
    assert broken.stats.by_status[500] >= 2  # ejected, probed back, ejected again
    assert back_after < 30 and not stats.ejected
