"""The remote provider against the real vLLM OpenAI server with the bundled model. What every
provider must do (order, prompts over the context, cancellation, sampling params, batched vs
one-at-a-time answers) is in ``test_contract.py``."""

from __future__ import annotations

import pytest

from batchclient import RemoteBatchInference, SamplingParams
from batchclient.datasets import sample_sharegpt
from batchclient.models import bundled_model_path
from batchclient.types import StopReason

pytestmark = pytest.mark.server


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


@pytest.mark.heavy
async def test_order_and_attribution(vllm_url: str) -> None:
    """Order and attribution on the real server (vllm #394): conversations of distinct
    lengths, finishing out of order.
    The bundled 135M model cannot be relied on to echo ``TOKEN-i``, so attribution is proven by
    the server's own ``usage.prompt_tokens``: conversation i has a prompt of a length no other
    has, and result i must report exactly that length. 120 conversations keep the prefill short
    on this CPU; the stub-server test runs 300 and checks the text itself."""
    from transformers import AutoTokenizer  # slow to import: only where it is used

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
        assert (item.metric("completion_tokens") or 0) <= params[i].max_tokens
    assert done_counts[-1] == n
