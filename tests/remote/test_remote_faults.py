"""The remote provider's retry policy and per-item errors, against the fault-injecting stub
server on loopback (real sockets, real timing)."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import anyio
import pytest

from batchclient import BatchProgress, ModelNotFoundError, RemoteBatchInference, SamplingParams
from batchclient._routing.retry import RetryWait
from batchclient.errors import BatchFailedError
from batchclient.remote import RetryPolicy
from batchclient.testing import Fault, StubReply, StubServer

FAST: dict[str, Any] = {"retry": RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)}


def convo(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_constructing_a_client_warns_nothing() -> None:
    # pyproject's filterwarnings hides DeprecationWarning from the other tests; record them here
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RemoteBatchInference("http://127.0.0.1:9/v1")
        RemoteBatchInference("http://127.0.0.1:9/v1", **FAST)
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []


def test_backoff_starts_at_initial_doubles_and_is_capped() -> None:
    from tenacity import RetryCallState

    wait = RetryWait(initial_s=0.5, max_s=3.0, jitter_s=0.25)
    state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]  # no Retrying needed
    for attempt, low in [(1, 0.5), (2, 1.0), (3, 2.0)]:
        state.attempt_number = attempt
        assert low <= wait(state) <= low + 0.25
    state.attempt_number = 10
    assert wait(state) == 3.0


async def test_429_with_retry_after_seconds_is_retried_after_the_wait() -> None:
    with StubServer(
        faults=[Fault(StubReply(status=429), match="A", last_attempt=1, retry_after="1")]
    ) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            started = time.monotonic()
            result = await client.batch_chat_completion("smollm2", [convo("A")])
            waited = time.monotonic() - started
    assert result.batch[0].error is None
    assert result.batch[0].text == "echo: A"
    assert waited >= 1.0  # the server's value, not our 10 ms backoff
    assert stub.stats.by_status[429] == 1 and stub.stats.by_status[200] == 1


async def test_429_with_http_date_retry_after_is_honoured() -> None:
    with StubServer(
        faults=[Fault(StubReply(status=429), match="A", last_attempt=1, retry_after="date:2")]
    ) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            started = time.monotonic()
            result = await client.batch_chat_completion("smollm2", [convo("A")])
            waited = time.monotonic() - started
    assert result.batch[0].error is None
    # An HTTP date has one-second resolution: "2 s ahead" is between 1 and 2 s away.
    assert waited >= 0.9


@pytest.mark.parametrize("status", [500, 502, 503, 408])
async def test_transient_statuses_are_retried(status: int) -> None:
    with StubServer(faults=[Fault(StubReply(status=status), last_attempt=2)]) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            result = await client.batch_chat_completion("smollm2", [convo("x"), convo("y")])
    assert [r.text for r in result.batch] == ["echo: x", "echo: y"]
    assert stub.stats.by_status[status] == 4  # two failed attempts per item


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "invalid_request"),
        (401, "authentication_error"),
        (403, "permission_denied"),
        (404, "not_found"),
        (422, "invalid_request"),
    ],
)
async def test_client_errors_are_never_retried(status: int, code: str) -> None:
    with StubServer(
        faults=[Fault(StubReply(status=status, body={"error": {"message": "nope"}}), match="bad")]
    ) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            result = await client.batch_chat_completion("smollm2", [convo("bad"), convo("ok")])
    err = result.batch[0].error
    assert err is not None
    assert (err.code, err.status_code, err.message) == (code, status, "nope")
    assert result.batch[1].text == "echo: ok"
    assert stub.stats.by_status[status] == 1


async def test_exhausted_429_is_rate_limited_with_status_429() -> None:
    with StubServer(faults=[Fault(StubReply(status=429), match="hot")]) as stub:
        async with RemoteBatchInference(stub.url, max_retries=2, **FAST) as client:
            result = await client.batch_chat_completion("smollm2", [convo("hot"), convo("cold")])
    err = result.batch[0].error
    assert err is not None and err.code == "rate_limited" and err.status_code == 429
    assert result.batch[1].error is None
    assert stub.stats.by_status[429] == 3  # 1 + max_retries, then stop


async def test_timeout_counts_per_attempt_and_becomes_an_item_error() -> None:
    with StubServer(faults=[Fault(StubReply(delay_s=30.0), match="slow")]) as stub:
        async with RemoteBatchInference(stub.url, timeout_s=1.0, max_retries=1, **FAST) as client:
            started = time.monotonic()
            result = await client.batch_chat_completion("smollm2", [convo("slow"), convo("fast")])
            elapsed = time.monotonic() - started
    err = result.batch[0].error
    assert err is not None and err.code == "timeout" and err.status_code is None
    assert result.batch[1].text == "echo: fast"
    assert elapsed < 10.0  # two attempts of 1 s, not the 30 s answer


async def test_slow_body_after_headers_times_out() -> None:
    with StubServer(faults=[Fault(StubReply(action="slow", delay_s=5.0), match="slow")]) as stub:
        async with RemoteBatchInference(stub.url, timeout_s=0.3, max_retries=0) as client:
            result = await client.batch_chat_completion("smollm2", [convo("slow")])
    assert result.batch[0].error is not None and result.batch[0].error.code == "timeout"


async def test_connection_reset_is_retried_then_reported() -> None:
    with StubServer(faults=[Fault(StubReply(action="reset"), match="drop")]) as stub:
        async with RemoteBatchInference(stub.url, max_retries=1, **FAST) as client:
            result = await client.batch_chat_completion("smollm2", [convo("drop"), convo("keep")])
            stats = client.replica_stats()[0]
    err = result.batch[0].error
    assert err is not None and err.code == "connection_error" and err.status_code is None
    assert result.batch[1].text == "echo: keep"
    assert stats.failed == 2  # two attempts; a reset on a reused connection is tried again
    assert 2 <= stub.stats.by_status[0] <= 4  # once on a fresh one, which is not an attempt


async def test_malformed_200_bodies_are_errors_never_empty_answers() -> None:
    faults = [
        Fault(StubReply(raw=b"not json"), match="notjson"),
        Fault(StubReply(body={"choices": []}), match="nochoices"),
        Fault(StubReply(body=[1, 2]), match="list"),
    ]
    with StubServer(faults=faults) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo("notjson"), convo("nochoices"), convo("list"), convo("fine")]
            )
    for item in result.batch[:3]:
        assert item.completion_message is None
        assert item.error is not None and item.error.code == "bad_upstream_response"
        assert item.error.status_code == 200
    assert result.batch[3].text == "echo: fine"


async def test_one_failure_does_not_lose_the_others() -> None:
    """Item 2 gets ``200 {"error": ...}``, item 4 a 401; five results in order (litellm PR
    #3397: the first exception discarded every result; litellm #13139: a 200 without
    ``choices`` raised KeyError)."""
    faults = [
        Fault(StubReply(body={"error": {"message": "x"}}), match="item-2"),
        Fault(StubReply(status=401, body={"error": {"message": "Invalid key"}}), match="item-4"),
    ]
    with StubServer(faults=faults) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"item-{i}") for i in range(5)]
            )
            with pytest.raises(BatchFailedError) as raised:
                await client.batch_chat_completion(
                    "smollm2", [convo(f"item-{i}") for i in range(5)], raise_on_error=True
                )
    assert len(result.batch) == 5
    assert [r.text for r in result.batch] == [
        "echo: item-0",
        "echo: item-1",
        "",
        "echo: item-3",
        "",
    ]
    e2, e4 = result.batch[2].error, result.batch[4].error
    assert e2 is not None and e2.code == "bad_upstream_response" and "x" in e2.message
    assert e4 is not None and (e4.code, e4.status_code) == ("authentication_error", 401)
    assert "Invalid key" in e4.message
    assert [i for i, _ in raised.value.errors] == [2, 4]
    assert len(raised.value.response.batch) == 5  # type: ignore[attr-defined]


async def test_sliding_window_never_exceeds_max_concurrency_and_keeps_order() -> None:
    with StubServer(latency_s=0.01, jitter_s=0.03) as stub:
        async with RemoteBatchInference(stub.url, max_concurrency=7) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo(f"n{i}") for i in range(200)]
            )
    assert [r.text for r in result.batch] == [f"echo: n{i}" for i in range(200)]
    assert stub.stats.max_in_flight == 7


async def test_one_slow_request_does_not_stall_the_window() -> None:
    """The first request is held until the other 100 are answered: through a window of 4 they
    pass on the other 3 slots (chunked dispatch would wait for it with every chunk of 4, and
    the test would time out)."""
    release = threading.Event()
    faults = [Fault(StubReply(hold=release), match="n0")]
    with StubServer(latency_s=0.01, faults=faults) as stub:
        async with RemoteBatchInference(stub.url, max_concurrency=4) as client:

            async def let_go_after_the_others() -> None:
                with anyio.fail_after(60):
                    while stub.stats.by_status[200] < 100:
                        await anyio.sleep(0.01)
                release.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(let_go_after_the_others)
                result = await client.batch_chat_completion(
                    "smollm2", [convo(f"n{i}") for i in range(101)]
                )
    assert [r.text for r in result.batch] == [f"echo: n{i}" for i in range(101)]
    assert stub.stats.max_in_flight == 4


async def test_cancellation_closes_in_flight_requests_promptly() -> None:
    with StubServer(latency_s=30.0) as stub:
        async with RemoteBatchInference(stub.url, max_concurrency=8) as client:
            async with anyio.create_task_group() as tg:
                batch = [convo(f"c{i}") for i in range(20)]
                tg.start_soon(client.batch_chat_completion, "smollm2", batch)
                with anyio.fail_after(30):
                    while stub.stats.requests < 8:
                        await anyio.sleep(0.02)
                tg.cancel_scope.cancel()
            assert stub.stats.requests == 8
            with anyio.fail_after(5):
                while stub.stats.in_flight:
                    await anyio.sleep(0.05)
    assert stub.stats.in_flight == 0


async def test_progress_reports_counts_and_tokens() -> None:
    seen: list[BatchProgress] = []
    faults = [Fault(StubReply(status=401), match="bad")]
    with StubServer(faults=faults) as stub:
        async with RemoteBatchInference(stub.url) as client:
            await client.batch_chat_completion(
                "smollm2",
                [convo("a b c"), convo("bad"), convo("d")],
                sampling_params=SamplingParams(max_tokens=16),
                progress=seen.append,
            )
    final = seen[-1]
    assert (final.total, final.completed, final.failed) == (3, 2, 1)
    assert final.completion_tokens == 4 + 2  # "echo: a b c" and "echo: d", one token per word
    # adaptive by default: three requests never fill the starting limit, so it stays there
    assert final.concurrency_limit == 16


async def test_unknown_model_is_a_whole_call_error() -> None:
    with StubServer(models=("smollm2",)) as stub:
        async with RemoteBatchInference(stub.url) as client:
            with pytest.raises(ModelNotFoundError, match="no-such-model"):
                await client.batch_chat_completion("no-such-model", [convo("a")])


async def test_unknown_model_without_model_listing_is_a_per_item_404() -> None:
    with StubServer(models=("smollm2",)) as stub:
        async with RemoteBatchInference(stub.url, check_model=False) as client:
            result = await client.batch_chat_completion("other", [convo("a")])
    err = result.batch[0].error
    assert err is not None and (err.code, err.status_code) == ("model_not_found", 404)


async def test_malformed_conversation_is_a_per_item_error() -> None:
    with StubServer() as stub:
        async with RemoteBatchInference(stub.url) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo("ok"), [{"role": "wizard", "content": "x"}], [], convo("ok2")]
            )
    assert result.batch[0].text == "echo: ok" and result.batch[3].text == "echo: ok2"
    for item in result.batch[1:3]:
        assert item.error is not None and item.error.code == "invalid_request"
        assert item.error.param == "messages"
    assert stub.stats.requests == 2


async def test_client_outside_async_with_is_a_clear_error() -> None:
    from batchclient import ClientClosedError

    client = RemoteBatchInference("http://127.0.0.1:9/v1")
    with pytest.raises(ClientClosedError, match="async with"):
        await client.batch_chat_completion("m", [convo("a")])


async def test_300_conversations_finishing_out_of_order_keep_their_answers() -> None:
    """Result i contains ``TOKEN-i`` for every i, whatever the completion order (vllm #394,
    curator PR #289: answers mapped to the wrong requests)."""
    with StubServer(latency_s=0.001, jitter_s=0.05) as stub:
        async with RemoteBatchInference(stub.url, max_concurrency=64) as client:
            result = await client.batch_chat_completion(
                "smollm2",
                [convo(f"Reply with exactly: TOKEN-{i}") for i in range(300)],
                custom_ids=[f"r{i}" for i in range(300)],
            )
    for i, item in enumerate(result.batch):
        assert item.custom_id == f"r{i}"
        assert item.text.endswith(f"TOKEN-{i}")


async def test_a_request_that_cannot_be_json_is_its_items_invalid_request() -> None:
    """A lone surrogate (a Python string may hold one) or an integer past 64 bits cannot be
    sent as JSON: that item's ``invalid_request`` saying why, nothing sent for it, and the
    others answered (it was an ``internal_error`` naming a TypeError)."""
    with StubServer(record_bodies=True) as stub:
        async with RemoteBatchInference(stub.url) as client:
            result = await client.batch_chat_completion(
                "smollm2", [convo("a\ud800b"), convo("fine"), convo("also fine")]
            )
            huge = await client.batch_chat_completion(
                "smollm2", [convo("x")], SamplingParams(max_tokens=1 << 64)
            )
    bad, *good = result.batch
    assert bad.error is not None and bad.error.code == "invalid_request"
    assert "not valid UTF-8" in bad.error.message and "lone surrogates" in bad.error.message
    assert [r.text for r in good] == ["echo: fine", "echo: also fine"]
    assert huge.batch[0].error is not None and huge.batch[0].error.code == "invalid_request"
    assert [b["messages"][0]["content"] for b in stub.stats.bodies] == ["fine", "also fine"]
