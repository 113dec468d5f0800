"""The Responses API over the chat path: a Responses request becomes the chat request it stands
for, a chat answer the ``Response`` the openai SDK parses (``openai.types.responses``), and
back; what cannot be carried is the item's ``unsupported_parameter`` naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response

from batchclient._core.responses import Unsupported, to_chat, to_completion, to_response
from batchclient._core.usage import token_counts

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_text_input_instructions_and_settings() -> None:
    chat = to_chat(
        {"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9,
         "temperature": 0, "store": False, "metadata": {"k": "v"},
         "reasoning": {"effort": "low", "summary": "auto"}}
    )  # fmt: skip
    assert chat == {
        "model": "m",
        "temperature": 0,
        "metadata": {"k": "v"},
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 9,
        "reasoning_effort": "low",
    }


def test_message_items_parts_tools_and_tool_turns() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Weather in "},
                {"type": "input_text", "text": "Paris?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            ]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
        "tools": [{"type": "function", "name": "weather", "parameters": SCHEMA, "strict": True}],
        "tool_choice": {"type": "function", "name": "weather"},
        "text": {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA}},
    }  # fmt: skip
    chat = to_chat(body)
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["developer", "user", "assistant", "tool"]
    assert chat["messages"][1]["content"][:2] == [
        {"type": "text", "text": "Weather in "},
        {"type": "text", "text": "Paris?"},
    ]
    assert chat["messages"][1]["content"][2]["image_url"]["url"].startswith("data:")
    # two calls in a row are one assistant turn with two tool calls
    assert [c["id"] for c in chat["messages"][2]["tool_calls"]] == ["c1", "c2"]
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert chat["tools"][0]["function"]["name"] == "weather"
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert chat["response_format"]["json_schema"]["schema"] == SCHEMA


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "x", "background": True}, "background"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
        ({"input": "x", "text": {"format": {"type": "grammar"}}}, "text.format"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": []}, "input"),
    ],
)
def test_what_cannot_be_carried_names_its_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(Unsupported) as caught:
        to_chat({"model": "m", **body})
    assert caught.value.param == param


def completion(**message: Any) -> dict[str, Any]:
    finish = message.pop("finish_reason", "stop")
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", **message},
                     "finish_reason": finish}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                  "prompt_tokens_details": {"cached_tokens": 8},
                  "completion_tokens_details": {"reasoning_tokens": 2}},
    }  # fmt: skip


def test_a_chat_answer_is_a_response_the_sdk_parses() -> None:
    request = {"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9}
    raw = to_response(completion(content="Hello.", reasoning_content="Greet back."), request)
    response = Response.model_validate(raw)
    assert response.output_text == "Hello." and response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.instructions == "Be brief." and response.max_output_tokens == 9
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 5)
    assert response.usage.input_tokens_details.cached_tokens == 8
    assert response.usage.output_tokens_details.reasoning_tokens == 2
    assert token_counts(raw["usage"]) == token_counts(completion()["usage"])


def test_a_cut_answer_is_incomplete_and_tool_calls_are_items() -> None:
    cut_answer = to_response(completion(content="Hel", finish_reason="length"), {})
    cut = Response.model_validate(cut_answer)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"n": 1}'}}
    raw = to_response(completion(content=None, tool_calls=[call], finish_reason="tool_calls"), {})
    response = Response.model_validate(raw)
    [item] = response.output
    assert item.type == "function_call" and item.call_id == "c1" and item.arguments == '{"n": 1}'
    # and back: the chat answer it stands for
    back = to_completion(raw)
    assert back is not None
    assert back["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"
    assert back["choices"][0]["finish_reason"] == "tool_calls"
    assert back["usage"]["prompt_tokens_details"]["cached_tokens"] == 8


def test_what_is_not_a_usable_response() -> None:
    assert to_completion({"output": "text"}) is None
    assert to_completion({"output": [], "status": "failed"}) is None
    assert to_completion([]) is None
