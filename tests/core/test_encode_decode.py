"""Protocol types <-> OpenAI wire format."""

from __future__ import annotations

import gc
import math
from typing import Any

import pytest
from pydantic import ValidationError

from batchclient import (
    ChatCompletionResponse,
    LogProbConfig,
    Request,
    Result,
    SamplingParams,
    ToolDefinition,
)
from batchclient._core.client import _build_staged
from batchclient._core.decode import (
    LOGPROB_FLOOR,
    build_response,
    http_error,
    stage_response,
    to_response,
)
from batchclient._core.encode import build_body, message_to_wire, sampling_to_wire, tool_to_wire
from batchclient.types import (
    CompletionMessage,
    GreedySamplingStrategy,
    JsonSchemaResponseFormat,
    Message,
    MetricInResponse,
    StopReason,
    SystemMessage,
    ToolCall,
    ToolParamDefinition,
    ToolResponseMessage,
    TopKSamplingStrategy,
    TopPSamplingStrategy,
    UserMessage,
    coerce_messages,
)


def test_sampling_strategies_map_to_wire() -> None:
    assert sampling_to_wire(SamplingParams()) == {"temperature": 0.0}
    assert sampling_to_wire(
        SamplingParams(strategy=TopPSamplingStrategy(temperature=0.7, top_p=0.9), max_tokens=5)
    ) == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 5}
    assert sampling_to_wire(
        SamplingParams(
            strategy=TopKSamplingStrategy(top_k=3), repetition_penalty=1.2, stop=["\n", "END"]
        )
    ) == {"temperature": 1.0, "top_k": 3, "repetition_penalty": 1.2, "stop": ["\n", "END"]}
    assert sampling_to_wire(SamplingParams(max_tokens=7, ignore_eos=True)) == {
        "temperature": 0.0,
        "max_tokens": 7,
        "ignore_eos": True,
    }


def test_max_tokens_zero_is_omitted() -> None:
    assert "max_tokens" not in sampling_to_wire(
        SamplingParams(strategy=GreedySamplingStrategy(), max_tokens=0)
    )


def test_sampling_params_validate() -> None:
    with pytest.raises(ValidationError):
        SamplingParams(max_tokens=-1)
    with pytest.raises(ValidationError):
        TopPSamplingStrategy(temperature=0.0)


def test_dict_messages_round_trip_through_types() -> None:
    wire: list[Message | dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    typed = coerce_messages(wire)
    assert isinstance(typed[0], SystemMessage)
    assert isinstance(typed[1], UserMessage)
    assert isinstance(typed[2], CompletionMessage)
    assert typed[2].tool_calls == [
        ToolCall(call_id="c1", tool_name="get_weather", arguments={"city": "Paris"})
    ]
    assert isinstance(typed[3], ToolResponseMessage) and typed[3].call_id == "c1"
    assert [message_to_wire(m) for m in typed] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]


def test_unknown_role_is_refused() -> None:
    with pytest.raises(ValidationError):
        coerce_messages([{"role": "wizard", "content": "x"}])


def test_tool_definition_to_wire_schema() -> None:
    tool = ToolDefinition(
        tool_name="get_weather",
        description="Weather for a city",
        parameters={
            "city": ToolParamDefinition(param_type="str", description="city name"),
            "days": ToolParamDefinition(param_type="int", required=False, default=1),
        },
    )
    assert tool_to_wire(tool) == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "city name"},
                    "days": {"type": "integer", "default": 1},
                },
                "required": ["city"],
            },
        },
    }


def test_build_body_carries_format_and_logprobs() -> None:
    body = build_body(
        "m",
        coerce_messages([{"role": "user", "content": "hi"}]),
        SamplingParams(max_tokens=4),
        response_format=JsonSchemaResponseFormat(json_schema={"type": "object"}),
        logprobs=LogProbConfig(top_k=2),
    )
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert body["logprobs"] is True and body["top_logprobs"] == 2
    assert body["max_tokens"] == 4 and body["temperature"] == 0.0


def _ok(body: dict[str, Any]) -> Result:
    return Result(status_code=200, body=body, latency_s=0.5)


