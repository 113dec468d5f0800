"""A refused connection: nothing listening at the base URL fails every item at once with the URL
in its message (no retry budget spent on a missing server), while a server that answered before
and restarts, or a replica that refuses beside others that serve, is still retried."""

from __future__ import annotations

import time

import anyio
import pytest

from batchclient import RemoteBatchInference
from batchclient.remote import Ejection, RetryPolicy
from batchclient.testing import StubServer, free_port
from remote_util import FAST, convo, lane


async def test_nothing_listening_fails_every_item_within_seconds_naming_the_url() -> None:
    """Defaults (4 retries, 3 failures to eject, 10 s out): 2,000 items against a port nobody
    listens on all fail with ``endpoint_unavailable`` within seconds (the retries and ejection
    waits took 26 s and more; 15 s leaves a busy machine room), the URL in the message without
    its credentials."""
    port = free_port()
    url = f"http://alice:s3cret@127.0.0.1:{port}/v1?api-key=k3y"
    started = time.monotonic()
    with anyio.fail_after(60):
        async with RemoteBatchInference(url) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(2000)]
            )
    elapsed = time.monotonic() - started
    assert elapsed < 15.0, elapsed
    shown = f"http://127.0.0.1:{port}/v1"
    for item in result.batch:
        assert item.error is not None
        assert item.error.code == "endpoint_unavailable"
        assert shown in item.error.message and "connection refused" in item.error.message
        assert not any(s in item.error.message for s in ("s3cret", "alice", "k3y"))


async def test_every_replica_refusing_fails_at_once_too() -> None:
    urls = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    started = time.monotonic()
    async with RemoteBatchInference(urls, check_model=False) as client:
        result = await client.batch_chat_completion("smollm2", [convo(f"n{i}") for i in range(50)])
    assert time.monotonic() - started < 5.0
    for item in result.batch:
        assert item.error is not None and item.error.code == "endpoint_unavailable"
        assert all(u in item.error.message for u in urls)


async def test_a_refusing_replica_beside_a_serving_one_costs_no_item() -> None:
    """The refused requests are retried on the replica that serves; the refusing one is taken
    out at its first refusal."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with StubServer(latency_s=0.01) as good:
        async with RemoteBatchInference(
            [dead, good.url], max_concurrency=4, adaptive=False, **FAST
        ) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(100)]
            )
            refused = lane(client, dead)
    assert all(item.error is None for item in result.batch)
    assert good.stats.by_status[200] == 100
    assert refused.ejected and refused.sent <= 4  # at most the first window's share


@pytest.mark.slow  # seconds of waiting: the full suite runs it
async def test_a_server_that_restarts_is_waited_for() -> None:
    """A server that answered, then refuses while it restarts on the same port: its requests
    are retried (after the ejection) and answered once it is back."""
    port = free_port()
    first = StubServer(port=port, latency_s=0.02).start()
    box: dict[str, object] = {}
    try:
        async with RemoteBatchInference(
            first.url,
            max_concurrency=4,
            max_retries=8,
            ejection=Ejection(after=2, duration_s=0.5),
            retry=RetryPolicy(backoff_initial_s=0.05, backoff_max_s=0.2),
        ) as client:

            async def run() -> None:
                box["result"] = await client.batch_chat_completion(
                    "smollm2", [convo(f"n{i}") for i in range(200)]
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                with anyio.fail_after(30):
                    while first.stats.by_status[200] < 20:  # it has answered: a known server
                        await anyio.sleep(0.01)
                await anyio.to_thread.run_sync(first.kill)
                await anyio.sleep(1.0)  # refused meanwhile: retried, not failed
                second = StubServer(port=port, latency_s=0.02).start()
            stats = lane(client)
    finally:
        first.stop()
    try:
        result = box["result"]
        assert all(item.error is None for item in result.batch)  # type: ignore[attr-defined]
        assert second.stats.by_status[200] > 0
        assert stats.failed > 0  # there were refusals on the way
    finally:
        second.stop()
