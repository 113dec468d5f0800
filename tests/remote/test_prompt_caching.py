"""Prompt caching on OpenAI-shaped servers: requests whose long prefix other requests of the
call or batch share carry one ``prompt_cache_key`` per prefix (and the retention asked for);
the rest carry none. Read from the request log of a loopback stub server, through a batch call
and a job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from batchclient import RemoteBatchInference
from batchclient._core.prefix import (
    PROMPT_CACHE_MIN_TOKENS,
    keys_prompt_caches,
    mark_shared_prefixes,
)
from batchclient._core.request import Request
from batchclient.errors import ConfigurationError
from batchclient.testing import StubServer

# about 1,500 tokens of few-shot text each: over the 1,024 a cache needs
LONG_A = "Answer with one number. " + " ".join(
    f"Example {i}: {i} + {i} = {2 * i}." for i in range(260)
)
LONG_B = "Answer with one word. " + " ".join(
    f"Example {i}: the colour of sky {i} is blue." for i in range(200)
)


def few_shot(system: str, question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": question},
    ]


def conversations() -> list[list[dict[str, str]]]:
    """8 over prefix A, 8 over prefix B (interleaved), 4 short unshared ones."""
    out = []
    for i in range(8):
        out.append(few_shot(LONG_A, f"What is {i} + {i}?"))
        out.append(few_shot(LONG_B, f"What colour is sky {i}?"))
    out += [[{"role": "user", "content": f"Say hello to number {i}."}] for i in range(4)]
    return out


def test_the_long_prefixes_are_long_enough() -> None:
    for text in (LONG_A, LONG_B):
        assert len(json.dumps(few_shot(text, "q")[:-1])) >= 4 * PROMPT_CACHE_MIN_TOKENS


def test_one_key_per_shared_long_prefix_and_none_for_the_rest() -> None:
    requests = [Request(i, {"model": "m", "messages": c}) for i, c in enumerate(conversations())]
    # a long prefix no other request shares, and a short one that others share
    requests.append(Request(20, {"model": "m", "messages": few_shot(LONG_A + "!", "q")}))
    requests += [
        Request(21 + i, {"model": "m", "messages": few_shot("Be brief.", f"q{i}")})
        for i in range(3)
    ]
    mark_shared_prefixes(requests)
    keys = [r.prompt_cache_key for r in requests]
    a, b = keys[0], keys[1]
    assert a is not None and b is not None and a != b
    assert keys[0:16:2] == [a] * 8 and keys[1:16:2] == [b] * 8
    assert keys[16:] == [None] * 8
    assert a.startswith("bc-") and len(a) == 35
    again = [Request(0, {"model": "m", "messages": few_shot(LONG_A, q)}) for q in ("x", "y")]
    mark_shared_prefixes(again)
    assert again[0].prompt_cache_key == a  # stable: the prefix's digest, not Python's hash


def test_auto_sends_keys_to_openai_and_azure_hosts_only() -> None:
    for origin in (
        "https://api.openai.com:443",
        "https://my-resource.openai.azure.com:443",
        "https://my-resource.cognitiveservices.azure.com:443",
    ):
        assert keys_prompt_caches(origin), origin
    for origin in (
        "http://127.0.0.1:8000",
        "https://api.groq.com:443",
        "https://openai.com.evil.example:443",
    ):
        assert not keys_prompt_caches(origin), origin
    assert RemoteBatchInference("https://api.openai.com/v1").provider.sends_cache_key
    assert not RemoteBatchInference("http://127.0.0.1:9/v1").provider.sends_cache_key
    assert RemoteBatchInference(
        "http://127.0.0.1:9/v1", prompt_caching=True
    ).provider.sends_cache_key
    off = RemoteBatchInference("https://api.openai.com/v1", prompt_caching=False)
    assert not off.provider.sends_cache_key
    with pytest.raises(ConfigurationError, match="prompt_caching"):
        RemoteBatchInference("http://127.0.0.1:9/v1", prompt_caching="yes")  # type: ignore[arg-type]


async def sent(caching: bool | Literal["auto"], **options: Any) -> list[dict[str, Any]]:
    with StubServer(record_bodies=True) as stub:
        async with RemoteBatchInference(
            stub.url,
            prompt_caching=caching,
            max_concurrency=4,
            **options,
        ) as client:
            result = await client.batch_chat_completion("smollm2", conversations())
        assert not result.errors and len(result.batch) == 20
        return list(stub.stats.bodies)


def keys_by_system(bodies: list[dict[str, Any]]) -> dict[str, set[Any]]:
    out: dict[str, set[Any]] = {}
    for body in bodies:
        first = body["messages"][0]["content"]
        name = "A" if first == LONG_A else "B" if first == LONG_B else "short"
        out.setdefault(name, set()).add(body.get("prompt_cache_key"))
    return out


async def test_a_batch_call_sends_one_key_per_prefix_group() -> None:
    bodies = await sent(True, prompt_cache_retention="24h")
    keys = keys_by_system(bodies)
    assert len(keys["A"]) == 1 and len(keys["B"]) == 1 and keys["A"] != keys["B"]
    assert None not in keys["A"] | keys["B"]
    assert keys["short"] == {None}
    for body in bodies:
        keyed = "prompt_cache_key" in body
        assert (body.get("prompt_cache_retention") == "24h") == keyed


@pytest.mark.parametrize("caching", [False, "auto"])
async def test_no_key_when_off_or_on_a_server_that_is_not_openai(
    caching: bool | Literal["auto"],
) -> None:
    bodies = await sent(caching)
    assert len(bodies) == 20
    assert not any("prompt_cache_key" in b or "prompt_cache_retention" in b for b in bodies)


async def test_a_job_marks_its_lines_and_keeps_a_line_s_own_key(tmp_path: Path) -> None:
    lines: list[dict[str, Any]] = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "smollm2", "messages": convo}}
        for i, convo in enumerate(conversations())
    ]  # fmt: skip
    lines[2]["body"]["prompt_cache_key"] = "mine"  # the second line over prefix A
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    with StubServer(record_bodies=True) as stub:
        async with RemoteBatchInference(
            stub.url, state_dir=tmp_path / "state", prompt_caching=True
        ) as client:
            record = await client.files.create(data)
            batch = await client.batches.create(record.id)
            with anyio.fail_after(60):
                batch = await client.batches.wait(batch.id)
            assert batch.request_counts is not None and batch.request_counts.completed == 20
        bodies = list(stub.stats.bodies)
    keys = keys_by_system(bodies)
    assert keys["A"] - {"mine"} and len(keys["A"] - {"mine"}) == 1 and "mine" in keys["A"]
    assert len(keys["B"]) == 1 and None not in keys["B"] and keys["short"] == {None}
    assert sum(b.get("prompt_cache_key") == "mine" for b in bodies) == 1


async def test_batch_api_lines_get_one_key_per_shared_prefix(tmp_path: Path) -> None:
    """The OpenAI-shaped Batch API: the part's lines are keyed as the fan-out's requests are
    (one key per shared long prefix; a line's own key kept); false sends the file as it is."""
    from batchclient import BatchAPIBatchInference
    from batchclient.remote import RetryPolicy
    from batchclient.testing import BatchAPIStub

    def sent_lines(stub: BatchAPIStub) -> list[dict[str, Any]]:
        return [line["body"] for batch in stub.batches.values() for line in batch.lines]

    for caching in (True, False):
        with BatchAPIStub() as stub:
            async with BatchAPIBatchInference(
                stub.url,
                prompt_caching=caching,
                poll_interval_s=0.02,
                retry=RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05),
                state_dir=tmp_path / f"state-{caching}",
            ) as client:
                result = await client.batch_chat_completion("smollm2", conversations())
            assert not result.errors and len(result.batch) == 20
            keys = keys_by_system(sent_lines(stub))
        if caching:
            assert len(keys["A"]) == 1 and len(keys["B"]) == 1 and keys["A"] != keys["B"]
            assert None not in keys["A"] | keys["B"] and keys["short"] == {None}
        else:
            assert set().union(*keys.values()) == {None}
    assert BatchAPIBatchInference(
        "https://api.openai.com/v1", api_key="k"
    ).provider.backend.prompt_caching  # type: ignore[attr-defined]
    assert not BatchAPIBatchInference("http://127.0.0.1:9/v1").provider.backend.prompt_caching  # type: ignore[attr-defined]
