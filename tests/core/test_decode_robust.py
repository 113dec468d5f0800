"""Nothing a server (or an engine) sends raises out of one item: NaN, Infinity, overflowing
numbers and nulls where numbers belong are read as OpenAI reads them, anything else malformed
is that item's ``bad_upstream_response``; arbitrary bodies go through both providers' result
mapping without an exception (hypothesis)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchclient import Endpoint, RemoteBatchInference
from batchclient._core.decode import LOGPROB_FLOOR, http_error, load_json, to_response
from batchclient._core.request import Request
from batchclient.inline._mapping import completion_body, logprobs_content
from batchclient.remote._client import _parse_success
from batchclient.remote._urls import Redactor
from batchclient.testing import Fault, StubReply, StubServer

CONVO = [{"role": "user", "content": "hi"}]
NON_FINITE = (
    b'{"choices": [{"index": 0, "finish_reason": "stop",'
    b' "message": {"role": "assistant", "content": "fine"},'
    b' "logprobs": {"content": [{"token": "fine", "logprob": -Infinity,'
    b'   "top_logprobs": [{"token": "a", "logprob": NaN}, {"token": "b", "logprob": null},'
    b'                    {"token": "c", "logprob": -1e400}, {"token": "d", "logprob": -0.5}]}]}}],'
    b' "usage": {"prompt_tokens": Infinity, "completion_tokens": 1e999, "total_tokens": 3},'
    b' "created": 123456789012345678901234567890}'
)


def strict(text: str) -> Any:
    """Parse as strict JSON: NaN / Infinity are refused."""

    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


async def test_non_finite_and_overflowing_numbers_are_read_not_lost(tmp_path: Path) -> None:
    fault = Fault(StubReply(raw=NON_FINITE), match="hi")
    with StubServer(faults=[fault]) as stub:
        async with RemoteBatchInference(stub.url, state_dir=tmp_path) as client:
            result = await client.batch_chat_completion("smollm2", [CONVO])
            line = json.dumps(
                {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": "smollm2", "messages": CONVO}}
            ).encode()  # fmt: skip
            batch = await client.batches.create((await client.files.create(line)).id)
            batch = await client.batches.wait(batch.id)
            assert batch.output_file_id is not None
            output = (await client.files.content(batch.output_file_id)).decode()
    item = result.batch[0]
    assert item.error is None and item.text == "fine"
    assert item.logprobs is not None
    assert item.logprobs[0].logprobs_by_token == {
        "fine": LOGPROB_FLOOR, "a": LOGPROB_FLOOR, "b": LOGPROB_FLOOR, "c": LOGPROB_FLOOR,
        "d": -0.5,
    }  # fmt: skip
    assert item.metric("prompt_tokens") is None and item.metric("total_tokens") == 3
    stored = strict(output)  # what the job keeps is strict JSON again
    lp = stored["response"]["body"]["choices"][0]["logprobs"]["content"][0]
    assert (
        lp["logprob"] == LOGPROB_FLOOR
        and stored["response"]["body"]["usage"]["prompt_tokens"] is None
    )


def test_load_json_tolerates_only_numbers() -> None:
    assert load_json(b'{"a": NaN, "b": [Infinity, -Infinity], "logprob": -Infinity}') == {
        "a": None,
        "b": [None, None],
        "logprob": LOGPROB_FLOOR,
    }
    for bad in (b"{'a': 1}", b"nan", b"[" * 100_000, b"\xff\xfe"):
        try:
            value = load_json(bad)
        except ValueError:
            continue
        assert bad == b"nan" and value is None  # a bare NaN is read as null, not an error


# ---------------------------------------------------------------------------- hypothesis

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
JSON_ISH = st.recursive(
    JSON_LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.sampled_from(
                ["choices", "message", "content", "logprobs", "token", "logprob",
                 "top_logprobs", "usage", "prompt_tokens", "tool_calls", "function", "name",
                 "arguments", "finish_reason", "error", "role", "x"]
            ),
            children,
            max_size=6,
        ),
    ),
    max_leaves=30,
)  # fmt: skip


def as_body(value: Any) -> bytes:
    """``value`` as a server would write it: Python's json writes NaN / Infinity bare."""
    return json.dumps(value, allow_nan=True).encode()


