"""The remote provider against the real vLLM OpenAI server with the bundled model."""

from __future__ import annotations

import re
import time
import urllib.request

import anyio
import pytest
from transformers import AutoTokenizer

from batchclient import RemoteBatchInference, SamplingParams, StopReason
from batchclient.datasets import sample_sharegpt
from batchclient.models import bundled_model_path

pytestmark = pytest.mark.server


def running_requests(base_url: str) -> float:
    """The server's own count of running + waiting requests (Prometheus ``/metrics``)."""
    root = base_url.removesuffix("/v1")
    text = urllib.request.urlopen(f"{root}/metrics", timeout=10).read().decode()
    total = 0.0
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        for match in re.finditer(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M):
            total += float(match.group(1))
    return total


async def test_sharegpt_batch(vllm_url: str) -> None:
    samples = sample_sharegpt(24, seed=7)
    async with RemoteBatchInference(vllm_url, max_concurrency=16) as client:
        result = await client.batch_chat_completion(
            "smollm2",
            [s.messages for s in samples],
            sampling_params=SamplingParams(max_tokens=16),
            custom_ids=[s.id for s in samples],
        )
    assert len(result.batch) == 24
    for sample, item in zip(samples, result.batch, strict=True):
        assert item.error is None, item.error
        assert item.custom_id == sample.id
        assert item.text.strip()
        completion = item.metric("completion_tokens")
        assert completion is not None and 1 <= completion <= 16
        prompt = item.metric("prompt_tokens")
        # the chat template adds a few tokens around the raw prompt
        assert prompt is not None and sample.prompt_tokens <= prompt <= sample.prompt_tokens + 64
        assert item.metric("total_tokens") == prompt + completion
        assert item.completion_message is not None
        if completion == 16:
            assert item.completion_message.stop_reason == StopReason.out_of_tokens


async def test_c15_order_and_attribution(vllm_url: str) -> None:
    """Case C15 on the real server: conversations of distinct lengths, finishing out of order.
    The bundled 135M model cannot be relied on to echo ``TOKEN-i``, so attribution is proven by
    the server's own ``usage.prompt_tokens``: conversation i has a prompt of a length no other
    has, and result i must report exactly that length. 120 conversations keep the prefill short
    on this CPU; the stub-server test runs all 300 of the case and checks the text itself."""
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
    n = 120
    conversations = [
        [{"role": "user", "content": f"Reply with exactly: TOKEN-{i}" + " ok" * i}]
        for i in range(n)
    ]
    rendered = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
        for c in conversations
    ]
    expected = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in rendered]
    assert len(set(expected)) == n
    # early items ask for more tokens, so completions arrive out of input order
    params = [SamplingParams(max_tokens=2 + (n - i) % 23) for i in range(n)]
    done_counts: list[int] = []
    async with RemoteBatchInference(vllm_url, max_concurrency=64) as client:
        result = await client.batch_chat_completion(
            "smollm2",
            conversations,
            sampling_params=params,
            custom_ids=[f"r{i}" for i in range(n)],
            progress=lambda p: done_counts.append(p.done),
        )
    assert len(result.batch) == n
    for i, item in enumerate(result.batch):
        assert item.error is None, item.error
        assert item.custom_id == f"r{i}"
        assert item.metric("prompt_tokens") == expected[i], f"item {i} has another's answer"
        assert item.metric("completion_tokens") <= params[i].max_tokens
    assert done_counts[-1] == n


async def test_c05_prompt_longer_than_the_context_is_a_per_item_error(vllm_url: str) -> None:
    """Case C05: the middle conversation is 200,000 words; the others must succeed."""
    huge = "word " * 200_000
    conversations = [
        [{"role": "user", "content": "Say hello."}],
        [{"role": "user", "content": huge}],
        [{"role": "user", "content": "Say goodbye."}],
    ]
    async with RemoteBatchInference(vllm_url) as client:
        result = await client.batch_chat_completion(
            "smollm2", conversations, sampling_params=SamplingParams(max_tokens=8)
        )
    assert len(result.batch) == 3
    assert result.batch[0].error is None and result.batch[0].text
    assert result.batch[2].error is None and result.batch[2].text
    err = result.batch[1].error
    assert err is not None
    assert err.code == "context_length_exceeded"
    assert err.status_code == 400
    assert result.batch[1].completion_message is None


async def test_prompt_plus_max_tokens_over_the_context_is_refused_not_truncated(
    vllm_url: str,
) -> None:
    """Case C05, second half: a prompt that fits but leaves no room for ``max_tokens``."""
    prompt = "word " * 1900  # about 1,900 tokens of a 2,048 context
    async with RemoteBatchInference(vllm_url) as client:
        result = await client.batch_chat_completion(
            "smollm2",
            [[{"role": "user", "content": prompt}]],
            sampling_params=SamplingParams(max_tokens=1000),
        )
    item = result.batch[0]
    if item.error is not None:
        assert item.error.code == "context_length_exceeded"
    else:  # an explicit length finish is the only acceptable success
        assert item.completion_message is not None
        assert item.completion_message.stop_reason == StopReason.out_of_tokens


async def test_cancellation_mid_batch_leaves_the_server_idle(vllm_url: str) -> None:
    conversations = [
        [{"role": "user", "content": f"Write a long story about the number {i}."}]
        for i in range(48)
    ]
    async with RemoteBatchInference(vllm_url, max_concurrency=16) as client:
        started = time.monotonic()
        with anyio.move_on_after(2.0):
            await client.batch_chat_completion(
                "smollm2", conversations, sampling_params=SamplingParams(max_tokens=1500)
            )
        assert time.monotonic() - started < 3.0  # the call ends promptly
    # The server aborts a request when its client disconnects: it must go idle quickly,
    # not finish 16 x 1,500 tokens (minutes on this CPU).
    deadline = time.monotonic() + 15
    while running_requests(vllm_url) > 0 and time.monotonic() < deadline:
        await anyio.sleep(0.25)
    assert running_requests(vllm_url) == 0
