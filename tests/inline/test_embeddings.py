"""Embeddings on the inline pooling engine (the session's ``pooling_client``) and on a real vLLM
server in pooling mode (the session's ``pooling_url``) agree input by input; bad input is per
item; an embeddings batch file runs inline and comes out in OpenAI's shape."""

from __future__ import annotations

import json
import math
from pathlib import Path

import anyio
import pytest
from openai.types import CreateEmbeddingResponse

from batchclient import (
    BatchEmbeddingsResponse,
    ConfigurationError,
    Endpoint,
    ErrorCode,
    RemoteBatchInference,
    VLLMBatchInference,
)
from jobs_util import jsonl
from providers import MODEL

pytestmark = pytest.mark.timeout(900)

TEXTS = [
    "The cat sat on the mat.",
    "A feline rested on the rug.",
    "Stock markets fell sharply today.",
    "Paris is the capital of France.",
    "How do I bake sourdough bread at home?",
    "def add(a, b):\n    return a + b",
    "The mitochondria is the powerhouse of the cell.",
    "Quelle heure est-il ?",
    "Rain is expected tomorrow afternoon.",
    "🙂 emoji and ünïcödé text",
    "A short one.",
    "Write a poem about the sea and the sky, with rhymes in every second line.",
]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.mark.server
@pytest.mark.engine
async def test_embeddings_agree_on_both_providers(
    pooling_client: VLLMBatchInference, pooling_url: str, tmp_path: Path
) -> None:
    inline = await pooling_client.batch_embeddings(MODEL, TEXTS)
    async with RemoteBatchInference(pooling_url, state_dir=tmp_path) as remote:
        floats = await remote.batch_embeddings(MODEL, TEXTS)
        b64 = await remote.batch_embeddings(MODEL, TEXTS, encoding_format="base64")
    # one input per request: the server counts each input's tokens itself
    async with RemoteBatchInference(
        pooling_url, state_dir=tmp_path, embedding_group_size=1
    ) as single:
        alone = await single.batch_embeddings(MODEL, TEXTS)
    inline_b64 = await pooling_client.batch_embeddings(MODEL, TEXTS, encoding_format="base64")
    assert not inline.errors and not floats.errors and not b64.errors and not alone.errors
    for mine, theirs, coded, own_coded, one in zip(
        inline.batch, floats.batch, b64.batch, inline_b64.batch, alone.batch, strict=True
    ):
        assert len(mine.vector) == 576 and cosine(mine.vector, theirs.vector) >= 0.999
        # a second call on each provider: bfloat16 rounding moves with the batching (by up to
        # 0.005 per component here), not the vector; the decoding itself is checked exactly in
        # the stub tests
        assert isinstance(coded.embedding, str) and cosine(coded.vector, theirs.vector) >= 0.9999
        assert cosine(own_coded.vector, mine.vector) >= 0.9999
        assert cosine(one.vector, mine.vector) >= 0.999
        assert mine.metric("prompt_tokens") == one.metric("prompt_tokens")

    # in groups the server counts a group's tokens, shared out over its inputs by length: the
    # total is the server's exactly
    def total(got: BatchEmbeddingsResponse) -> float:
        return sum(item.metric("prompt_tokens") or 0 for item in got.batch)

    assert total(floats) == total(alone) == total(inline)
    v = inline.embeddings
    assert cosine(v[0], v[1]) > cosine(v[0], v[2])  # meaning, not just characters


@pytest.mark.engine
async def test_embedding_bad_input_is_per_item(pooling_client: VLLMBatchInference) -> None:
    got = await pooling_client.batch_embeddings(MODEL, ["fine", "", "word " * 1100])
    assert got.batch[0].ok
    errors = [got.batch[1].error, got.batch[2].error]
    assert errors[0] is not None and errors[0].code == ErrorCode.invalid_request
    assert errors[1] is not None and errors[1].code == ErrorCode.context_length_exceeded
    with pytest.raises(ConfigurationError, match="/v1/completions"):
        await pooling_client.batch_completion(MODEL, ["x"])
    assert pooling_client.provider.endpoints == {Endpoint.embeddings}


@pytest.mark.engine
async def test_an_embeddings_batch_file_runs_inline(pooling_client: VLLMBatchInference) -> None:
    lines = [
        json.dumps(
            {
                "custom_id": f"e{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": MODEL, "input": text},
            }
        )
        for i, text in enumerate(TEXTS[:5])
    ]
    lines.append(json.dumps({"custom_id": "two", "method": "POST", "url": "/v1/embeddings",
                             "body": {"model": MODEL, "input": TEXTS[:2]}}))  # fmt: skip
    record = await pooling_client.files.create(jsonl(lines))
    batch = await pooling_client.batches.create(record.id, endpoint="/v1/embeddings")
    with anyio.fail_after(300):
        batch = await pooling_client.batches.wait(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 6
    assert batch.output_file_id is not None
    rows = [
        json.loads(x)
        for x in (await pooling_client.files.content(batch.output_file_id)).splitlines()
    ]
    for row in rows:
        CreateEmbeddingResponse.model_validate(row["response"]["body"])
    assert len(rows[-1]["response"]["body"]["data"]) == 2
    chat = await pooling_client.files.create(
        jsonl([lines[0].replace("/v1/embeddings", "/v1/chat/completions")])
    )
    with pytest.raises(ConfigurationError, match="not served"):
        await pooling_client.batches.create(chat.id)