def test_finish_reasons_and_metrics() -> None:
    req = Request(index=0, body={}, custom_id="x")
    for finish, reason in [
        ("stop", StopReason.end_of_turn),
        ("length", StopReason.out_of_tokens),
    ]:
        r = to_response(
            req,
            _ok(
                {
                    "choices": [{"message": {"content": "hi"}, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                }
            ),
        )
        assert r.completion_message is not None
        assert r.completion_message.stop_reason == reason
        assert r.custom_id == "x"
        assert r.metric("prompt_tokens") == 3
        assert r.metric("completion_tokens") == 1
        assert r.metric("total_tokens") == 4
        assert r.metric("latency") == 0.5


def test_a_plain_answer_is_staged_untracked_and_built_the_same() -> None:
    """A plain answer is staged as atoms, which the cycle collector stops tracking (so a large
    batch's finished answers are not rescanned by every full collection), and is built into
    a response equal to the one the models themselves give."""
    req = Request(index=0, body={}, custom_id="x")
    result = _ok(
        {
            "choices": [{"message": {"content": "hi"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }
    )
    result.ttft_s = 0.25
    result.extra["cached"] = True
    staged = stage_response(req, result)
    assert type(staged) is tuple
    gc.collect()
    assert not gc.is_tracked(staged)
    expected = ChatCompletionResponse(
        completion_message=CompletionMessage(
            content="hi", stop_reason=StopReason.out_of_tokens, tool_calls=[]
        ),
        logprobs=None,
        metrics=[
            MetricInResponse(metric="prompt_tokens", value=3, unit="tokens"),
            MetricInResponse(metric="completion_tokens", value=1, unit="tokens"),
            MetricInResponse(metric="time_to_first_token", value=0.25, unit="s"),
            MetricInResponse(metric="latency", value=0.5, unit="s"),
            MetricInResponse(metric="cached", value=1),
        ],
        custom_id="x",
    )
    for built in (build_response(staged), to_response(req, result)):
        assert built == expected
        assert built.model_dump() == expected.model_dump()
        assert built.cached


def _parts(model: Any) -> Any:
    """Everything a pydantic instance holds, nested models included: class, field values, which
    fields were set, extras and private attributes."""
    if isinstance(model, list):
        return [_parts(m) for m in model]
    if not isinstance(model, ChatCompletionResponse | CompletionMessage | MetricInResponse):
        return (type(model), model)
    return (
        type(model),
        {k: _parts(v) for k, v in model.__dict__.items()},
        model.model_fields_set,
        model.__pydantic_extra__,
        model.__pydantic_private__,
    )


@pytest.mark.parametrize("custom_id", [None, "x"])
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_a_staged_answer_is_built_as_the_models_validate_it(
    custom_id: str | None, finish: str
) -> None:
    """The build skips checks already made, and nothing else: the instances are those the
    models' own validation gives when every field is given, down to the fields set and the
    metric values' type (an int usage and the cached flag become floats)."""
    req = Request(index=0, body={}, custom_id=custom_id)
    result = _ok(
        {
            "choices": [{"message": {"content": "hi"}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    )
    result.extra["cached"] = True
    staged = stage_response(req, result)
    assert type(staged) is tuple
    validated = ChatCompletionResponse.model_validate(
        {
            "completion_message": {
                "role": "assistant",
                "content": "hi",
                "stop_reason": staged[1],
                "tool_calls": [],
            },
            "logprobs": None,
            "metrics": [
                {"metric": "prompt_tokens", "value": 3, "unit": "tokens"},
                {"metric": "completion_tokens", "value": 1, "unit": "tokens"},
                {"metric": "total_tokens", "value": 4, "unit": "tokens"},
                {"metric": "latency", "value": 0.5, "unit": "s"},
                {"metric": "cached", "value": 1, "unit": None},
            ],
            "error": None,
            "custom_id": custom_id,
        }
    )
    built = build_response(staged)
    assert _parts(built) == _parts(validated)
    assert built.metrics is not None
    assert all(type(m.value) is float for m in built.metrics)
    assert built.model_dump_json() == validated.model_dump_json()


def test_built_answers_are_few_tracked_objects_and_stay_apart() -> None:
    """A built plain answer is at most 10 objects the cycle collector tracks (a validated one
    is 16: each model instance brings its own set of given fields), which is what keeps a
    large batch's full collections cheap. The set is shared, so assigning to one answer must
    leave every other answer as it was."""
    req = Request(index=0, body={}, custom_id="x")
    ok = _ok(
        {
            "choices": [{"message": {"content": "hi"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    )
    staged = [stage_response(req, ok) for _ in range(1000)]
    assert all(type(s) is tuple for s in staged)
    # Counted over 1,000 answers with half an object of slack: other threads in the test
    # process (a pytest-xdist worker's I/O thread) make or free a few objects meanwhile.
    gc.collect()
    before = len(gc.get_objects())
    built = [build_response(s) for s in staged]  # type: ignore[arg-type]
    gc.collect()
    assert (len(gc.get_objects()) - before) / len(built) <= 10.5
    # two first, so that the list and validation's first-use objects exist before the count
    validated = [ChatCompletionResponse.model_validate(b.model_dump()) for b in built[:2]]
    gc.collect()
    tracked = len(gc.get_objects())
    validated += [ChatCompletionResponse.model_validate(b.model_dump()) for b in built]
    gc.collect()
    assert (len(gc.get_objects()) - tracked) / len(built) >= 15.5  # what the build saves

    first, second = built[0], built[1]
    assert first.completion_message is not None and first.metrics is not None
    first.custom_id = "changed"
    first.completion_message.content = "changed"
    first.metrics[0].unit = "changed"
    first.metrics.append(MetricInResponse(metric="extra", value=1.0))
    first.completion_message.tool_calls.append(ToolCall(call_id="c", tool_name="t", arguments={}))
    assert second == to_response(req, ok) == validated[1]
    assert second.model_fields_set == set(ChatCompletionResponse.model_fields)
    assert first.custom_id == "changed" and first.metric("extra") == 1.0
    copied = second.model_copy(update={"custom_id": "y"})
    assert copied.custom_id == "y" and second.custom_id == "x"


def test_staged_answers_are_built_without_touching_the_collector() -> None:
    """Built at the end of a call, staged answers equal answers built at once; the collector
    is left exactly as the process has it: enabled or disabled, frozen or not."""
    req = Request(index=0, body={}, custom_id="x")
    ok = _ok({"choices": [{"message": {"content": "hi"}}]})
    failed_item = to_response(req, Result(status_code=500, body=None, error=None))

    results: list[Any] = [stage_response(req, ok), failed_item]
    _build_staged(results, build_response)
    assert results[0] == to_response(req, ok) and results[1] is failed_item
    assert gc.isenabled() and gc.get_freeze_count() == 0

    gc.disable()
    gc.freeze()
    try:
        results = [stage_response(req, ok)]
        _build_staged(results, build_response)
        assert isinstance(results[0], ChatCompletionResponse)
        assert not gc.isenabled() and gc.get_freeze_count() > 0  # as the caller left it
    finally:
        gc.unfreeze()
        gc.enable()


def test_tool_calls_finish_is_end_of_message() -> None:
    req = Request(index=0, body={})
    r = to_response(
        req,
        _ok(
            {
                "choices": [
                    {
                        "message": {
                            "content": None,
                            "tool_calls": [
                                {"id": "a", "function": {"name": "f", "arguments": '{"x": 1}'}}
                            ],
                        },
                        "finish_reason": "tool_calls",
                    }
                ]
            }
        ),
    )
    assert r.completion_message is not None
    assert r.completion_message.stop_reason == StopReason.end_of_message
    assert r.completion_message.tool_calls[0].arguments == {"x": 1}


def test_logprobs_are_clamped_to_a_finite_floor() -> None:
    req = Request(index=0, body={})
    r = to_response(
        req,
        _ok(
            {
                "choices": [
                    {
                        "message": {"content": "a"},
                        "finish_reason": "stop",
                        "logprobs": {
                            "content": [
                                {
                                    "token": "a",
                                    "logprob": -0.1,
                                    "top_logprobs": [
                                        {"token": "a", "logprob": -0.1},
                                        {"token": "b", "logprob": float("-inf")},
                                    ],
                                }
                            ]
                        },
                    }
                ]
            }
        ),
    )
    assert r.logprobs is not None and len(r.logprobs) == 1
    values = r.logprobs[0].logprobs_by_token
    assert values["a"] == pytest.approx(-0.1)
    assert values["b"] == LOGPROB_FLOOR and math.isfinite(values["b"])


def test_answer_without_choices_is_an_error_not_an_empty_success() -> None:
    r = to_response(Request(index=0, body={}), _ok({"error": {"message": "x"}}))
    assert r.completion_message is None
    assert r.error is not None and r.error.code == "bad_upstream_response"


@pytest.mark.parametrize(
    ("status", "message", "code"),
    [
        (400, "This model's maximum context length is 2048 tokens.", "context_length_exceeded"),
        (400, "temperature must be >= 0", "invalid_request"),
        (401, "bad key", "authentication_error"),
        (403, "no", "permission_denied"),
        (404, "The model `x` does not exist.", "model_not_found"),
        (429, "slow down", "rate_limited"),
        (503, "overloaded", "server_error"),
        (418, "teapot", "http_error"),
    ],
)
def test_http_errors_keep_status_and_body(status: int, message: str, code: str) -> None:
    result = http_error(status, f'{{"error": {{"message": "{message}", "type": "T"}}}}'.encode())
    assert result.error is not None
    assert result.error.code == code
    assert result.error.status_code == status
    assert result.error.message == message
    assert result.status_code == status
    assert result.body is not None and result.body["error"]["message"] == message
    assert result.body["error"]["type"] == "T"


def test_http_error_with_non_json_body() -> None:
    result = http_error(502, b"<html>bad gateway</html>")
    assert result.error is not None and result.error.code == "server_error"
    assert "bad gateway" in result.error.message


def test_plain_conversations_get_the_bodies_build_body_makes_and_no_shared_lists() -> None:
    """The common body (plain text messages, nothing but sampling) is made without build_body's
    conversions but is the same; a ``stop`` list is never shared between two bodies."""
    from batchclient._core.encode import chat_requests

    conversations = [[{"role": "user", "content": f"q{i}"}] for i in range(3)]
    for params in (SamplingParams(max_tokens=5), SamplingParams(stop=["\\n"], max_tokens=2)):
        requests = list(chat_requests("m", conversations, params))
        for conversation, request in zip(conversations, requests, strict=True):
            assert request.body == build_body("m", conversation, params)
            assert request.response_schema is None and request.tool_schemas is None
        bodies = [r.body for r in requests]
        assert bodies[0] is not bodies[1]
        if "stop" in bodies[0]:
            assert bodies[0]["stop"] is not bodies[1]["stop"]
