"""A third-party provider in a few lines gets the whole protocol from ``BatchClient``: ordered
results, per-item errors, progress, and a durable batch over an OpenAI batch file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import (
    BatchClient,
    BatchInference,
    BatchProgress,
    BatchStatus,
    ConfigurationError,
    ErrorCode,
    JobStatus,
    Provider,
    Request,
    Result,
    failed,
)


class Echo(Provider):
    """Answers every chat request with its last message; refuses the word "boom"."""

    def __init__(self) -> None:
        self.started = self.stopped = 0
        self.seen: list[int] = []

    async def start(self) -> None:
        self.started += 1

    async def stop(self) -> None:
        self.stopped += 1

    async def execute(self, request: Request) -> Result:
        self.seen.append(request.index)
        text = request.body["messages"][-1]["content"]
        if text == "boom":
            return failed(ErrorCode.invalid_request, "no booms", status_code=400, param="messages")
        await anyio.sleep(0.001 * (request.index % 5))  # finish out of order
        return Result(
            status_code=200,
            body={
                "id": f"echo-{request.index}",
                "object": "chat.completion",
                "model": request.body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": text},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )


def convo(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_a_third_party_provider_gets_ordered_results_and_per_item_errors(
    tmp_path: Path,
) -> None:
    provider = Echo()
    reports: list[BatchProgress] = []
    client = BatchClient(provider, state_dir=tmp_path)
    assert isinstance(client, BatchInference)
    async with client:
        result = await client.batch_chat_completion(
            "echo", [convo(f"t{i}") if i != 3 else convo("boom") for i in range(20)],
            progress=reports.append,
        )  # fmt: skip
    assert (provider.started, provider.stopped) == (1, 1)
    assert [r.text for i, r in enumerate(result.batch) if i != 3] == [
        f"t{i}" for i in range(20) if i != 3
    ]
    err = result.batch[3].error
    assert err is not None and (err.code, err.status_code, err.param) == (
        "invalid_request",
        400,
        "messages",
    )
    assert reports[-1].completed == 19 and reports[-1].failed == 1


async def test_a_third_party_provider_runs_a_durable_batch(tmp_path: Path) -> None:
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "echo", "messages": convo("boom" if i == 2 else f"line {i}")},
        }
        for i in range(10)
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    async with BatchClient(Echo(), state_dir=tmp_path / "state") as client:
        record = await client.files.create(path)
        job = await client.schedule_batch(record.id, metadata={"run": "a"})
        with anyio.fail_after(30):
            batch = await client.batches.wait(job.job_id)
        assert batch.status is BatchStatus.completed
        assert await client.job_status(job.job_id) == JobStatus.completed
        assert batch.request_counts.model_dump() == {"total": 10, "completed": 9, "failed": 1}
        assert [b.id for b in await client.batches.list()] == [job.job_id]
        result = await client.job_result(job.job_id)
        assert batch.output_file_id is not None
        output = (await client.files.content(batch.output_file_id)).decode().splitlines()
    assert [r.custom_id for r in result.batch] == [f"r{i}" for i in range(10)]
    assert result.batch[2].error is not None and result.batch[2].error.code == "invalid_request"
    answers = [json.loads(line) for line in output]
    assert answers[0]["response"]["body"]["choices"][0]["message"]["content"] == "line 0"


async def test_an_endpoint_the_provider_does_not_serve_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("{}\n")
    async with BatchClient(Echo(), state_dir=tmp_path / "state") as client:
        record = await client.files.create(path)
        with pytest.raises(ConfigurationError, match="/v1/embeddings"):
            await client.batches.create(record.id, endpoint="/v1/embeddings")


async def test_batches_list_pages_with_an_exclusive_cursor(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    body: dict[str, Any] = {"model": "echo", "messages": convo("x")}
    path.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")  # fmt: skip
    async with BatchClient(Echo(), state_dir=tmp_path / "state") as client:
        record = await client.files.create(path)
        ids = [(await client.batches.create(record.id)).id for _ in range(5)]
        for batch_id in ids:
            await client.batches.wait(batch_id)
        newest_first = ids[::-1]
        assert [b.id for b in await client.batches.list()] == newest_first
        page = await client.batches.list(limit=2, after=newest_first[1])
        assert [b.id for b in page] == newest_first[2:4]


async def test_chat_hands_each_item_to_on_item_as_it_finishes(tmp_path: Path) -> None:
    seen: dict[int, str | None] = {}
    async with BatchClient(Echo(), state_dir=tmp_path) as client:
        result = await client.batch_chat_completion(
            "echo",
            [convo(f"t{i}") for i in range(10)],
            on_item=lambda i, item: seen.__setitem__(i, item.text),
        )
    assert seen == {i: f"t{i}" for i in range(10)}
    assert [item.text for item in result.batch] == [seen[i] for i in range(10)]
