"""The inline provider's body mapping and response shape, without an engine (pure functions)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from batchclient.inline._mapping import (
    Refusal,
    completion_body,
    logprobs_content,
    map_body,
    resolve_max_tokens,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def plan(**fields: Any) -> Any:
    return map_body({"model": "m", "messages": MESSAGES, **fields})


def test_sampling_fields_map_with_openai_defaults_and_model_defaults() -> None:
    p = plan(temperature=0, top_p=0.5, top_k=5, seed=3, stop="END", repetition_penalty=1.1)
    assert p.sampling["temperature"] == 0.0 and p.sampling["top_p"] == 0.5
    assert p.sampling["top_k"] == 5 and p.sampling["seed"] == 3
    assert p.sampling["stop"] == ["END"] and p.sampling["repetition_penalty"] == 1.1
    assert p.max_tokens is None and p.structured is None and p.top_logprobs is None
    unset = plan()
    assert unset.sampling["temperature"] == 1.0 and unset.sampling["top_p"] == 1.0
    model = map_body({"messages": MESSAGES}, {"temperature": 0.6, "max_tokens": 99})
    assert model.sampling["temperature"] == 0.6 and model.max_tokens == 99
    assert plan(max_tokens=5, max_completion_tokens=7).max_tokens == 7


def test_logprobs_and_structured_outputs() -> None:
    p = plan(logprobs=True, top_logprobs=4)
    assert p.sampling["logprobs"] == 4 and p.top_logprobs == 4
    assert plan(logprobs=True).sampling["logprobs"] == 0
    schema = {"type": "object"}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert plan(response_format=fmt).structured == {"json": schema}
    assert plan(response_format={"type": "json_object"}).structured == {"json_object": True}
    assert plan(response_format={"type": "text"}).structured is None
    grammar = {"grammar": "root ::= x"}
    assert plan(structured_outputs=grammar).structured == grammar
    assert plan(ignore_eos=True).sampling["ignore_eos"] is True
    assert plan(logit_bias={"50": -100}).sampling["logit_bias"] == {50: -100.0}


def test_fields_without_effect_are_accepted() -> None:
    p = plan(user="u1", stream=False, n=1, tools=[], tool_choice="none", parallel_tool_calls=True)
    assert p.messages == MESSAGES


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"stream": True}, "unsupported_parameter", "stream"),
        ({"n": 3}, "unsupported_parameter", "n"),
        ({"tools": [{"type": "function"}]}, "unsupported_parameter", "tools"),
        ({"tool_choice": {"type": "function"}}, "unsupported_parameter", "tool_choice"),
        ({"functions": []}, "unsupported_parameter", "functions"),
        ({"response_format": {"type": "grammar"}}, "unsupported_parameter", "response_format"),
        ({"temperature": True}, "invalid_request", "temperature"),
        ({"max_tokens": 1.5}, "invalid_request", "max_tokens"),
        ({"stop": 3}, "invalid_request", "stop"),
        ({"logprobs": "yes"}, "invalid_request", "logprobs"),
        ({"top_logprobs": 2}, "invalid_request", "top_logprobs"),
        ({"logit_bias": {"x": 1}}, "invalid_request", "logit_bias"),
        (
            {"structured_outputs": {"json": {}, "regex": "a"}},
            "invalid_request",
            "structured_outputs",
        ),
        (
            {"structured_outputs": {"grammar": "g"}, "response_format": {"type": "json_object"}},
            "invalid_request",
            "structured_outputs",
        ),
        ({"response_format": {"type": "json_schema"}}, "invalid_request", "response_format"),
        ({"messages": "hi"}, "invalid_request", "messages"),
    ],
)
def test_refusals_name_the_field(fields: dict[str, Any], code: str, param: str) -> None:
    with pytest.raises(Refusal) as info:
        map_body({"model": "m", "messages": MESSAGES, **fields})
    assert info.value.code.value == code
    assert info.value.param == param
    assert param in info.value.message


def test_max_tokens_resolution_never_truncates_the_prompt() -> None:
    assert resolve_max_tokens(None, 2000, 2048) == 48
    assert resolve_max_tokens(48, 2000, 2048) == 48
    with pytest.raises(Refusal) as info:
        resolve_max_tokens(49, 2000, 2048)
    assert info.value.code.value == "context_length_exceeded" and info.value.param == "max_tokens"
    with pytest.raises(Refusal) as info:
        resolve_max_tokens(None, 2048, 2048)
    assert info.value.code.value == "context_length_exceeded" and info.value.param == "messages"


@dataclass
class Lp:
    logprob: float
    rank: int | None
    decoded_token: str | None


def test_logprobs_content_is_openai_shaped_ranked_and_clamped() -> None:
    steps = [
        {7: Lp(-0.5, 2, "b"), 3: Lp(-0.1, 1, "a"), 9: Lp(-math.inf, 3, "c")},
        {5: Lp(math.nan, 4, None), 1: Lp(-1.0, 1, "x"), 2: Lp(-2.0, 2, "y"), 4: Lp(-3.0, 3, "z")},
    ]
    content = logprobs_content([7, 5], steps, 3, decode=lambda tid: f"<{tid}>")
    first, second = content
    assert first["token"] == "b" and first["logprob"] == -0.5 and first["bytes"] == [98]
    assert [t["token"] for t in first["top_logprobs"]] == ["a", "b", "c"]
    assert first["top_logprobs"][2]["logprob"] == -9999.0  # -inf clamped as OpenAI does
    assert second["token"] == "<5>" and second["logprob"] == -9999.0  # NaN clamped too
    assert [t["token"] for t in second["top_logprobs"]] == ["x", "y", "z"]
    body = completion_body(
        request_id="abc-1",
        model="m",
        created=1,
        text="bx",
        finish_reason="length",
        prompt_tokens=3,
        completion_tokens=2,
        logprobs=content,
    )
    parsed = ChatCompletion.model_validate(body)
    assert parsed.id == "chatcmpl-abc-1" and parsed.usage is not None
    assert parsed.usage.total_tokens == 5
    assert parsed.choices[0].logprobs is not None
    assert parsed.choices[0].logprobs.content is not None
    assert parsed.choices[0].logprobs.content[1].logprob == -9999.0