REQUESTS = [
    Request(index=0, body={"model": "m", "messages": CONVO}),
    Request(
        index=1,
        body={"model": "m", "messages": CONVO, "tools": [{"type": "function",
              "function": {"name": "f", "parameters": {"type": "object"}}}],
              "tool_choice": "required"},
        tool_schemas={"f": {"type": "object"}},
    ),
    Request(index=2, body={"model": "m", "messages": CONVO}, response_schema={"type": "object"}),
]  # fmt: skip


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=JSON_ISH,
    shape=st.sampled_from(["raw", "choice", "message"]),
    garbage=st.binary(max_size=8),
)
def test_remote_decode_path_never_raises(value: Any, shape: str, garbage: bytes) -> None:
    """Arbitrary JSON-ish bodies (also wrapped into a plausible ChatCompletion, and with bytes
    appended) through the remote provider's answer parsing and ``to_response``."""
    if shape == "choice":
        value = {"choices": [value]}
    elif shape == "message":
        value = {"choices": [{"message": value, "logprobs": value}], "usage": value}
    redactor = Redactor({"sk-secret-key"})
    for raw in (as_body(value), as_body(value) + garbage):
        result = _parse_success(200, raw, None, redactor, Endpoint.chat_completions)
        if result.body is not None:
            orjson.dumps(result.body)  # what is kept can be written back as strict JSON
        for request in REQUESTS:
            response = to_response(request, result)
            assert (response.error is None) != (response.completion_message is None)
        error = http_error(429, raw)
        assert error.error is not None and isinstance(error.error.message, str)


@dataclass
class FakeLogprob:
    logprob: Any
    rank: Any
    decoded_token: Any


LOGPROB_VALUES = st.one_of(
    st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**400), 10)
)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.none(),
            st.dictionaries(
                st.integers(0, 5),
                st.builds(
                    FakeLogprob,
                    LOGPROB_VALUES,
                    st.one_of(st.none(), st.integers(-2, 5), st.booleans()),
                    st.one_of(st.none(), st.text(max_size=3), st.integers()),
                ),
                max_size=4,
            ),
        ),
        max_size=5,
    ),
    token_ids=st.lists(st.integers(0, 5), max_size=5),
    top=st.integers(0, 4),
    text=st.text(max_size=10),
    finish=st.one_of(st.none(), st.sampled_from(["stop", "length", "abort", "weird"])),
)
def test_inline_result_mapping_never_raises(
    steps: list[Any], token_ids: list[int], top: int, text: str, finish: str | None
) -> None:
    """What the engine hands back (log-probabilities that are None, NaN, -inf or huge, odd
    ranks and decoded tokens) through the inline provider's mapping and ``to_response``."""
    content = logprobs_content(token_ids, steps, top, lambda tid: f"<{tid}>")
    body = completion_body(
        request_id="r", model="m", created=0, text=text, finish_reason=finish,
        prompt_tokens=1, completion_tokens=len(token_ids), logprobs=content,
    )  # fmt: skip
    strict(json.dumps(body))  # finite everywhere
    for entry in content:
        assert math.isfinite(entry["logprob"]) and entry["logprob"] >= LOGPROB_FLOOR
    from batchclient._core.request import Result

    response = to_response(REQUESTS[0], Result(status_code=200, body=body))
    assert response.error is None and response.text == text


@settings(max_examples=200, deadline=None)
@given(
    token_logprobs=st.lists(st.one_of(LOGPROB_VALUES, st.text(max_size=2)), max_size=4),
    top=st.lists(
        st.one_of(
            st.none(),
            st.integers(),
            st.dictionaries(st.text(max_size=2), st.one_of(LOGPROB_VALUES, st.text())),
        ),
        max_size=4,
    ),
)
def test_completion_logprobs_are_clamped_as_chat_ones(
    token_logprobs: list[Any], top: list[Any]
) -> None:
    """A completions answer's ``logprobs`` (null, NaN, -inf, text where a number belongs)
    decode by the one clamp every endpoint uses: never an exception, never below -9999.0."""
    from batchclient._core.completions import to_completion_response
    from batchclient._core.decode import clamp_logprob
    from batchclient._core.request import Result

    tokens = [f"t{i}" for i in range(len(token_logprobs))]
    choice = {
        "text": "".join(tokens),
        "finish_reason": "stop",
        "logprobs": {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top},
    }
    request = Request(index=0, body={"model": "m", "prompt": "p"}, endpoint=Endpoint.completions)
    response = to_completion_response(request, Result(status_code=200, body={"choices": [choice]}))
    assert response.error is None
    for step in response.logprobs or ():
        assert all(v >= LOGPROB_FLOOR and math.isfinite(v) for v in step.logprobs_by_token.values())
    assert clamp_logprob(float("-inf")) == clamp_logprob(None) == clamp_logprob("x") == -9999.0
    assert clamp_logprob(-12345) == -9999.0 and clamp_logprob(-0.5) == -0.5
