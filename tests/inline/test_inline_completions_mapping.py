"""The inline provider's completions and embeddings bodies -> engine inputs, and engine outputs
-> OpenAI objects, without an engine (``batchclient.inline._completions``)."""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any

import pytest

from batchclient import EmbeddingResponse, ErrorCode
from batchclient._core.request import Result
from batchclient._core.scoring import loglikelihood_requests, to_loglikelihood
from batchclient.inline._completions import (
    DEFAULT_MAX_TOKENS,
    check_prompt_length,
    encode_vector,
    legacy_logprobs,
    map_completion_body,
    map_embedding_body,
    next_token_prompt_logprobs,
    prompt_logprobs_json,
)
from batchclient.inline._mapping import Refusal


@dataclass
class Logprob:
    logprob: float
    rank: int
    decoded_token: str | None = None


def test_defaults_follow_vllms_completions_server() -> None:
    plan = map_completion_body({"model": "m", "prompt": "hi"}, {"temperature": 0.6})
    assert plan.prompt == "hi" and plan.max_tokens == DEFAULT_MAX_TOKENS == 16
    assert plan.sampling["temperature"] == 0.6 and plan.sampling["top_p"] == 1.0
    assert "prompt_logprobs" not in plan.sampling and not plan.echo


def test_echo_with_max_tokens_0_generates_one_token_and_drops_it() -> None:
    plan = map_completion_body({"prompt": [1, 2, 3], "echo": True, "logprobs": 1, "max_tokens": 0})
    assert plan.drop_output and plan.max_tokens == 1 and plan.prompt == [1, 2, 3]
    assert plan.sampling["prompt_logprobs"] == 1 and plan.sampling["logprobs"] == 1
    scored = map_completion_body({"prompt": [[4, 5]], "prompt_logprobs": 1, "max_tokens": 1})
    assert scored.prompt == [4, 5] and scored.sampling["prompt_logprobs"] == 1
    assert scored.prompt_logprobs == 1 and scored.logprobs is None


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"max_tokens": 3}, ErrorCode.invalid_request, "prompt"),
        ({"prompt": ["a", "b"]}, ErrorCode.unsupported_parameter, "prompt"),
        ({"prompt": [1, -2]}, ErrorCode.invalid_request, "prompt"),
        ({"prompt": "a", "stream": True}, ErrorCode.unsupported_parameter, "stream"),
        ({"prompt": "a", "n": 2}, ErrorCode.unsupported_parameter, "n"),
        ({"prompt": "a", "best_of": 2}, ErrorCode.unsupported_parameter, "best_of"),
        ({"prompt": "a", "logprobs": True}, ErrorCode.invalid_request, "logprobs"),
        ({"prompt": "a", "suffix": "z"}, ErrorCode.unsupported_parameter, "suffix"),
    ],
)
def test_bad_completion_bodies_are_refused_by_name(
    body: dict[str, Any], code: ErrorCode, param: str
) -> None:
    with pytest.raises(Refusal) as info:
        map_completion_body(body)
    assert info.value.code == code and info.value.param == param


def test_embedding_bodies() -> None:
    plan = map_embedding_body({"model": "m", "input": ["a", [1, 2]], "encoding_format": "base64"})
    assert plan.inputs == ["a", [1, 2]] and plan.encoding_format == "base64"
    assert map_embedding_body({"input": "x"}).inputs == ["x"]
    for body, param in (({"input": ""}, "input"), ({"input": "x", "encoding_format": "hex"},
                        "encoding_format"), ({"input": "x", "dimensions": 0}, "dimensions"),
                        ({}, "input"), ({"input": "x", "truncate": 5}, "truncate")):  # fmt: skip
        with pytest.raises(Refusal) as info:
            map_embedding_body(body)
        assert info.value.param == param


def test_prompts_over_the_context_are_refused() -> None:
    check_prompt_length(2000, 48, 2048)
    with pytest.raises(Refusal) as info:
        check_prompt_length(2000, 49, 2048)
    assert info.value.code == ErrorCode.context_length_exceeded


def test_echoed_logprobs_in_vllms_legacy_shape() -> None:
    steps: list[Any] = [
        None,
        {7: Logprob(-1.5, 2, " b"), 9: Logprob(-0.2, 1, " x")},
        {8: Logprob(-0.3, 1, " c")},
    ]
    out = legacy_logprobs([6, 7, 8], steps, 1, lambda t: f"<{t}>")
    assert out == {
        "text_offset": [0, 3, 5],
        "token_logprobs": [None, -1.5, -0.3],
        "tokens": ["<6>", " b", " c"],
        "top_logprobs": [None, {" x": -0.2, " b": -1.5}, {" c": -0.3}],
    }
    assert prompt_logprobs_json(steps, str)[1] == {
        "7": {"logprob": -1.5, "rank": 2, "decoded_token": " b"},
        "9": {"logprob": -0.2, "rank": 1, "decoded_token": " x"},
    }


def test_base64_vectors_are_little_endian_float32() -> None:
    text = encode_vector([0.5, -2.0], "base64")
    assert isinstance(text, str)
    assert struct.unpack("<2f", base64.b64decode(text)) == (0.5, -2.0)
    assert EmbeddingResponse(embedding=text).vector == [0.5, -2.0]
    assert encode_vector([1, 2], "float") == [1.0, 2.0]


@pytest.mark.parametrize(
    ("token", "logprob", "greedy", "greedy_logprob", "is_greedy"),
    [
        (7, -0.25, 7, -0.25, True),  # the continuation is the greedy token
        (7, -3.5, 9, -0.5, False),
        (7, -0.5, 9, -0.5, True),  # a tie: as high as the best, lm-eval's rule
        (7, float("-inf"), 9, -0.5, False),  # clamped to vLLM's floor, as every logprob
    ],
)
def test_a_next_token_answer_scores_as_prompt_logprobs_would(
    token: int, logprob: float, greedy: int, greedy_logprob: float, is_greedy: bool
) -> None:
    """The one-token way's answer (context of 3 tokens) is read by the scoring code that reads
    ``prompt_logprobs``: the continuation's log-probability, greedy when it is the best."""
    [request] = loglikelihood_requests("m", [([1, 2, 3], [token])], None, None)
    entries = next_token_prompt_logprobs(3, token, logprob, greedy, greedy_logprob)
    assert entries[:3] == [None, None, None] and len(entries) == 4
    assert entries[3][str(greedy)]["rank"] == 1  # type: ignore[index]
    body = {"choices": [{"prompt_logprobs": entries}]}
    score = to_loglikelihood(request, Result(status_code=200, body=body))
    assert score.error is None and score.num_tokens == 1
    assert score.logprob == max(logprob, -9999.0) and score.is_greedy is is_greedy
