"""Completions, scoring and embeddings on the remote provider against the loopback stub (real
sockets), and their pure encode/decode: the path each request goes to, the bodies sent, the
answers decoded, per-item errors, the whole-call errors."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import (
    BatchClient,
    ConfigurationError,
    EmbeddingResponse,
    Endpoint,
    ErrorCode,
    LogProbConfig,
    RemoteBatchInference,
    Request,
    Result,
    SamplingParams,
)
from batchclient._core.completions import completion_requests, to_completion_response
from batchclient._core.embeddings import embedding_requests, to_embedding_response
from batchclient.models import bundled_model_path
from batchclient.testing import Fault, StubReply, StubServer
from batchclient.testing._stub_answers import stub_vector, token_logprob
from batchclient.types import (
    ImageContentItem,
    JsonSchemaResponseFormat,
    StopReason,
    TextContentItem,
)
from jobs_util import FAST


def remote(stub: StubServer, tmp_path: Path, **kw: Any) -> RemoteBatchInference:
    return RemoteBatchInference(stub.url, state_dir=tmp_path / "state", **{**FAST, **kw})


# ------------------------------------------------------------------------------ completions


def test_completion_bodies_carry_prompt_sampling_format_and_logprobs() -> None:
    schema = {"type": "object"}
    reqs = list(
        completion_requests(
            "m",
            [
                "a",
                [TextContentItem(text="b"), TextContentItem(text="c")],
                ImageContentItem(url="x"),
            ],
            SamplingParams(max_tokens=5, stop=["\n"]),
            [None, JsonSchemaResponseFormat(json_schema=schema), None],
            LogProbConfig(top_k=2),
            ["x", "y", "z"],
        )
    )
    assert reqs[0].body == {
        "model": "m",
        "prompt": "a",
        "temperature": 0.0,
        "max_tokens": 5,
        "stop": ["\n"],
        "logprobs": 2,
    }
    assert reqs[1].body["prompt"] == "bc" and reqs[1].response_schema == schema
    assert reqs[1].body["response_format"]["json_schema"]["schema"] == schema
    assert reqs[2].error is not None and reqs[2].error.code == ErrorCode.invalid_request
    assert {r.endpoint for r in reqs} == {Endpoint.completions}
    with pytest.raises(ConfigurationError):
        list(completion_requests("m", ["a"], custom_ids=["1", "2"]))


def test_completion_answers_decode_with_logprobs_and_checks() -> None:
    body = {
        "choices": [
            {
                "text": ' {"a": 1}',
                "finish_reason": "length",
                "logprobs": {
                    "tokens": [" {", '"a"'],
                    "token_logprobs": [-0.5, float("-inf")],
                    "top_logprobs": [{" {": -0.5, "x": -2.0}, None],
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    plain = Request(index=0, body={}, endpoint=Endpoint.completions, custom_id="c")
    got = to_completion_response(plain, Result(status_code=200, body=body, latency_s=0.5))
    assert got.content == ' {"a": 1}' and got.stop_reason is StopReason.out_of_tokens
    assert got.logprobs is not None and got.logprobs[0].logprobs_by_token == {" {": -0.5, "x": -2.0}
    assert got.logprobs[1].logprobs_by_token == {'"a"': -9999.0}  # -inf clamped as OpenAI
    assert got.metric("completion_tokens") == 2 and got.metric("latency") == 0.5
    strict = Request(
        index=0, body={}, endpoint=Endpoint.completions, response_schema={"type": "array"}
    )
    bad = to_completion_response(strict, Result(status_code=200, body=body))
    assert bad.error is not None and bad.error.code == ErrorCode.invalid_structured_output
    empty = to_completion_response(plain, Result(status_code=200, body={"choices": [{}]}))
    assert empty.error is not None and empty.error.code == ErrorCode.bad_upstream_response


async def test_batch_completion_against_the_stub(tmp_path: Path) -> None:
    faults = [Fault(StubReply(status=400, body={"error": {"message": "nope"}}), match="bad")]
    with StubServer(record_bodies=True, faults=faults) as stub:
        async with remote(stub, tmp_path) as client:
            got = await client.batch_completion(
                "smollm2",
                ["one two", "bad prompt", "three four five"],
                SamplingParams(max_tokens=3),
                custom_ids=["a", "b", "c"],
            )
    assert [r.content for r in got.batch] == ["echo: one two", "", "echo: three four"]
    assert [r.custom_id for r in got.batch] == ["a", "b", "c"]
    assert got.errors[0][0] == 1 and got.errors[0][1].code == ErrorCode.invalid_request
    assert got.batch[2].stop_reason is StopReason.out_of_tokens
    assert all("prompt" in b and "messages" not in b for b in stub.stats.bodies)


# ------------------------------------------------------------------------------ scoring


def _expected(prompt: list[int], start: int) -> tuple[float, bool]:
    scored = prompt[start:]
    return sum(token_logprob(t) for t in scored), all(t % 5 for t in scored)


async def test_loglikelihood_on_token_ids_reads_the_echoed_logprobs(tmp_path: Path) -> None:
    # the stub's top alternative beats tokens divisible by 5: pair b is not greedy
    pairs = [([11, 12], [13, 14]), ([21], [22, 25, 24]), ([31, 32, 33], [36]), ([1], [])]
    with StubServer(record_bodies=True) as stub:
        async with remote(stub, tmp_path) as client:
            got = await client.batch_loglikelihood("smollm2", pairs, custom_ids=list("abcd"))
    for (ctx, cont), item in zip(pairs[:3], got.batch, strict=False):
        logprob, greedy = _expected(ctx + cont, len(ctx))
        assert item.logprob == pytest.approx(logprob) and item.is_greedy is greedy
        assert item.num_tokens == len(cont)
    assert [r.is_greedy for r in got.batch[:3]] == [True, False, True]
    assert [i for i, _ in got.errors] == [3] and got.batch[3].custom_id == "d"
    # the stub is no vLLM server: the OpenAI body (echo + logprobs), never vLLM's field
    assert all(b["echo"] is True and "prompt_logprobs" not in b for b in stub.stats.bodies)
    assert len(stub.stats.bodies) == 3  # the empty continuation was never sent


async def test_text_scoring_without_a_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    with StubServer() as stub:
        async with remote(stub, tmp_path) as client:
            with pytest.raises(ConfigurationError, match="tokenizer"):
                await client.batch_loglikelihood("smollm2", [("a", " b")])
            with pytest.raises(ConfigurationError, match="tokenizer"):
                await client.batch_loglikelihood_rolling("smollm2", ["a b c"])
            assert stub.stats.requests == 0


@pytest.mark.slow
@pytest.mark.xdist_group("torch")  # tokenizer= is loaded by AutoTokenizer, which imports torch
async def test_text_scoring_with_a_local_tokenizer(tmp_path: Path) -> None:
    from providers import tokenizer

    tok = tokenizer()
    with StubServer(record_bodies=True) as stub:
        async with remote(stub, tmp_path, tokenizer=bundled_model_path()) as client:
            got = await client.batch_loglikelihood("smollm2", [("The capital is", " Paris")])
            rolled = await client.batch_loglikelihood_rolling("smollm2", ["The capital is Paris"])
    ctx, whole = tok(["The capital is"]).input_ids[0], tok(["The capital is Paris"]).input_ids[0]
    assert stub.stats.bodies[0]["prompt"] == whole
    assert got.batch[0].logprob == pytest.approx(_expected(whole, len(ctx))[0])
    # rolling: one window, the first token conditioned on the prefix token (BOS)
    assert stub.stats.bodies[1]["prompt"] == [tok.bos_token_id, *whole]
    assert rolled.batch[0].num_tokens == len(whole)


async def test_scoring_errors_from_the_server_are_per_item(tmp_path: Path) -> None:
    too_long = Fault(
        StubReply(status=400, body={"error": {"message": "maximum context length is 8 tokens"}}),
        match="99",
    )
    with StubServer(faults=[too_long], models=("smollm2",)) as stub:
        async with remote(stub, tmp_path, check_model=False) as client:
            got = await client.batch_loglikelihood("smollm2", [([1], [2]), ([99], [2])])
            unknown = await client.batch_loglikelihood("nope", [([1], [2])])
    assert got.batch[0].ok and got.batch[1].error is not None
    assert got.batch[1].error.code == ErrorCode.context_length_exceeded
    assert unknown.batch[0].error is not None
    assert unknown.batch[0].error.code == ErrorCode.model_not_found


# ------------------------------------------------------------------------------ embeddings


def test_embedding_requests_and_answers() -> None:
    reqs = list(embedding_requests("m", ["a", "", [1, 2]], "base64"))
    assert reqs[0].body == {"model": "m", "input": "a", "encoding_format": "base64"}
    assert reqs[1].error is not None and reqs[2].body["input"] == [1, 2]
    with pytest.raises(ConfigurationError):
        embedding_requests("m", ["a"], "binary")  # type: ignore[arg-type]  # raised now
    ok = {"data": [{"embedding": [0.5, 1]}], "usage": {"prompt_tokens": 2}}
    item = to_embedding_response(reqs[0], Result(status_code=200, body=ok))
    assert item.embedding == [0.5, 1.0] and item.vector == [0.5, 1.0]
    bad: tuple[dict[str, Any], ...] = (
        {},
        {"data": []},
        {"data": [{"embedding": "x"}]},
        {"data": [{"embedding": [True]}]},
    )
    for body in bad:
        got = to_embedding_response(reqs[0], Result(status_code=200, body=body))
        if isinstance((body.get("data") or [{}])[0].get("embedding"), str):
            continue  # base64 text is decoded on demand
        assert got.error is not None and got.error.code == ErrorCode.bad_upstream_response


async def test_batch_embeddings_float_and_base64_against_the_stub(tmp_path: Path) -> None:
    with StubServer(record_bodies=True) as stub:
        async with remote(stub, tmp_path) as client:
            floats = await client.batch_embeddings("smollm2", ["cat", "dog", ""])
            b64 = await client.batch_embeddings("smollm2", ["cat", "dog"], encoding_format="base64")
    assert floats.batch[0].vector == pytest.approx(stub_vector("cat"))
    assert isinstance(b64.batch[0].embedding, str)
    assert b64.embeddings[1] == pytest.approx(stub_vector("dog"), abs=1e-6)
    assert [i for i, _ in floats.errors] == [2]
    # each call's two inputs go in one request (tests/remote/test_embed_groups.py)
    assert [b["input"] for b in stub.stats.bodies] == [["cat", "dog"], ["cat", "dog"]]


async def test_a_provider_without_an_endpoint_refuses_the_call(tmp_path: Path) -> None:
    from batchclient import Provider

    class ChatOnly(Provider):
        async def execute(self, request: Request) -> Result:
            raise AssertionError("never called")

    async with BatchClient(ChatOnly(), state_dir=tmp_path) as client:
        with pytest.raises(ConfigurationError, match="/v1/embeddings"):
            await client.batch_embeddings("m", ["x"])
        with pytest.raises(ConfigurationError, match="/v1/completions"):
            await client.batch_completion("m", ["x"])
        record = await client.files.create(b"{}\n")
        with pytest.raises(ConfigurationError, match=r"^endpoint '/v1/embeddings' is not served"):
            await client.batches.create(record.id, endpoint=Endpoint.embeddings)
        with pytest.raises(ConfigurationError, match="token ids"):
            ChatOnly.endpoints = frozenset(Endpoint)
            await client.batch_loglikelihood("m", [("a", "b")])


async def test_on_item_sees_every_item_once(tmp_path: Path) -> None:
    seen: list[tuple[int, Any]] = []
    with StubServer(latency_s=0.002, jitter_s=0.01) as stub:
        async with remote(stub, tmp_path) as client:
            got = await client.batch_embeddings(
                "smollm2", [f"t{i}" for i in range(40)], on_item=lambda i, r: seen.append((i, r))
            )
    assert sorted(i for i, _ in seen) == list(range(40))
    assert all(isinstance(r, EmbeddingResponse) and r == got.batch[i] for i, r in seen)


def test_stub_vectors_are_unit_vectors() -> None:
    assert sum(v * v for v in stub_vector("x")) == pytest.approx(1.0)
    assert json.dumps(stub_vector("x"))  # JSON-ready
    assert anyio  # imported for the async tests


# ------------------------------------------------------------------------------ whole-call errors


@pytest.mark.slow
@pytest.mark.xdist_group("torch")  # tokenizer= is loaded by AutoTokenizer, which imports torch
async def test_every_call_kind_checks_its_arguments_before_sending(tmp_path: Path) -> None:
    """Bad arguments are a ``ConfigurationError`` raised by the call itself, before any request
    is built or sent (not an ``ExceptionGroup`` out of the scheduler's task group)."""
    from batchclient import BatchAPIBatchInference
    from batchclient.testing import BatchAPIStub

    chat = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    two = SamplingParams(max_tokens=2)
    bad_format: Any = "x"
    bad_params: Any = [{"max_tokens": -1}]

    def calls(client: BatchClient) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
        return [
            (
                "encoding_format",
                lambda: client.batch_embeddings("smollm2", ["a"], encoding_format=bad_format),
            ),
            (
                "custom_ids",
                lambda: client.batch_embeddings("smollm2", ["a", "b"], custom_ids=["x"]),
            ),
            (
                "custom_ids",
                lambda: client.batch_completion("smollm2", ["a", "b"], custom_ids=["x"]),
            ),
            ("sampling_params", lambda: client.batch_completion("smollm2", ["a", "b"], [two])),
            (
                "sampling_params",
                lambda: client.batch_completion("smollm2", ["a"], bad_params),
            ),
            ("logprobs", lambda: client.batch_completion("smollm2", ["a"], logprobs=[None, None])),
            ("custom_ids", lambda: client.batch_chat_completion("smollm2", chat, custom_ids=["x"])),
            ("sampling_params", lambda: client.batch_chat_completion("smollm2", chat, [two])),
            (
                "response_format",
                lambda: client.batch_chat_completion("smollm2", chat, response_format=[None]),
            ),
            (
                "custom_ids",
                lambda: client.batch_loglikelihood("smollm2", [([1], [2])], custom_ids=[]),
            ),
            (
                "custom_ids",
                lambda: client.batch_loglikelihood_rolling("smollm2", ["a"], custom_ids=[]),
            ),
        ]

    with StubServer() as stub:
        async with remote(stub, tmp_path, tokenizer=bundled_model_path()) as client:
            for name, call in calls(client):
                with pytest.raises(ConfigurationError, match=name):
                    await call()
        assert stub.stats.requests == 0
    with BatchAPIStub() as api:
        async with BatchAPIBatchInference(
            api.url, poll_interval_s=0.02, state_dir=tmp_path / "api"
        ) as api_client:
            for name, call in calls(api_client)[:9]:  # the Batch API does no scoring
                with pytest.raises(ConfigurationError, match=name):
                    await call()
            assert await api_client.files.list() == [] and await api_client.batches.list() == []
