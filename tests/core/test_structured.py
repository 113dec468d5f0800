"""Structured output, tool calls, logprobs and per-item sampling params, on both providers
(``remote``: the real vLLM server started with ``--enable-auto-tool-choice --tool-call-parser
hermes``; ``inline``: the session's engine), with the bundled SmolLM2-135M-Instruct.

Every answer that was constrained is parsed and validated here again with ``jsonschema``, so a
provider that dropped a constraint fails these tests even if batchclient's own checks did not
catch it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import pytest

from batchclient import ChatCompletionResponse, LogProbConfig, SamplingParams, ToolDefinition
from batchclient._core.encode import tool_to_wire
from batchclient.types import (
    CompletionMessage,
    GrammarResponseFormat,
    JsonSchemaResponseFormat,
    StopReason,
    ToolCall,
    ToolParamDefinition,
    ToolPromptFormat,
    ToolResponseMessage,
    TopPSamplingStrategy,
    UserMessage,
)
from providers import MODEL, Provider, prompt_tokens

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
TEAM = {
    "type": "object",
    "properties": {
        "team": {"type": "string", "maxLength": 20},
        "members": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "skills": {
                        "type": "array",
                        "maxItems": 2,
                        "items": {"type": "string", "maxLength": 16},
                    },
                },
                "required": ["name", "skills"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["team", "members"],
    "additionalProperties": False,
}
PEOPLE = [
    ("Sam", 41),
    ("Alice", 29),
    ("Bob", 35),
    ("Carol", 52),
    ("Dan", 19),
    ("Eve", 63),
    ("Frank", 24),
    ("Grace", 47),
    ("Heidi", 33),
    ("Ivan", 58),
]

WEATHER = ToolDefinition(
    tool_name="get_weather",
    description="Get the current weather in a city",
    parameters={"city": ToolParamDefinition(param_type="str", description="the city's name")},
)
LOCAL_TIME = ToolDefinition(
    tool_name="get_time",
    description="Get the local time in a city",
    parameters={
        "city": ToolParamDefinition(param_type="str", description="the city's name"),
        "format": ToolParamDefinition(param_type="str", description="12h or 24h", required=False),
    },
)
SCHEMAS = {t.tool_name: tool_to_wire(t)["function"]["parameters"] for t in (WEATHER, LOCAL_TIME)}
FORMATS = [
    None,
    ToolPromptFormat.json,
    ToolPromptFormat.function_tag,
    ToolPromptFormat.python_list,
]
ASK = [
    [{"role": "user", "content": "What is the weather in Paris?"}],
    [{"role": "user", "content": "Is it raining in Tokyo right now?"}],
]


def _ok(item: ChatCompletionResponse) -> CompletionMessage:
    if item.error is not None and "enable-auto-tool-choice" in item.error.message:
        pytest.fail(
            "the vLLM server was started without --enable-auto-tool-choice "
            "--tool-call-parser hermes (see tests/conftest.py)"
        )
    assert item.error is None, item.error
    assert item.completion_message is not None
    return item.completion_message


def _check_calls(calls: list[ToolCall], allowed: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.tool_name in allowed
        jsonschema.validate(call.arguments, SCHEMAS[call.tool_name])


# ---------------------------------------------------------------------------- response_format


async def test_every_constrained_answer_validates_against_its_own_schema(
    provider: Provider,
) -> None:
    """Structured output on the batch path (crmne/ruby_llm #894: 0 of 502 batch answers had
    the schema's shape): 10 "Sam is 41" items with a {name, age} schema, one with a nested schema
    (arrays of objects), mixed with items without a format (per-item response formats)."""
    conversations: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": f"{name} is {age}. Give their name and age as JSON."}]
        for name, age in PEOPLE
    ]
    conversations.append(
        [
            {
                "role": "user",
                "content": "Describe a team called Rockets with two members, Ann (skills: "
                "python, sql) and Ben (skills: design), as JSON.",
            }
        ]
    )
    conversations += [
        [{"role": "user", "content": "Name a colour."}],
        [{"role": "user", "content": "What is two plus two?"}],
    ]
    schemas: list[dict[str, Any] | None] = [*[PERSON] * 10, TEAM, None, None]
    formats = [JsonSchemaResponseFormat(json_schema=s) if s else None for s in schemas]
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL, conversations, SamplingParams(max_tokens=160), response_format=formats
        )
    assert len(result.batch) == 13
    for item, schema in zip(result.batch, schemas, strict=True):
        _ok(item)
        if schema is None:
            assert item.text.strip()
            continue
        answer = json.loads(item.text)
        jsonschema.validate(answer, schema)
        if schema is PERSON:
            assert isinstance(answer["age"], int)
    assert json.loads(result.batch[10].text)["members"]  # the nested one has its own shape


async def test_a_grammar_constrains_the_answer(provider: Provider) -> None:
    yes_no = GrammarResponseFormat(bnf={"grammar": 'root ::= "yes" | "no"'})
    questions = [[{"role": "user", "content": q}] for q in ("Is water wet?", "Is fire cold?")]
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL, questions, SamplingParams(max_tokens=5), response_format=yes_no
        )
    for item in result.batch:
        _ok(item)
        assert item.text in ("yes", "no")


# ---------------------------------------------------------------------------- tools


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f or "native")
async def test_a_named_tool_choice_gives_a_call_whose_arguments_validate(
    provider: Provider, fmt: ToolPromptFormat | None
) -> None:
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL,
            ASK,
            SamplingParams(max_tokens=60),
            tools=[WEATHER, LOCAL_TIME],
            tool_choice="get_weather",
            tool_prompt_format=fmt,
        )
    for item in result.batch:
        message = _ok(item)
        _check_calls(message.tool_calls, {"get_weather"})
        assert message.stop_reason == StopReason.end_of_message


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f or "native")
async def test_a_required_tool_choice_gives_calls_that_validate(
    provider: Provider, fmt: ToolPromptFormat | None
) -> None:
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL,
            ASK,
            SamplingParams(max_tokens=120),
            tools=[WEATHER],
            tool_choice="required",
            tool_prompt_format=fmt,
        )
    for item in result.batch:
        _check_calls(_ok(item).tool_calls, {"get_weather"})


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f or "native")
async def test_tool_choice_none_offers_no_tools(
    provider: Provider, fmt: ToolPromptFormat | None
) -> None:
    """The prompt is exactly the prompt without tools, and the answer is text."""
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL,
            ASK,
            SamplingParams(max_tokens=12),
            tools=[WEATHER],
            tool_choice="none",
            tool_prompt_format=fmt,
        )
    for item, conversation in zip(result.batch, ASK, strict=True):
        message = _ok(item)
        assert message.tool_calls == [] and item.text
        assert item.metric("prompt_tokens") == prompt_tokens(conversation)


@pytest.mark.parametrize("fmt", FORMATS[1:])
async def test_auto_offers_the_tools_and_answers_text_or_checked_calls(
    provider: Provider, fmt: ToolPromptFormat
) -> None:
    """With ``auto`` the model decides; whatever it does, the tools were in the prompt and any
    call it made was checked (the 135M model mostly answers in prose)."""
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL, ASK, SamplingParams(max_tokens=40), tools=[WEATHER], tool_prompt_format=fmt
        )
    for item, conversation in zip(result.batch, ASK, strict=True):
        if item.error is not None:
            assert item.error.code == "invalid_tool_call" and item.error.raw_output is not None
            continue
        message = _ok(item)
        if message.tool_calls:
            _check_calls(message.tool_calls, {"get_weather"})
        else:
            assert item.text
        assert item.metric("prompt_tokens") > prompt_tokens(conversation) + 30  # type: ignore[operator]


def _history(result: str, typed: bool) -> list[Any]:
    call = ToolCall(call_id="call_1", tool_name="get_weather", arguments={"city": "Paris"})
    if typed:
        return [
            UserMessage(content="What is the weather in Paris?"),
            CompletionMessage(content="", tool_calls=[call]),
            ToolResponseMessage(call_id="call_1", tool_name="get_weather", content=result),
        ]
    return [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f or "native")
async def test_conversations_with_tool_calls_and_responses(
    provider: Provider, fmt: ToolPromptFormat | None
) -> None:
    """Earlier calls and tool responses reach the prompt, typed and dict forms alike: the
    typed and dict history render to the same prompt, and a longer tool response gives a
    longer prompt by exactly its extra tokens."""
    short, long = "Sunny.", "Sunny, 24 degrees, with a light breeze from the west."
    conversations = [_history(short, True), _history(short, False), _history(long, False)]
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL,
            conversations,
            SamplingParams(max_tokens=16),
            tools=[WEATHER],
            tool_choice="none",
            tool_prompt_format=fmt,
        )
    counts = []
    for item in result.batch:
        _ok(item)
        counts.append(item.metric("prompt_tokens"))
    assert counts[0] == counts[1]
    extra = len(prompt_tokens_of(long)) - len(prompt_tokens_of(short))
    assert counts[2] == counts[1] + extra  # type: ignore[operator]


def prompt_tokens_of(text: str) -> list[int]:
    from providers import tokenizer

    return list(tokenizer()(text, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------------------- logprobs


async def test_logprobs_per_item_one_entry_per_generated_token(provider: Provider) -> None:
    conversations = [
        [{"role": "user", "content": f"Tell me a fact about the number {i}."}] for i in range(4)
    ]
    configs = [LogProbConfig(top_k=3), None, LogProbConfig(top_k=0), None]
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL, conversations, SamplingParams(max_tokens=12), logprobs=configs
        )
    for item, config in zip(result.batch, configs, strict=True):
        _ok(item)
        if config is None:
            assert item.logprobs is None
            continue
        assert item.logprobs is not None
        assert len(item.logprobs) == item.metric("completion_tokens")
        for step in item.logprobs:
            values = list(step.logprobs_by_token.values())
            assert 1 <= len(values) <= config.top_k + 1
            assert all(math.isfinite(v) and -9999.0 <= v <= 0.0 for v in values)
    top3 = result.batch[0].logprobs
    assert top3 is not None and any(len(s.logprobs_by_token) >= 3 for s in top3)


# ---------------------------------------------------------------------------- sampling params


async def test_per_item_stops_lengths_and_temperatures_do_not_leak(provider: Provider) -> None:
    counting = [{"role": "user", "content": "List the numbers from 1 to 30, separated by commas."}]
    params = [
        SamplingParams(max_tokens=40, stop=[","]),
        SamplingParams(max_tokens=40),
        SamplingParams(max_tokens=40, stop=["5"]),
        SamplingParams(max_tokens=3),
        SamplingParams(max_tokens=40, strategy=TopPSamplingStrategy(temperature=0.9)),
        SamplingParams(max_tokens=40),
    ]
    async with provider.open() as client:
        result = await client.batch_chat_completion(MODEL, [counting] * len(params), params)
    texts = [item.text for item in result.batch]
    for item in result.batch:
        _ok(item)
    unstopped = texts[1]
    assert "," in unstopped and "5" in unstopped, unstopped  # neither stop leaked into item 1
    assert texts[5] == unstopped  # greedy items with the same prompt agree
    assert "," not in texts[0] and unstopped.startswith(texts[0])
    assert "5" not in texts[2] and unstopped.startswith(texts[2])
    assert result.batch[3].metric("completion_tokens") == 3
    assert result.batch[1].metric("completion_tokens") > 3  # type: ignore[operator]
    assert texts[4]
