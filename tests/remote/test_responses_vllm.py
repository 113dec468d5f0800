"""The Responses API against a real vLLM OpenAI server (the bundled model): ``/v1/responses``
lines passed through as they are, and ``api="responses"`` chat calls, whose greedy answers
equal the chat API's."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from batchclient import RemoteBatchInference, SamplingParams
from providers import MODEL
from responses_util import answers, responses_lines

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]


async def test_responses_lines_pass_through_to_vllm(vllm_url: str, tmp_path: Path) -> None:
    async with RemoteBatchInference(vllm_url, state_dir=tmp_path) as client:
        record = await client.files.create(responses_lines(model=MODEL, temperature=0))
        batch = await client.batches.create(record.id, endpoint="/v1/responses")
        with anyio.fail_after(300):
            batch = await client.batches.wait(batch.id)
        assert batch.output_file_id is not None, batch
        content = await client.files.content(batch.output_file_id)
    rows = [json.loads(x) for x in content.splitlines()]
    texts = answers(rows)  # each a Response the openai SDK parses
    assert set(texts) == {f"r{i}" for i in range(12)} and all(texts.values())
    assert all(r["response"]["body"]["object"] == "response" for r in rows)


async def test_api_responses_gives_the_chat_api_s_answers(vllm_url: str, tmp_path: Path) -> None:
    convos = [
        [{"role": "system", "content": "Answer in one word."},
         {"role": "user", "content": f"Name a colour, number {i}."}]
        for i in range(4)
    ]  # fmt: skip
    params = SamplingParams(max_tokens=12)  # greedy
    got = {}
    for api in ("chat", "responses"):
        async with RemoteBatchInference(vllm_url, api=api, state_dir=tmp_path / api) as client:
            result = await client.batch_chat_completion(MODEL, convos, params)
        assert not result.errors, result.errors
        got[api] = [item.text for item in result.batch]
    assert got["responses"] == got["chat"]
