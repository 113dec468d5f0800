"""Prompt caching on Anthropic Message Batches: a few-shot batch's requests each carry one
1-hour ``cache_control`` mark, on the last block they all share; unrelated short requests carry
none; a request's own marks are kept (never more than 4); the cache reads and writes come back
as usage. Against the loopback stand-in of the API, whose request log the tests read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchclient import AnthropicBatchInference
from batchclient.batchapi._anthropic_cache import (
    CACHE_MARK,
    count_marks,
    mark_shared_prefixes,
    min_tokens,
)
from batchclient.batchapi._anthropic_translate import to_params
from batchclient.remote import RetryPolicy
from batchclient.testing import AnthropicBatchStub

KEY = "sk-ant-test"
FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)
pytestmark = pytest.mark.xdist_group("anthropic")

# about 7,500 tokens of instructions, and one worked example
SYSTEM = "You grade arithmetic. " + " ".join(
    f"Rule {i}: an answer to question {i} must be a whole number." for i in range(600)
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


def client(stub: AnthropicBatchStub, state: Path, **kw: Any) -> AnthropicBatchInference:
    return AnthropicBatchInference(
        stub.url, api_key=KEY, retry=FAST, state_dir=state, poll_interval_s=0.02, **kw
    )


def marks_of(params: dict[str, Any]) -> list[tuple[str, Any]]:
    """(where, mark) for every cache_control in a request."""
    out = []
    system = params.get("system")
    for block in system if isinstance(system, list) else ():
        if "cache_control" in block:
            out.append(("system", block["cache_control"]))
    for n, message in enumerate(params["messages"]):
        content = message["content"]
        for block in content if isinstance(content, list) else ():
            if "cache_control" in block:
                out.append((f"messages.{n}", block["cache_control"]))
    return out


@pytest.mark.slow
async def test_a_few_shot_batch_marks_the_last_shared_block_once(tmp_path: Path) -> None:
    convos = [few_shot(i) for i in range(12)] + [short(i) for i in range(12)]
    with AnthropicBatchStub(api_key=KEY) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("claude-sonnet-4-5", convos)
        params = list(stub.seen_params)
    assert not result.errors and len(result.batch) == 24
    assert [r.text for r in result.batch[12:]] == [
        f"echo: Name a colour, number {i}." for i in range(12)
    ]
    by_text = {p["messages"][-1]["content"][-1]["text"]: p for p in params}
    for i in range(12):
        # the system text and the example pair are shared: the mark is on the example's answer
        marks = marks_of(by_text[f"What is {i} + {i}?"])
        assert marks == [("messages.1", CACHE_MARK)]
    for i in range(12):
        assert marks_of(by_text[f"Name a colour, number {i}."]) == []
    # the stand-in caches the marked prefix: the first request writes it, the others read it
    usages = [r.metric("prompt_tokens") for r in result.batch[:12]]
    assert len(set(usages)) == 1  # reads and writes are both counted as prompt tokens


async def test_the_cache_reads_come_back_as_usage(tmp_path: Path) -> None:
    with AnthropicBatchStub(api_key=KEY) as stub:
        async with client(stub, tmp_path) as c:
            lines = [
                {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": "claude-sonnet-4-5", "messages": few_shot(i)}}
                for i in range(4)
            ]  # fmt: skip
            record = await c.files.create("".join(json.dumps(x) + "\n" for x in lines).encode())
            batch = await c.batches.create(record.id)
            batch = await c.batches.wait(batch.id)
            assert batch.output_file_id is not None
            out = await c.files.content(batch.output_file_id)
    usage = [json.loads(x)["response"]["body"]["usage"] for x in out.splitlines()]
    writes = [u.get("cache_creation_input_tokens", 0) for u in usage]
    reads = [u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for u in usage]
    assert sum(w > 0 for w in writes) == 1 and sum(r > 0 for r in reads) == 3
    assert max(reads) == max(writes) > 1000


async def test_prompt_caching_false_sends_no_mark(tmp_path: Path) -> None:
    with AnthropicBatchStub(api_key=KEY) as stub:
        async with client(stub, tmp_path, prompt_caching=False) as c:
            result = await c.batch_chat_completion(
                "claude-sonnet-4-5", [few_shot(i) for i in range(3)]
            )
        assert not result.errors
        assert all(count_marks(p) == 0 for p in stub.seen_params)


def request(messages: list[dict[str, Any]], model: str = "claude-sonnet-4-5") -> dict[str, Any]:
    params = to_params({"model": model, "messages": messages}, max_tokens=16)
    assert isinstance(params, dict)
    return {"custom_id": "x", "params": params}


def test_a_short_shared_prefix_or_a_lone_long_one_gets_no_mark() -> None:
    brief = [{"role": "system", "content": "Be brief."}]
    shared_short = [request([*brief, {"role": "user", "content": f"q{i}"}]) for i in range(3)]
    lone_long = [request(few_shot(1))]
    assert mark_shared_prefixes(shared_short + lone_long) == 0
    assert all(count_marks(r["params"]) == 0 for r in shared_short + lone_long)


def test_the_model_s_minimum_decides() -> None:
    # about 1,900 tokens shared: enough for Sonnet 4.5 (1,024), not for Haiku 4.5 (4,096)
    text = " ".join(f"Rule {i}: whole numbers only." for i in range(270))
    convo = [{"role": "system", "content": text}, {"role": "user", "content": "q"}]
    sonnet = [request([*convo[:1], {"role": "user", "content": f"q{i}"}]) for i in range(2)]
    haiku = [
        request([*convo[:1], {"role": "user", "content": f"q{i}"}], "claude-haiku-4-5")
        for i in range(2)
    ]
    assert (min_tokens("claude-haiku-4-5-20251001"), min_tokens("claude-sonnet-4-5")) == (
        4096,
        1024,
    )
    assert mark_shared_prefixes(sonnet) == 2
    assert marks_of(sonnet[0]["params"]) == [("system", CACHE_MARK)]  # a string system: a block
    assert mark_shared_prefixes(haiku) == 0


def test_a_request_s_own_marks_are_kept_and_never_more_than_four() -> None:
    own = {"type": "ephemeral"}

    def marked(i: int, marks: int, where: int) -> dict[str, Any]:
        """few_shot(i) with ``marks`` marked parts of its own in message ``where``."""
        convo = few_shot(i)
        parts = [{"type": "text", "text": f"part {k}", "cache_control": own} for k in range(marks)]
        text = convo[where]["content"]
        convo[where] = {
            "role": convo[where]["role"],
            "content": [*parts, {"type": "text", "text": text}],
        }
        return request(convo)

    full = [marked(i, 4, 1) for i in range(2)]
    assert mark_shared_prefixes(full) == 0 and all(count_marks(r["params"]) == 4 for r in full)
    # a mark of its own on the example question: ours goes on the example answer, after it
    early = [marked(i, 1, 1) for i in range(2)]
    assert mark_shared_prefixes(early) == 2
    for r in early:
        assert [m for _, m in marks_of(r["params"])] == [own, CACHE_MARK]
    # its own mark already on the last shared block: nothing added
    last = [marked(i, 1, 3) for i in range(2)]
    assert mark_shared_prefixes(last) == 0
    assert [marks_of(r["params"]) for r in last] == [[("messages.2", own)]] * 2
