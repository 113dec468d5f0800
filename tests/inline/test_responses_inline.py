"""``/v1/responses`` lines on the inline engine (the bundled model): run as the chat requests
they stand for, written back as ``Response`` lines the openai SDK parses, with the same greedy
answers as the chat calls of the same conversations."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from batchclient import VLLMBatchInference
from jobs_util import jsonl
from providers import MODEL
from responses_util import answers, responses_lines

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


async def test_a_responses_batch_on_the_inline_engine(inline_client: VLLMBatchInference) -> None:
    record = await inline_client.files.create(responses_lines(model=MODEL, temperature=0))
    batch = await inline_client.batches.create(record.id, endpoint="/v1/responses")
    with anyio.fail_after(300):
        batch = await inline_client.batches.wait(batch.id)
    assert batch.output_file_id is not None and batch.request_counts.completed == 12
    rows = [
        json.loads(x)
        for x in (await inline_client.files.content(batch.output_file_id)).splitlines()
    ]
    texts = answers(rows)
    assert [r["custom_id"] for r in rows] == [f"r{i}" for i in range(12)]
    usage = [r["response"]["body"]["usage"] for r in rows]
    assert all(u["input_tokens"] > 0 and 0 < u["output_tokens"] <= 16 for u in usage)
    # the same conversations as chat lines: the same greedy answers
    lines = []
    for i in range(12):
        content: Any = f"question {i}"
        if i % 3 == 1:  # input_text parts are text parts
            content = [{"type": "text", "text": "question"}, {"type": "text", "text": f" {i}"}]
        messages = [{"role": "user", "content": content}]
        if i % 3 == 2:
            messages.insert(0, {"role": "system", "content": "Answer in one word."})
        body = {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0}
        lines.append(json.dumps({"custom_id": f"c{i}", "method": "POST",
                                 "url": "/v1/chat/completions", "body": body}))  # fmt: skip
    record = await inline_client.files.create(jsonl(lines))
    chat = await inline_client.batches.create(record.id)
    with anyio.fail_after(300):
        chat = await inline_client.batches.wait(chat.id)
    assert chat.output_file_id is not None
    content = await inline_client.files.content(chat.output_file_id)
    chat_rows = [json.loads(x)["response"]["body"] for x in content.splitlines()]
    chat_texts = [b["choices"][0]["message"]["content"] for b in chat_rows]
    assert [texts[f"r{i}"] for i in range(12)] == chat_texts
    assert [u["input_tokens"] for u in usage] == [b["usage"]["prompt_tokens"] for b in chat_rows]
