"""Flex lanes: ``service_tier`` is sent with every chat request; with ``"flex"``, capacity
refusals (OpenAI's 429 resource_unavailable, Groq's 498 capacity_exceeded, 503) are waited out
instead of failing the item, and ``flex_fallback_after_s`` sends a request that flex keeps
refusing on the standard tier. Against loopback stub servers that refuse flex requests."""

from __future__ import annotations

import time
from typing import Any

import pytest

from batchclient import RemoteBatchInference
from batchclient._core.request import Result
from batchclient.errors import ConfigurationError
from batchclient.remote import RetryPolicy
from batchclient.remote._client import capacity_refusal
from batchclient.testing import StubReply, StubServer

FAST: dict[str, Any] = {
    "retry": RetryPolicy(backoff_initial_s=0.05, backoff_max_s=0.2),
    "adaptive": False,
}
QUESTIONS = [[{"role": "user", "content": f"Say hello to number {i}."}] for i in range(20)]


def refusing_flex(for_s: float) -> Any:
    """A handler refusing flex requests for ``for_s`` seconds, with OpenAI's and Groq's
    capacity answers in turn."""
    started = time.monotonic()
    count = 0

    def handle(body: dict[str, Any], attempt: int) -> StubReply | None:
        nonlocal count
        if body.get("service_tier") != "flex" or time.monotonic() - started >= for_s:
            return None
        count += 1
        if count % 2:
            error = {"message": "Resource Unavailable", "type": "invalid_request_error",
                     "code": "resource_unavailable"}  # fmt: skip
            return StubReply(status=429, body={"error": error})
        error = {"message": "Flex tier capacity exceeded", "type": "capacity_exceeded",
                 "code": "capacity_exceeded"}  # fmt: skip
        return StubReply(status=498, body={"error": error})

    return handle


@pytest.mark.slow  # seconds of waiting: the full suite runs it
async def test_flex_refusals_for_two_seconds_are_waited_out() -> None:
    with StubServer(handler=refusing_flex(2.0), record_bodies=True) as stub:
        async with RemoteBatchInference(
            stub.url, service_tier="flex", max_retries=2, **FAST
        ) as client:
            assert client.provider.timeout_s == 900.0  # flex: OpenAI's guide's client timeout
            result = await client.batch_chat_completion("smollm2", QUESTIONS)
        statuses = dict(stub.stats.by_status)
    assert not result.errors
    assert [r.text for r in result.batch] == [f"echo: Say hello to number {i}." for i in range(20)]
    assert statuses.get(429, 0) > 20 and statuses.get(498, 0) > 20  # far past max_retries
    assert all(b["service_tier"] == "flex" for b in stub.stats.bodies)


async def test_flex_falls_back_to_the_standard_tier() -> None:
    started = time.monotonic()
    with StubServer(handler=refusing_flex(60.0), record_bodies=True) as stub:
        async with RemoteBatchInference(
            stub.url, service_tier="flex", flex_fallback_after_s=1.0, **FAST
        ) as client:
            result = await client.batch_chat_completion("smollm2", QUESTIONS)
    assert time.monotonic() - started < 30
    assert not result.errors and len(result.batch) == 20
    answered = [b for b in stub.stats.bodies if "service_tier" not in b]
    assert len(answered) == 20  # each on the standard tier, once
    assert stub.stats.by_status[200] == 20


async def test_a_plain_rate_limit_is_not_a_capacity_refusal() -> None:
    def handle(body: dict[str, Any], attempt: int) -> StubReply:
        error = {"message": "Rate limit reached for requests", "code": "rate_limit_exceeded"}
        return StubReply(status=429, body={"error": error})

    with StubServer(handler=handle) as stub:
        async with RemoteBatchInference(
            stub.url, service_tier="flex", max_retries=1, **FAST
        ) as client:
            result = await client.batch_chat_completion("smollm2", QUESTIONS[:2])
    assert [(r.error.code, r.error.status_code) for r in result.batch if r.error] == [
        ("rate_limited", 429)
    ] * 2


async def test_another_tier_is_passed_through_and_498_is_retried_as_a_rate_limit() -> None:
    def handle(body: dict[str, Any], attempt: int) -> StubReply | None:
        return StubReply(status=498, body={"error": {"message": "busy"}}) if attempt == 1 else None

    with StubServer(handler=handle, record_bodies=True) as stub:
        async with RemoteBatchInference(
            stub.url, service_tier="priority", timeout_s=30, **FAST
        ) as client:
            assert client.provider.timeout_s == 30
            result = await client.batch_chat_completion("smollm2", QUESTIONS[:3])
    assert not result.errors
    assert {b["service_tier"] for b in stub.stats.bodies} == {"priority"}
    assert stub.stats.by_status[498] == 3


def test_which_answers_are_capacity_refusals() -> None:
    def answer(status: int, **error: Any) -> Result:
        return Result(status_code=status, body={"error": error})

    assert capacity_refusal(answer(429, code="resource_unavailable"))
    assert capacity_refusal(answer(429, message="Resource Unavailable"))
    assert capacity_refusal(answer(498, code="capacity_exceeded"))
    assert capacity_refusal(answer(503))
    assert not capacity_refusal(answer(429, code="rate_limit_exceeded"))
    assert not capacity_refusal(answer(400, message="capacity"))
    assert not capacity_refusal(Result(status_code=429, body=None))


def test_the_fallback_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="flex_fallback_after_s"):
        RemoteBatchInference("http://127.0.0.1:9/v1", service_tier="flex", flex_fallback_after_s=0)
