"""Text completions on the inline engine come out as the real vLLM server writes them: the same
batch file of ``/v1/completions`` lines (plain, echoed with log-probabilities, ``max_tokens: 0``,
vLLM's ``prompt_logprobs``, bad values, an over-long prompt) gives the same texts, tokens,
log-probabilities and error codes on both providers, and ``batch_completion`` the same
answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import (
    BatchClient,
    LogProbConfig,
    RemoteBatchInference,
    SamplingParams,
    VLLMBatchInference,
)
from jobs_util import jsonl
from providers import MODEL

pytestmark = [pytest.mark.server, pytest.mark.engine, pytest.mark.timeout(900)]

IDS = [504, 3575, 282, 4649, 314, 7042]  # "The capital of France is Paris"
BODIES: list[dict[str, Any]] = [
    {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
    {"prompt": IDS, "echo": True, "logprobs": 1, "max_tokens": 0},
    {"prompt": "Once upon a time", "echo": True, "logprobs": 2, "max_tokens": 3, "temperature": 0},
    {"prompt": IDS, "prompt_logprobs": 1, "max_tokens": 1, "temperature": 0},
    {"prompt": "1, 2, 3,", "logprobs": 2, "max_tokens": 4, "temperature": 0},
    {"prompt": "x", "max_tokens": -1},
    {"prompt": [7] * 2100, "max_tokens": 1},
]


async def run(client: BatchClient) -> list[dict[str, Any]]:
    lines = [
        json.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": MODEL, **body},
            }
        )
        for i, body in enumerate(BODIES)
    ]
    record = await client.files.create(jsonl(lines))
    batch = await client.batches.create(record.id, endpoint="/v1/completions")
    with anyio.fail_after(300):
        batch = await client.batches.wait(batch.id)
    rows: list[dict[str, Any]] = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is not None:
            rows += [json.loads(x) for x in (await client.files.content(file_id)).splitlines()]
    return sorted(rows, key=lambda r: int(r["custom_id"][1:]))


def close(a: list[Any], b: list[Any]) -> bool:
    return all((x is None and y is None) or abs(x - y) <= 1e-4 for x, y in zip(a, b, strict=True))


async def test_completion_lines_match_the_vllm_server(
    inline_client: VLLMBatchInference, vllm_url: str, tmp_path: Path
) -> None:
    ours = await run(inline_client)
    async with RemoteBatchInference(vllm_url, state_dir=tmp_path) as remote:
        theirs = await run(remote)
    assert [r["custom_id"] for r in ours] == [r["custom_id"] for r in theirs]
    for mine, other in zip(ours, theirs, strict=True):
        status = mine["response"]["status_code"]
        assert status == other["response"]["status_code"], mine["custom_id"]
        if status != 200:
            assert mine["response"]["body"]["error"]["code"] in (
                "invalid_request",
                "context_length_exceeded",
            )
            continue
        a, b = mine["response"]["body"]["choices"][0], other["response"]["body"]["choices"][0]
        assert a["text"] == b["text"], mine["custom_id"]
        assert mine["response"]["body"]["usage"] == {
            k: other["response"]["body"]["usage"][k]
            for k in ("prompt_tokens", "completion_tokens", "total_tokens")
        }
        if b["logprobs"] is not None:
            assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
            assert a["logprobs"]["text_offset"] == b["logprobs"]["text_offset"]
            assert close(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"])
            for x, y in zip(
                a["logprobs"]["top_logprobs"], b["logprobs"]["top_logprobs"], strict=True
            ):
                assert (x is None) == (y is None) and (x is None or set(x) == set(y))
        if "prompt_logprobs" in a or b.get("prompt_logprobs"):
            pa, pb = a["prompt_logprobs"], b["prompt_logprobs"]
            assert [None if s is None else sorted(s) for s in pa] == [
                None if s is None else sorted(s) for s in pb
            ]
    codes = [r["response"]["body"]["error"]["code"] for r in ours[-2:]]
    assert codes == ["invalid_request", "context_length_exceeded"]


async def test_batch_completion_gives_the_same_answers(
    inline_client: VLLMBatchInference, vllm_url: str, tmp_path: Path
) -> None:
    prompts = ["The capital of France is", "def fibonacci(n):", "Roses are red,"]
    params = SamplingParams(max_tokens=12)
    ours = await inline_client.batch_completion(
        MODEL, prompts, params, logprobs=LogProbConfig(top_k=1)
    )
    async with RemoteBatchInference(vllm_url, state_dir=tmp_path) as remote:
        theirs = await remote.batch_completion(
            MODEL, prompts, params, logprobs=LogProbConfig(top_k=1)
        )
    assert [r.content for r in ours.batch] == [r.content for r in theirs.batch]
    assert all(r.content and r.logprobs and len(r.logprobs) == 12 for r in ours.batch)
    assert [r.stop_reason for r in ours.batch] == [r.stop_reason for r in theirs.batch]
