"""How the remote provider treats throttling (429/503 with or without ``Retry-After``) and
errors it must not retry, against the real loopback stub server. Time constants are scaled down
through constructor knobs so each test takes seconds; ``docs/remote.md`` states each rule and
the public report it comes from."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from email.utils import parsedate_to_datetime
from typing import Any

import anyio
import pytest

from batchclient import BatchFailedError, BatchProgress, RemoteBatchInference
from batchclient.remote import AdaptiveConcurrency
from batchclient.testing import Fault, StubReply, StubServer
from batchclient.testing import _stub as stub_module  # the stub's text and Retry-After helpers
from remote_util import FAST, FirstWave, convo, lane


@pytest.mark.parametrize(
    "body",
    [
        {"choices": [{"message": {"content": "all good"}}]},  # looks like a success
        {"error": {"message": "Please slow down"}},  # no "rate limit" words for a text check
        b"",  # no body at all
    ],
)
async def test_a_real_429_backs_off_whatever_its_body_says(body: Any) -> None:
    """The status decides, not the body's words (openai-cookbook PRs #1050, #1254: checks of
    the body text never fired)."""
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


async def test_retry_after_pauses_the_endpoint_when_throttling_is_endpoint_wide() -> None:
    """Every answer is ``429 Retry-After: 1`` for a moment: no request at all reaches the
    endpoint for that second (not only the throttled ones). An isolated 429 holds only its
    own request (tests/remote/test_remote_pacing.py)."""
    wave = FirstWave(8)  # max_concurrency
    with StubServer(latency_s=0.05, handler=wave) as stub:
        async with RemoteBatchInference(
            stub.url, max_concurrency=8, adaptive=False, **FAST
        ) as client:
            batch = [convo(f"n{i}") for i in range(80)]
            result = await client.batch_chat_completion("smollm2", batch)
    assert all(r.error is None for r in result.batch)
    first, t429 = wave.refused[0], wave.refused[-1]
    # nothing new is sent until the second is over
    during = [t for t in wave.arrivals if t429 + 0.02 < t < first + 0.98]
    assert during == [], f"{len(during)} requests sent during the pause"
    assert any(t >= first + 0.98 for t in wave.arrivals), "dispatch never resumed"
    assert stub.stats.by_status[429] == 8  # the first wave, each retried once


@pytest.mark.slow
async def test_steady_retry_after_still_reaches_the_minimum_and_recovers() -> None:
    """For 5 s every answer is ``429 Retry-After: 0.4``; the limit must still walk down to its
    minimum (the cool-down is ours, not the server's hint), then recover once answers succeed
    (inspect_ai #5137: a cool-down extended by each hint froze the limit)."""
    # 5 s leave a busy machine time to start and make the three cuts 0.3 s apart
    storm = Fault(StubReply(status=429), retry_after="0.4", until_s=5.0)
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
                    stats = client.replica_stats()
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
    during = [v for t, v in limits if t < 5.0]
    after = [v for t, v in limits if t > 5.5]
    assert min(during) == 2  # reached the minimum while throttled
    assert after and max(after) >= 8  # and grew back afterwards


@pytest.mark.slow
async def test_429_with_retry_after_seconds_date_and_none() -> None:
    """20 conversations, all in flight at once; the first 3 calls of each get 429 with
    ``Retry-After: 1``, an HTTP date about a second ahead, or nothing (oumi PR #2516: retries
    that ignored Retry-After were spent in seconds). All succeed; each retry waits at least the
    server's value (for a date: until that instant); attempts are bounded (4 each);
    concurrency drops while throttled. Then an item that is always throttled runs out and
    reports 429."""
    calls: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (monotonic, wall clock)
    dates: dict[str, list[float]] = defaultdict(list)  # each HTTP date sent, as a timestamp
    forms = ["1", "date:1", None]

    def handler(body: dict[str, Any], attempt: int) -> StubReply | None:
        text = stub_module._text_of(body)
        calls[text].append((time.monotonic(), time.time()))
        i = int(text.split("-")[1])
        if text.startswith("hot") or (text.startswith("item") and attempt <= 3):
            reply = StubReply(status=429, body={"error": {"message": "slow down"}})
            form = forms[i % 3]
            if form is not None:
                value = stub_module._retry_after_value(form)
                reply.headers["Retry-After"] = value
                if form.startswith("date:"):
                    dates[text].append(parsedate_to_datetime(value).timestamp())
            return reply
        return None

    limits: list[int] = []
    with StubServer(handler=handler) as stub:
        # This server throttles every item's first 3 calls whatever the load: a steady stream
        # of throttles for the whole run, which walks the limit toward its minimum and
        # serialises the run behind the endpoint's pauses. A 10 s cool-down and a floor of 4
        # keep the case short; it passes with the defaults too, only slower.
        async with RemoteBatchInference(
            stub.url,
            max_concurrency=20,
            adaptive=AdaptiveConcurrency(initial=20, minimum=4, cooldown_s=10.0),
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
        if forms[i % 3] == "1":
            gaps = [b[0] - a[0] for a, b in itertools.pairwise(times)]
            assert min(gaps) >= 1.0, (i, gaps)
        elif forms[i % 3] == "date:1":
            sent = dates[f"item-{i}"]
            assert len(sent) == 3
            # every retry comes at or after the instant the server named
            assert all(t[1] >= d for t, d in zip(times[1:], sent, strict=True)), (i, times, sent)
    assert limits[0] == 20
    assert min(limits) < 20  # concurrency dropped while throttled
    err = exhausted.batch[0].error
    assert err is not None and (err.code, err.status_code) == ("rate_limited", 429)
    assert len(calls["hot-2"]) == 3  # 1 + max_retries, then stop
    assert exhausted.batch[1].error is None


async def test_every_429_is_one_signal_to_the_limiter() -> None:
    """No hidden retries: the stub's count of 429s, the client's throttle count and the extra
    requests all agree (mlflow #24404: SDK retries hid throttles from the limiter)."""
    with StubServer(faults=[Fault(StubReply(status=429), last_attempt=1)]) as stub:
        async with RemoteBatchInference(stub.url, **FAST) as client:
            await client.batch_chat_completion("smollm2", [convo(f"n{i}") for i in range(10)])
            stats = lane(client)
    assert stub.stats.by_status[429] == 10
    assert stats.throttled == 10
    assert stats.sent == stub.stats.requests == 20


async def test_adaptive_limits_are_per_endpoint_and_model() -> None:
    """A model throttled on one endpoint slows neither the other model nor the other endpoint
    (inspect_ai PR #3984)."""

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
            cut = {(s.url, s.model): s.cuts for s in client.replica_stats()}
    assert cut[(hot.url, "a")] >= 1
    assert cut[(hot.url, "b")] == 0
    assert cut[(calm.url, "a")] == 0 and cut[(calm.url, "b")] == 0


async def test_an_exhausted_429_reaches_callers_and_metrics_as_429() -> None:
    """Never a 500 or a generic failure (BerriAI/litellm #23901)."""
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


@pytest.mark.parametrize(
    ("status", "message", "code"),
    [
        (400, "This model's maximum context length is 2048 tokens", "context_length_exceeded"),
        (401, "Invalid API key", "authentication_error"),
        (403, "Forbidden", "permission_denied"),
        (404, "The model `x` does not exist", "model_not_found"),
    ],
)
async def test_non_retryable_errors_fail_on_the_first_attempt_with_one_clear_error(
    status: int, message: str, code: str
) -> None:
    """400/401/403/404 are not retried, and a batch where every item fails says so once
    (bespokelabsai/curator #213, EleutherAI/lm-evaluation-harness #2166)."""
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
    assert elapsed < 10.0  # no retry backoff or ejection wait either
    errors = raised.value.errors
    assert len(errors) == 20
    assert {(e.code, e.status_code) for _, e in errors} == {(code, status)}
    assert f"20 item(s) failed; first: item 0: {code}: {message}" in str(raised.value)
