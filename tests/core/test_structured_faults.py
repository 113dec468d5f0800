"""Structured-output and tool answers a real server cannot be made to produce on demand,
injected by the loopback stub: a tool call whose arguments are not an object (seen with the
vLLM server and the bundled model: ``"Paris"``), a JSON answer off its schema, and a grammar
sent to an endpoint that is not vLLM. Each is that item's error; the other items finish."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batchclient import ErrorCode, RemoteBatchInference, SamplingParams, ToolDefinition
from batchclient.testing import StubReply, StubServer
from batchclient.testing._stub import completion_body
from batchclient.types import GrammarResponseFormat, JsonSchemaResponseFormat, ToolParamDefinition

WEATHER = ToolDefinition(
    tool_name="get_weather",
    parameters={"city": ToolParamDefinition(param_type="str")},
)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _answer(body: dict[str, Any], **message: Any) -> StubReply:
    reply = completion_body(body)
    reply["choices"][0]["message"].update(message)
    return StubReply(body=reply)


def _tool_calls(arguments: str) -> list[dict[str, Any]]:
    return [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": arguments},
        }
    ]


async def test_tool_arguments_off_the_schema_are_invalid_tool_call(tmp_path: Path) -> None:
    def handler(body: dict[str, Any], attempt: int) -> StubReply | None:
        text = body["messages"][-1]["content"]
        if "bad" in text:
            return _answer(body, content=None, tool_calls=_tool_calls('"Paris"'))
        if "broken" in text:
            return _answer(body, content=None, tool_calls=_tool_calls('{"city": '))
        return _answer(body, content=None, tool_calls=_tool_calls('{"city": "Paris"}'))

    with StubServer(handler=handler) as stub:
        async with RemoteBatchInference(stub.url, state_dir=tmp_path) as client:
            result = await client.batch_chat_completion(
                "smollm2",
                [[{"role": "user", "content": t}] for t in ("good", "bad", "broken")],
                SamplingParams(max_tokens=20),
                tools=[WEATHER],
                tool_choice="get_weather",
            )
    good, bad, broken = result.batch
    assert good.error is None and good.completion_message is not None
    assert good.completion_message.tool_calls[0].arguments == {"city": "Paris"}
    for item, raw in ((bad, '"Paris"'), (broken, '{"city": ')):
        assert item.error is not None and item.error.code == ErrorCode.invalid_tool_call
        assert item.error.raw_output is not None and raw in item.error.raw_output


async def test_a_forced_tool_choice_answered_in_prose_is_invalid_tool_call(tmp_path: Path) -> None:
    with StubServer() as stub:  # echoes text, never calls a tool
        async with RemoteBatchInference(stub.url, state_dir=tmp_path) as client:
            result = await client.batch_chat_completion(
                "smollm2",
                [[{"role": "user", "content": "weather?"}]],
                tools=[WEATHER],
                tool_choice="required",
            )
    (item,) = result.batch
    assert item.error is not None and item.error.code == ErrorCode.invalid_tool_call
    assert item.error.raw_output == "echo: weather?"


async def test_a_json_answer_off_its_schema_is_invalid_structured_output(tmp_path: Path) -> None:
    def handler(body: dict[str, Any], attempt: int) -> StubReply | None:
        text = body["messages"][-1]["content"]
        answer = {"name": "Sam", "age": 41} if "ok" in text else {"name": "Sam", "age": "41"}
        return _answer(body, content=json.dumps(answer))

    with StubServer(handler=handler) as stub:
        async with RemoteBatchInference(stub.url, state_dir=tmp_path) as client:
            result = await client.batch_chat_completion(
                "smollm2",
                [[{"role": "user", "content": t}] for t in ("ok", "off")],
                response_format=JsonSchemaResponseFormat(json_schema=PERSON),
            )
    ok, off = result.batch
    assert ok.error is None and json.loads(ok.text) == {"name": "Sam", "age": 41}
    assert off.error is not None and off.error.code == ErrorCode.invalid_structured_output
    assert off.error.raw_output == '{"name": "Sam", "age": "41"}'


async def test_a_grammar_to_an_endpoint_that_is_not_vllm_is_refused_per_item(
    tmp_path: Path,
) -> None:
    """The stub's ``GET /models`` entries are ``owned_by: stub``: a grammar would be ignored
    there, so grammar items are refused before sending; unconstrained items are answered."""
    yes_no = GrammarResponseFormat(bnf={"grammar": 'root ::= "yes" | "no"'})
    with StubServer(record_bodies=True) as stub:
        async with RemoteBatchInference(stub.url, state_dir=tmp_path) as client:
            result = await client.batch_chat_completion(
                "smollm2",
                [[{"role": "user", "content": t}] for t in ("a", "b")],
                response_format=[yes_no, None],
            )
        sent = list(stub.stats.bodies)
    refused, answered = result.batch
    assert refused.error is not None and refused.error.code == ErrorCode.unsupported_parameter
    assert "response_format" in refused.error.message
    assert answered.error is None and answered.text == "echo: b"
    assert [b["messages"][-1]["content"] for b in sent] == ["b"]
