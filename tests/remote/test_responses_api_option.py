"""``api="responses"``: chat calls and chat lines sent as Responses requests (for models served
only there) and their answers read back as chat completions, on ``RemoteBatchInference`` (one
``POST /v1/responses`` per conversation) and ``BatchAPIBatchInference`` (``/v1/responses``
remote batches, here at a ``batchclient serve`` in front of the same loopback server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchclient import BatchAPIBatchInference, RemoteBatchInference, SamplingParams
from batchclient.remote import RemoteProvider, RetryPolicy
from batchclient.server import create_app
from batchclient.testing import AppServer, StubReply, StubServer

FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)


def conversations(n: int) -> list[list[dict[str, Any]]]:
    return [
        [{"role": "system", "content": f"You are assistant {i}."},
         {"role": "user", "content": f"question {i}"}]
        for i in range(n)
    ]  # fmt: skip


async def test_chat_calls_go_out_as_responses_requests(tmp_path: Path) -> None:
    with StubServer(record_bodies=True) as stub:
        async with RemoteBatchInference(
            stub.url, api="responses", retry=FAST, state_dir=tmp_path
        ) as client:
            result = await client.batch_chat_completion(
                "smollm2", conversations(10), SamplingParams(max_tokens=8)
            )
        bodies = list(stub.stats.bodies)
        paths = dict(stub.stats.by_path)
    assert paths == {"/v1/responses": 10}
    assert not result.errors
    assert [item.text for item in result.batch] == [f"echo: question {i}" for i in range(10)]
    by_question = {b["input"][0]["content"]: b for b in bodies}
    for i in range(10):
        body = by_question[f"question {i}"]
        assert body["instructions"] == f"You are assistant {i}."
        assert body["input"] == [{"type": "message", "role": "user", "content": f"question {i}"}]
        assert body["max_output_tokens"] == 8 and body["store"] is False
        assert "messages" not in body and "max_tokens" not in body
    assert all(item.metric("prompt_tokens") for item in result.batch)


async def test_what_the_responses_api_cannot_take_is_the_item_s_error(tmp_path: Path) -> None:
    with StubServer() as stub:
        async with RemoteBatchInference(
            stub.url, api="responses", retry=FAST, state_dir=tmp_path
        ) as client:
            params = [SamplingParams(max_tokens=8) for _ in range(3)]
            # stop has no place in a Responses request
            params[1] = SamplingParams(max_tokens=8, stop=["\n"])
            result = await client.batch_chat_completion("smollm2", conversations(3), params)
        sent = stub.stats.requests
    assert sent == 2  # the refused one was never sent
    [(at, error)] = result.errors
    assert at == 1 and error.code == "unsupported_parameter" and error.param == "stop"
    assert [result.batch[i].text for i in (0, 2)] == ["echo: question 0", "echo: question 2"]


async def test_a_reasoning_answer_keeps_its_reasoning_tokens(tmp_path: Path) -> None:
    def reasoning(body: dict[str, Any], attempt: int) -> StubReply:
        answer = {
            "id": "resp_1", "object": "response", "created_at": 1, "status": "completed",
            "model": body["model"], "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": [],
            "output": [
                {"type": "reasoning", "id": "rs_1",
                 "summary": [{"type": "summary_text", "text": "Two and two make four."}]},
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "4", "annotations": []}]},
            ],
            "usage": {"input_tokens": 9,
                      "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                      "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 29},
                      "total_tokens": 39},
        }  # fmt: skip
        return StubReply(body=answer)

    with StubServer(handler=reasoning) as stub:
        async with RemoteBatchInference(
            stub.url, api="responses", retry=FAST, state_dir=tmp_path
        ) as client:
            result = await client.batch_chat_completion(
                "smollm2", [[{"role": "user", "content": "2+2?"}]]
            )
    [item] = result.batch
    assert item.text == "4"
    assert item.metric("reasoning_tokens") == 29 and item.metric("completion_tokens") == 30


async def test_batch_api_lines_go_as_responses_batches(tmp_path: Path) -> None:
    with StubServer(record_bodies=True) as stub:
        provider = RemoteProvider(stub.url, max_retries=0, retry=FAST)
        app = create_app(provider, state_dir=tmp_path / "served")
        with AppServer(app) as url:
            async with BatchAPIBatchInference(
                f"{url}/v1", api="responses", poll_interval_s=0.05, retry=FAST,
                state_dir=tmp_path / "client",
            ) as client:  # fmt: skip
                result = await client.batch_chat_completion(
                    "smollm2", conversations(10), SamplingParams(max_tokens=8)
                )
        paths = dict(stub.stats.by_path)
        bodies = list(stub.stats.bodies)
    assert paths == {"/v1/responses": 10}
    assert not result.errors
    assert [item.text for item in result.batch] == [f"echo: question {i}" for i in range(10)]
    assert sorted(b["instructions"] for b in bodies) == sorted(
        f"You are assistant {i}." for i in range(10)
    )
