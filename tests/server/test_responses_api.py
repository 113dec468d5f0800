"""``/v1/responses`` through ``batchclient serve``, driven by the real openai SDK on a real
uvicorn server: Files + Batches with ``endpoint="/v1/responses"`` in front of an
OpenAI-compatible server (the lines passed through as they are), and ``POST /v1/responses``
one request at a time, passed through, or translated to chat for a provider that serves chat
only (Anthropic's Message Batches, at its loopback stand-in)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from batchclient import AnthropicBatchInference, ChatCompletionResponse, RemoteBatchInference
from batchclient.cli import main
from batchclient.remote import RetryPolicy
from batchclient.server import create_app
from batchclient.testing import AnthropicBatchStub, AppServer, StubReply, StubServer
from batchclient.testing._stub_answers import responses_body
from jobs_util import jsonl, read_jsonl
from responses_util import answers, expected, responses_lines
from server_util import KEY_A, sdk, served, wait_batch


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(models=("smollm2",)) as server:
        yield server


def test_a_responses_batch_through_serve_is_passed_through(
    stub: StubServer, tmp_path: Path
) -> None:
    before = stub.stats.by_path["/v1/responses"]
    with served(stub.url, tmp_path, api_keys=[KEY_A]) as url:
        client = sdk(url)
        upload = client.files.create(file=("in.jsonl", responses_lines()), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h"
        )
        assert batch.endpoint == "/v1/responses"
        batch = wait_batch(client, batch.id)
        assert batch.status == "completed" and batch.request_counts is not None
        assert batch.request_counts.completed == 12 and batch.output_file_id
        text = client.files.content(batch.output_file_id).text
    lines = [json.loads(x) for x in text.splitlines()]
    assert answers(lines) == expected()
    # each line went upstream as it was: 12 POSTs on /v1/responses, none on chat
    assert stub.stats.by_path["/v1/responses"] - before == 12


def test_post_responses_one_at_a_time(stub: StubServer, tmp_path: Path) -> None:
    with served(stub.url, tmp_path, api_keys=[KEY_A]) as url:
        response = sdk(url).responses.create(
            model="smollm2", input="hello there", instructions="Be brief.", max_output_tokens=8
        )
    assert isinstance(response, Response) and response.output_text == "echo: hello there"


@pytest.mark.slow  # the anthropic SDK's import alone takes seconds
@pytest.mark.xdist_group("anthropic")
def test_post_responses_on_a_chat_only_provider_is_translated(tmp_path: Path) -> None:
    fast = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)
    with AnthropicBatchStub(api_key="sk-ant-test") as upstream:
        client = AnthropicBatchInference(
            upstream.url, api_key="sk-ant-test", retry=fast, poll_interval_s=0.02,
            state_dir=tmp_path / "client",
        )  # fmt: skip
        app = create_app(client.provider, state_dir=tmp_path / "server", api_keys=[KEY_A])
        with AppServer(app) as url:
            response = sdk(url).responses.create(
                model="claude-sonnet-4-5",
                input=[{"role": "user", "content": [{"type": "input_text", "text": "hi there"}]}],
                instructions="Be brief.",
                max_output_tokens=8,
            )
            # what the chat path cannot carry is refused, naming the field
            with pytest.raises(openai.BadRequestError) as refused:
                sdk(url).responses.create(
                    model="claude-sonnet-4-5", input="x", previous_response_id="resp_1"
                )
        sent = list(upstream.seen_params)
    assert refused.value.code == "unsupported_parameter"
    assert refused.value.param == "previous_response_id"
    assert response.output_text == "echo: hi there" and response.status == "completed"
    [params] = sent  # one Anthropic request, with the instructions as its system text
    assert params["system"] == "Be brief." and params["max_tokens"] == 8


@pytest.mark.slow  # the anthropic SDK's import alone takes seconds
@pytest.mark.xdist_group("anthropic")
def test_a_responses_file_on_anthropic_batch_from_the_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(responses_lines(model="claude-sonnet-4-5"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    with AnthropicBatchStub(api_key="sk-ant-test") as upstream:
        args = ["run", str(inp), "-o", str(out), "--provider", "anthropic-batch", "--no-progress"]
        args += ["--base-url", upstream.url, "--state-dir", str(tmp_path / "s")]
        assert main([*args, "--poll-interval", "0.05"]) == 0
        systems = [p.get("system") for p in upstream.seen_params]
    assert answers(read_jsonl(out)) == expected()
    assert systems.count("Answer in one word.") == 4  # the lines with instructions


def verbatim(body: dict[str, Any], attempt: int) -> StubReply:
    """A server that answers each Responses request with its input, as it came."""
    answer = responses_body(body)
    answer["output"][0]["content"][0]["text"] = body["input"]
    return StubReply(body=answer)


async def test_a_responses_line_s_json_schema_is_checked(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}}
    lines = [
        {"custom_id": f"j{i}", "method": "POST", "url": "/v1/responses",
         "body": {"model": "smollm2", "input": text, "text": fmt}}
        for i, text in enumerate(['{"n": 3}', '{"n": "three"}', "not json"])
    ]  # fmt: skip
    with StubServer(handler=verbatim) as upstream:
        async with RemoteBatchInference(upstream.url, state_dir=tmp_path) as client:
            record = await client.files.create(jsonl([json.dumps(x) for x in lines]))
            batch = await client.batches.create(record.id, endpoint="/v1/responses")
            batch = await client.batches.wait(batch.id)
            result = await client.job_result(batch.id)
    codes = [item.error.code if item.error else None for item in result.batch]
    assert codes == [None, "invalid_structured_output", "invalid_structured_output"]
    first = result.batch[0]
    assert isinstance(first, ChatCompletionResponse) and first.text == '{"n": 3}'
