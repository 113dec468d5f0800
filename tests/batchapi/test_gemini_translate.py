"""The OpenAI chat body <-> Gemini GenerateContent translation: what is kept, what is refused
(never dropped), and the answer mapped back to a chat.completion."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchclient.batchapi._gemini_translate import (
    Unsupported,
    status_of,
    to_completion,
    to_request,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_messages_roles_and_generation_config() -> None:
    body = {
        "model": "gemini-x",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": [{"type": "text", "text": "and kind"}]},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": [{"type": "text", "text": "bye"}]},
        ],
        "max_tokens": 10,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "stop": ["END"],
        "n": 2,
        "seed": 7,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "stream": False,
    }
    assert to_request(body) == {
        "systemInstruction": {"parts": [{"text": "be brief"}, {"text": "and kind"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"text": "hello"}]},
            {"role": "user", "parts": [{"text": "bye"}]},
        ],
        "generationConfig": {
            "maxOutputTokens": 10, "temperature": 0.5, "topP": 0.9, "topK": 20,
            "stopSequences": ["END"], "candidateCount": 2, "seed": 7,
            "presencePenalty": 0.1, "frequencyPenalty": 0.2,
        },
    }  # fmt: skip


def test_an_earlier_refusal_stays_in_the_history() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "refusal": "I cannot help with that."},
            {"role": "user", "content": "y"},
        ],
    }
    turn = to_request(body)["contents"][1]
    assert turn == {"role": "model", "parts": [{"text": "I cannot help with that."}]}


def test_tools_tool_calls_and_answers() -> None:
    body = {
        "model": "gemini-x",
        "messages": [
            {"role": "user", "content": "weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 20}'},
            {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
    }
    request = to_request(body)
    assert request["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "weather",
                    "description": "the weather in a city",
                    "parametersJsonSchema": WEATHER["function"]["parameters"],  # type: ignore[index]
                }
            ]
        }
    ]
    assert request["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}
    }
    model_turn, answers = request["contents"][1], request["contents"][2]
    assert model_turn == {
        "role": "model",
        "parts": [
            {"functionCall": {"name": "weather", "args": {"city": "Paris"}}},
            {"functionCall": {"name": "weather", "args": {"city": "Rome"}}},
        ],
    }
    assert answers == {  # both answers in one turn; a plain answer under "content"
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "weather", "response": {"temp": 20}}},
            {"functionResponse": {"name": "weather", "response": {"content": "sunny"}}},
        ],
    }
    for choice, mode in (("auto", "AUTO"), ("none", "NONE"), ("required", "ANY")):
        got = to_request({**body, "tool_choice": choice})["toolConfig"]
        assert got == {"functionCallingConfig": {"mode": mode}}


def test_response_format() -> None:
    base: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    assert to_request({**base, "response_format": fmt})["generationConfig"] == {
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
    }
    got = to_request({**base, "response_format": {"type": "json_object"}})
    assert got["generationConfig"] == {"responseMimeType": "application/json"}
    assert "generationConfig" not in to_request({**base, "response_format": {"type": "text"}})


def test_inline_image_kept_url_image_refused() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}
    body = {"model": "m", "messages": [{"role": "user", "content": [image]}]}
    part = to_request(body)["contents"][0]["parts"][0]
    assert part == {"inlineData": {"mimeType": "image/png", "data": "iVBORw0K"}}
    web = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with pytest.raises(Unsupported) as info:
        to_request({"model": "m", "messages": [{"role": "user", "content": [web]}]})
    assert info.value.param == "messages[0].content[0]"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"stream": True}, "stream"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"stop": ["a", "b", "c", "d", "e", "f"]}, "stop"),
        ({"response_format": {"type": "grammar"}}, "response_format"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
        ({"messages": [{"role": "system", "content": "only system"}]}, "messages"),
        ({"messages": [{"role": "tool", "tool_call_id": "z", "content": "?"}]},
         "messages[0].tool_call_id"),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ],
)  # fmt: skip
def test_refused_never_dropped(extra: dict[str, Any], param: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
    with pytest.raises(Unsupported) as info:
        to_request(body)
    assert info.value.param == param


def test_harmless_values_accepted() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "n": 1, "logprobs": False, "parallel_tool_calls": True, "stream": False,
    }  # fmt: skip
    assert to_request(body) == {"contents": [{"role": "user", "parts": [{"text": "x"}]}]}


def test_answer_to_chat_completion() -> None:
    response = {
        "candidates": [
            {
                "content": {"role": "model", "parts": [
                    {"text": "thinking...", "thought": True},
                    {"text": "Hello "}, {"text": "world"},
                ]},
                "finishReason": "MAX_TOKENS",
                "index": 0,
            },
            {
                "content": {"role": "model", "parts": [
                    {"functionCall": {"name": "weather", "args": {"city": "Paris"}}}
                ]},
                "finishReason": "STOP",
                "index": 1,
            },
        ],
        "usageMetadata": {
            "promptTokenCount": 5, "candidatesTokenCount": 7, "thoughtsTokenCount": 3,
            "totalTokenCount": 15, "cachedContentTokenCount": 2,
        },
        "modelVersion": "gemini-x-001",
        "responseId": "r1",
    }  # fmt: skip
    body = to_completion(response, "gemini-x", "4")
    assert body["id"] == "chatcmpl-r1" and body["object"] == "chat.completion"
    assert body["model"] == "gemini-x-001"
    first, second = body["choices"]
    assert first["message"] == {"role": "assistant", "content": "Hello world"}
    assert first["finish_reason"] == "length"
    assert second["finish_reason"] == "tool_calls" and second["message"]["content"] is None
    (call,) = second["message"]["tool_calls"]
    assert call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert body["usage"] == {
        "prompt_tokens": 5, "completion_tokens": 10, "total_tokens": 15,
        "completion_tokens_details": {"reasoning_tokens": 3},
        "prompt_tokens_details": {"cached_tokens": 2},
    }  # fmt: skip


def test_blocked_prompt_and_safety_finish() -> None:
    blocked = to_completion({"promptFeedback": {"blockReason": "SAFETY"}}, "m", "0")
    assert blocked["choices"][0]["finish_reason"] == "content_filter"
    assert blocked["model"] == "m" and blocked["id"] == "chatcmpl-0"
    safety = {"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "SAFETY"}]}
    assert to_completion(safety, "m", "0")["choices"][0]["finish_reason"] == "content_filter"


def test_grpc_status_to_http() -> None:
    assert status_of({"code": 3}) == 400
    assert status_of({"code": 8}) == 429
    assert status_of({"code": 14}) == 503
    assert status_of({"code": 404}) == 404
    assert status_of({}) == 500
