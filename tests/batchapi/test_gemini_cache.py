"""Explicit context caching on the Gemini Batch API, through the real ``google-genai`` SDK
against the loopback stand-in (``batchclient.testing.GeminiBatchStub``), whose cached contents
and received requests the tests read: a prefix shared widely enough is created once, read by
every request that shares it (which then sends only its last turn), renewed while the batch
runs and deleted when it ends; anything else is sent as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchclient import GeminiBatchInference
from batchclient.batchapi import _gemini_cache
from batchclient.batchapi._gemini_cache import reading, shared_prefixes
from batchclient.batchapi._gemini_translate import to_request
from batchclient.cli import main
from batchclient.remote import RetryPolicy
from batchclient.testing import GeminiBatchStub

KEY = "test-key"
FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)
MODEL = "gemini-2.5-flash"  # 2,048 tokens at least
pytestmark = pytest.mark.xdist_group("gemini")

# about 2,400 words of instructions (2,048 to 4,096 tokens by the estimate), and an example
SYSTEM = "You grade arithmetic. " + " ".join(
    f"Rule {i}: an answer to question {i} must be a whole number." for i in range(200)
)
EXAMPLE = [
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
]


def few_shot(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM},
        *EXAMPLE,
        {"role": "user", "content": f"What is {i} + {i}?"},
    ]


def short(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Name a colour, number {i}."}]


def client(stub: GeminiBatchStub, state: Path, **kwargs: Any) -> GeminiBatchInference:
    return GeminiBatchInference(
        stub.url, api_key=KEY, poll_interval_s=0.02, retry=FAST, state_dir=state, **kwargs
    )


def sent(stub: GeminiBatchStub) -> dict[str, dict[str, Any]]:
    """Every request the stub received, by the text of its last turn."""
    out = {}
    for batch in stub.batches.values():
        for _, request in batch.items:
            out[request["contents"][-1]["parts"][-1]["text"]] = request
    return out


async def test_a_few_shot_batch_reads_one_cached_prefix_deleted_at_the_end(
    tmp_path: Path,
) -> None:
    convos = [few_shot(i) for i in range(12)] + [short(i) for i in range(12)]
    with GeminiBatchStub(api_key=KEY, shuffle=True) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion(MODEL, convos)
        requests = sent(stub)
        assert stub.stats.cache_creates == 1 and stub.stats.cache_reads == 12
        assert stub.caches == {} and stub.stats.cache_deletes == 1  # deleted at the end
        [batch] = stub.batches.values()
        assert batch.op["metadata"]["displayName"].endswith("(cached prefixes)")
    assert not result.errors
    assert [i.text for i in result.batch] == [
        *(f"echo: What is {i} + {i}?" for i in range(12)),
        *(f"echo: Name a colour, number {i}." for i in range(12)),
    ]
    names = {requests[f"What is {i} + {i}?"].get("cachedContent") for i in range(12)}
    assert len(names) == 1 and None not in names
    for i in range(12):
        request = requests[f"What is {i} + {i}?"]
        # only the last turn goes; the system text and the example are the cached content's
        assert len(request["contents"]) == 1 and "systemInstruction" not in request
        short_request = requests[f"Name a colour, number {i}."]
        assert "cachedContent" not in short_request and len(short_request["contents"]) == 1
    cached = [item.metric("cached_tokens") for item in result.batch]
    assert len(set(cached[:12])) == 1 and cached[0] is not None and cached[0] > 2000
    assert all(not c for c in cached[12:])
    prompt = [item.metric("prompt_tokens") for item in result.batch[:12]]
    pairs = zip(prompt, cached[:12], strict=True)
    assert all(p is not None and c is not None and p > c for p, c in pairs)


@pytest.mark.slow
async def test_an_uploaded_part_reads_the_cached_prefix_too(tmp_path: Path) -> None:
    with GeminiBatchStub(api_key=KEY) as stub:
        async with client(stub, tmp_path, inline_bytes=0, prompt_caching=True) as c:
            result = await c.batch_chat_completion(MODEL, [few_shot(i) for i in range(3)])
        assert (stub.stats.uploads, stub.stats.cache_creates, stub.stats.cache_reads) == (1, 1, 3)
        assert stub.caches == {} and stub.stats.cache_deletes == 1
        # the uploaded file carries the reads: small requests, not three copies of the prefix
        assert stub.stats.upload_bytes < len(SYSTEM)
    assert [i.text for i in result.batch] == [f"echo: What is {i} + {i}?" for i in range(3)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("caching", "requests", "creates"),
    [("auto", 3, 0), (True, 3, 1), (False, 12, 0), ("auto", 10, 1)],
)
async def test_how_many_must_share_a_prefix(
    tmp_path: Path, caching: bool | str, requests: int, creates: int
) -> None:
    with GeminiBatchStub(api_key=KEY) as stub:
        async with client(stub, tmp_path, prompt_caching=caching) as c:
            result = await c.batch_chat_completion(MODEL, [few_shot(i) for i in range(requests)])
        assert stub.stats.cache_creates == creates
        uncached = [r for r in sent(stub).values() if "cachedContent" not in r]
        assert len(uncached) == (0 if creates else requests)
        assert all("systemInstruction" in r and len(r["contents"]) == 3 for r in uncached)
        if not creates:  # a batch that made none lists none at its end
            assert "cache_list" not in stub.calls
    assert not result.errors and len(result.batch) == requests


@pytest.mark.slow
async def test_a_refused_create_sends_the_requests_as_they_were(tmp_path: Path) -> None:
    # Gemini refuses a cached content under the model's minimum with 400 INVALID_ARGUMENT
    with GeminiBatchStub(api_key=KEY, cache_min_words=10**6) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion(MODEL, [few_shot(i) for i in range(12)])
        assert stub.stats.cache_creates == 0 and stub.stats.cache_reads == 0
        assert all("cachedContent" not in r for r in sent(stub).values())
    assert not result.errors
    assert [i.text for i in result.batch] == [f"echo: What is {i} + {i}?" for i in range(12)]


@pytest.mark.slow
@pytest.mark.parametrize("renew", [True, False])
async def test_a_long_batch_renews_its_cached_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, renew: bool
) -> None:
    # cached contents live 1 s here (renewed every 0.2 s: slack for a busy machine); the
    # batch takes about 3 s
    monkeypatch.setattr(_gemini_cache, "RENEW_AFTER_S", 0.2 if renew else 3600.0)
    monkeypatch.setattr("batchclient.batchapi._gemini.RENEW_AFTER_S", 0.2 if renew else 3600.0)
    with GeminiBatchStub(api_key=KEY, item_delay_s=0.25, cache_max_ttl_s=1.0) as stub:
        async with client(stub, tmp_path, prompt_caching=True, max_attempts=1) as c:
            result = await c.batch_chat_completion(MODEL, [few_shot(i) for i in range(12)])
        renewals = stub.stats.cache_renewals
    if renew:
        assert renewals >= 3 and not result.errors
    else:  # without renewal the later requests find their cached content gone
        assert renewals == 0 and result.errors
        assert {e.code for _, e in result.errors} == {"permission_denied"}


def gemini_request(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {**to_request({"model": MODEL, "messages": messages}), "model": f"models/{MODEL}"}


def test_the_prefix_is_the_system_text_tools_and_every_turn_but_the_last() -> None:
    requests = [gemini_request(few_shot(i)) for i in range(3)]
    [group] = shared_prefixes(requests, f"models/{MODEL}", 2)
    assert group.requests == [0, 1, 2]
    assert set(group.content) == {"systemInstruction", "contents"}
    assert len(group.content["contents"]) == 2
    read = reading(requests[1], "cachedContents/x")
    assert read["contents"] == requests[1]["contents"][-1:]
    assert read["cachedContent"] == "cachedContents/x" and "systemInstruction" not in read
    # the same prefix under a model with a higher minimum (4,096 tokens) is too short
    assert shared_prefixes(requests, "models/gemini-3-pro", 2) == []
    # two different examples: two prefixes
    other = [{"role": "user", "content": "What is 3 + 3?"}, {"role": "assistant", "content": "6"}]
    b = [{"role": "system", "content": SYSTEM}, *other, {"role": "user", "content": "q"}]
    assert len(shared_prefixes([*requests, gemini_request(b), gemini_request(b)], MODEL, 2)) == 2


def test_a_dry_run_counts_the_cached_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "in.jsonl"
    lines = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": MODEL, "messages": few_shot(i), "max_tokens": 8}}
        for i in range(40)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["run", str(path), "--provider", "gemini-batch", "--dry-run"]
    env = {"GEMINI_API_KEY": KEY}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        assert main([*args, "--state-dir", str(tmp_path / "s")]) == 0
        out = capsys.readouterr().out
        assert main([*args, "--state-dir", str(tmp_path / "s"), "--prompt-caching", "false"]) == 0
        off = capsys.readouterr().out
    cached = [line for line in out.splitlines() if "cached" in line]
    assert cached and any(c.isdigit() and c != "0" for c in cached[0])
    assert out != off
