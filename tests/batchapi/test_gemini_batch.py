"""``GeminiBatchInference`` through the real ``google-genai`` SDK against the Gemini Batch API
stub on loopback (``batchclient.testing.GeminiBatchStub``): inline and uploaded-file batches,
results out of order, refused and unsupported items, resubmission of what expired or failed
retryably (and only that), 429 / 5xx on create and polling, lost create answers, a stuck batch
cancelled. Crash and resume: ``tests/batchapi/test_batch_api_resume.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from batchclient import (
    BatchInference,
    GeminiBatchInference,
    LogProbConfig,
    SamplingParams,
    make_client,
)
from batchclient.batchapi._gemini import GeminiBackend
from batchclient.batchapi._gemini_files import inline_requests
from batchclient.batchapi._gemini_translate import to_request
from batchclient.cli import main
from batchclient.errors import ConfigurationError
from batchclient.remote import RetryPolicy
from batchclient.testing import GeminiBatchStub, StubReply
from batchclient.types import TopKSamplingStrategy
from jobs_util import jsonl, line, read_jsonl, until

FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)
KEY = "test-key"
# one test process imports the google-genai SDK for the module
pytestmark = pytest.mark.xdist_group("gemini")


def client(stub: GeminiBatchStub, state: Path, **kwargs: Any) -> GeminiBatchInference:
    return GeminiBatchInference(
        stub.url, api_key=KEY, poll_interval_s=0.02, retry=FAST, state_dir=state, **kwargs
    )


def convo(texts: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": t}] for t in texts]


def texts(result: Any) -> list[str | None]:
    return [None if i.error else i.completion_message.content for i in result.batch]


async def test_inline_batch_out_of_order_with_refused_items(tmp_path: Path) -> None:
    with GeminiBatchStub(api_key=KEY, shuffle=True, refuse_match="BAD") as stub:
        async with client(stub, tmp_path) as c:
            assert isinstance(c, BatchInference)
            prompts = [f"q{i}" + (" BAD" if i in (2, 5) else "") for i in range(12)]
            result = await c.batch_chat_completion(
                "gemini-x", convo(prompts), custom_ids=[f"c{i}" for i in range(12)]
            )
    assert [i.custom_id for i in result.batch] == [f"c{i}" for i in range(12)]
    for i, item in enumerate(result.batch):
        if i in (2, 5):  # INVALID_ARGUMENT is final: not resubmitted
            assert item.error is not None and item.error.code == "invalid_request"
        else:
            assert item.error is None and item.completion_message is not None
            assert item.completion_message.content == f"echo: q{i}"
            usage = {m.metric: m.value for m in item.metrics or []}
            assert usage["prompt_tokens"] == 1 and usage["completion_tokens"] == 2
    assert (stub.stats.creates, stub.stats.uploads, stub.stats.requests) == (1, 0, 12)


async def test_large_part_is_uploaded_as_a_file(tmp_path: Path) -> None:
    with GeminiBatchStub(api_key=KEY, shuffle=True) as stub:
        async with client(stub, tmp_path, inline_bytes=0) as c:
            result = await c.batch_chat_completion("gemini-x", convo([f"f{i}" for i in range(9)]))
    assert texts(result) == [f"echo: f{i}" for i in range(9)]
    assert (stub.stats.creates, stub.stats.uploads, stub.stats.downloads) == (1, 1, 1)
    assert stub.stats.upload_bytes > 0 and stub.stats.inline_bytes < 400


async def test_size_aware_packing_splits_into_parts(tmp_path: Path) -> None:
    with GeminiBatchStub(api_key=KEY) as stub:
        async with client(stub, tmp_path, max_lines=4) as c:
            result = await c.batch_chat_completion("gemini-x", convo([f"p{i}" for i in range(10)]))
    assert texts(result) == [f"echo: p{i}" for i in range(10)]
    assert stub.stats.creates == 3 and stub.stats.requests == 10


async def test_unsupported_field_is_an_item_error_never_sent(tmp_path: Path) -> None:
    top_k = SamplingParams(strategy=TopKSamplingStrategy(temperature=0.5, top_k=3), max_tokens=7)
    with GeminiBatchStub(api_key=KEY) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion(
                "gemini-x", convo(["a", "b"]), logprobs=LogProbConfig(top_k=2)
            )
            penalty = await c.batch_chat_completion(
                "gemini-x", convo(["p"]), SamplingParams(repetition_penalty=1.2)
            )
            ok = await c.batch_chat_completion("gemini-x", convo(["c"]), top_k)
    for item in result.batch:
        assert item.error is not None and item.error.code == "unsupported_parameter"
        assert item.error.param == "logprobs"
    assert penalty.batch[0].error is not None
    assert penalty.batch[0].error.param == "repetition_penalty"
    assert texts(ok) == ["echo: c"]
    assert stub.stats.requests == 1
    ((_, sent),) = next(iter(stub.batches.values())).items
    assert sent["generationConfig"] == {"temperature": 0.5, "topK": 3, "maxOutputTokens": 7}


async def test_retryable_and_expired_items_resubmitted_only(tmp_path: Path) -> None:
    prompts = [f"r{i}" + (" FLAKY" if i == 1 else "") for i in range(6)]
    with GeminiBatchStub(api_key=KEY, flaky_match="FLAKY", expire_after=4) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("gemini-x", convo(prompts))
    assert texts(result) == [f"echo: {p}" for p in prompts]
    # batch 1 answers r0, r2, r3 and fails r1 retryably, then expires before r4, r5;
    # batch 2 carries r1, r4, r5 only: nothing that succeeded is sent twice
    assert stub.stats.creates == 2
    assert stub.stats.keys == ["0", "1", "2", "3", "4", "5", "1", "4", "5"]


async def test_retries_run_out_after_max_attempts(tmp_path: Path) -> None:
    with GeminiBatchStub(api_key=KEY, expire_after=0) as stub:
        async with client(stub, tmp_path, max_attempts=2) as c:
            result = await c.batch_chat_completion("gemini-x", convo(["a", "b"]))
    assert all(i.error is not None and i.error.code == "batch_expired" for i in result.batch)
    assert stub.stats.creates == 2


@pytest.mark.parametrize("inline_bytes", [0, 1024**2], ids=["file", "inline"])
async def test_a_malformed_answer_fails_only_its_own_item(
    tmp_path: Path, inline_bytes: int
) -> None:
    prompts = ["r0", "r1 ODD", "r2", "r3 INT", "r4 HUGE", "r5"]
    kinds = {"ODD": "response", "INT": "candidates", "HUGE": "usage"}
    with GeminiBatchStub(api_key=KEY, shuffle=True, malformed=kinds) as stub:
        async with client(stub, tmp_path, inline_bytes=inline_bytes) as c:
            result = await c.batch_chat_completion("gemini-x", convo(prompts))
    assert texts(result) == ["echo: r0", None, "echo: r2", None, None, "echo: r5"]
    assert [i.error.code for i in result.batch if i.error] == ["bad_upstream_response"] * 3
    assert stub.stats.creates == 1 and stub.stats.uploads == (1 if inline_bytes == 0 else 0)


async def test_429_and_5xx_on_create_and_polling(tmp_path: Path) -> None:
    busy = StubReply(status=429, body={"error": {"code": 429}}, headers={"Retry-After": "0.05"})
    down = StubReply(status=503, body={"error": {"code": 503, "message": "down"}})
    with GeminiBatchStub(
        api_key=KEY, create_faults=[busy, busy], poll_faults=[down, busy, down]
    ) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("gemini-x", convo(["x", "y"]))
    assert texts(result) == ["echo: x", "echo: y"]
    assert stub.stats.creates == 3 and len(stub.batches) == 1  # the 429s created nothing
    assert stub.stats.lists == 0  # a 429 needs no search for a batch it may have made


async def test_lost_create_answer_is_found_not_repeated(tmp_path: Path) -> None:
    with GeminiBatchStub(api_key=KEY, lose_creates=1) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("gemini-x", convo(["x", "y"]))
    assert texts(result) == ["echo: x", "echo: y"]
    assert stub.stats.creates == 1 and len(stub.batches) == 1 and stub.stats.lists >= 1


async def test_a_file_naming_two_models_is_refused_before_any_create(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, ["a", "b"])
    path.write_text(path.read_text().replace('"gemini-x"', '"gemini-y"', 1))
    with GeminiBatchStub(api_key=KEY) as stub:
        async with client(stub, tmp_path) as c:
            record = await c.files.create(path)
            job = await c.schedule_batch(record.id)
            info = await c.batches.wait(job.job_id)
    assert info.status == "failed" and info.errors is not None
    assert info.errors.data[0].code == "mismatched_model"  # a Gemini batch runs one model
    assert stub.stats.creates == 0


async def test_progress_counts_from_batch_stats(tmp_path: Path) -> None:
    with GeminiBatchStub(api_key=KEY, item_delay_s=0.15) as stub:  # 1.8 s to look midway
        async with client(stub, tmp_path) as c:
            record = await c.files.create(_jsonl(tmp_path, [f"s{i}" for i in range(12)]))
            job = await c.schedule_batch(record.id)

            async def midway() -> bool:
                counts = (await c.batches.retrieve(job.job_id)).request_counts
                return 0 < counts.completed < 12

            await until(midway, within=20, every=0.02)  # counted while the batch runs
            info = await c.batches.wait(job.job_id)
    assert info.status == "completed" and info.request_counts.completed == 12


async def test_stuck_batch_is_cancelled_on_job_cancel_keeping_nothing_twice(
    tmp_path: Path,
) -> None:
    with GeminiBatchStub(api_key=KEY, stuck=True) as stub:
        async with client(stub, tmp_path) as c:
            record = await c.files.create(_jsonl(tmp_path, ["s0", "s1"]))
            job = await c.schedule_batch(record.id)
            await until(lambda: stub.stats.polls >= 2, within=20)
            await c.job_cancel(job.job_id)
            info = await c.batches.wait(job.job_id)
    assert info.status == "cancelled" and stub.stats.cancels == 1
    assert stub.stats.creates == 1


@pytest.mark.slow  # seconds of waiting: the full suite runs it
async def test_stuck_batch_past_the_window_expires(tmp_path: Path) -> None:
    with GeminiBatchStub(api_key=KEY, stuck=True) as stub:
        async with client(stub, tmp_path, completion_window="1s", expiry_grace_s=0) as c:
            result = await c.batch_chat_completion("gemini-x", convo(["a"]))
    assert result.batch[0].error is not None and result.batch[0].error.code == "batch_expired"
    assert stub.stats.cancels == 1 and stub.stats.creates == 1


async def test_sdk_inline_path_sends_the_translation_unchanged(tmp_path: Path) -> None:
    """What the stub receives through ``InlinedRequest`` + ``GenerateContentConfig`` equals the
    translated request: the SDK's own conversion loses nothing we send."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    body = {
        "model": "gemini-x",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "cold"},
        ],
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": schema}}],
        "tool_choice": "required",
        "max_tokens": 9, "temperature": 0.3, "stop": ["x"],
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
    }  # fmt: skip
    path = tmp_path / "part.jsonl"
    expected = to_request(body)
    path.write_text(
        '{"key": "0", "request": '
        + __import__("json").dumps({**expected, "model": "models/gemini-x"})
        + "}\n"
    )
    from google import genai
    from google.genai import types

    with GeminiBatchStub(api_key=KEY) as stub:
        model, src = inline_requests(path)
        sdk = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=stub.url))
        await sdk.aio.batches.create(model=model, src=src)
        await sdk.aio.aclose()
        ((key, sent),) = next(iter(stub.batches.values())).items
    assert key == "0"
    # the SDK writes function declarations with proto field names (parameters_json_schema),
    # which proto JSON parsers take as the camelCase name: the same field
    declaration = sent["tools"][0]["functionDeclarations"][0]
    declaration["parametersJsonSchema"] = declaration.pop("parameters_json_schema")
    assert sent == {**expected, "model": "models/gemini-x"}


def test_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="GEMINI_API_KEY"):
        GeminiBatchInference(state_dir=tmp_path)
    monkeypatch.setenv("GOOGLE_API_KEY", "g")
    assert _key(GeminiBatchInference(state_dir=tmp_path)) == "g"
    monkeypatch.setenv("GEMINI_API_KEY", "m")
    assert _key(GeminiBatchInference(state_dir=tmp_path)) == "m"
    with pytest.raises(ConfigurationError):
        GeminiBatchInference(api_key="k", max_attempts=0, state_dir=tmp_path)
    with pytest.raises(ConfigurationError, match="20 MB"):
        GeminiBatchInference(api_key="k", inline_bytes=20 * 1024**2, state_dir=tmp_path)


def _key(client: GeminiBatchInference) -> str:
    backend = client.provider.backend
    assert isinstance(backend, GeminiBackend)
    return backend.api_key


def test_cli_run_with_the_gemini_batch_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)  # the key from the environment
    inp, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    inp.write_bytes(jsonl([line(f"r{i}", f"n{i}" + (" BAD" if i == 2 else "")) for i in range(5)]))
    args = [
        "run", str(inp), "-o", str(out), "--errors", str(err), "--provider", "gemini-batch",
        "--poll-interval", "0.02", "--state-dir", str(tmp_path / "s"), "--no-progress",
    ]  # fmt: skip
    with GeminiBatchStub(api_key=KEY, refuse_match="BAD", shuffle=True) as stub:
        assert main([*args, "--base-url", stub.url]) == 0
        assert main([*args, "--base-url", stub.url]) == 0  # done: rebuilds, sends nothing
        assert stub.stats.creates == 1
    rows = read_jsonl(out)
    assert [r["custom_id"] for r in rows] == ["r0", "r1", "r3", "r4"]
    assert rows[0]["response"]["body"]["choices"][0]["message"]["content"] == "echo: n0"
    assert [r["custom_id"] for r in read_jsonl(err)] == ["r2"]
    built = make_client("gemini-batch", state_dir=tmp_path)
    assert isinstance(built, GeminiBatchInference)
    assert built.base_url == "https://generativelanguage.googleapis.com"


def _jsonl(tmp_path: Path, prompts: list[str]) -> Path:
    import json

    path = tmp_path / "in.jsonl"
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "gemini-x", "messages": [{"role": "user", "content": p}]}}
        for i, p in enumerate(prompts)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.slow
@pytest.mark.heavy
async def test_ten_thousand_conversations_are_one_uploaded_create(tmp_path: Path) -> None:
    prompts = [f"Question {i}: " + " ".join(f"w{j}" for j in range(40)) for i in range(10_000)]
    with GeminiBatchStub(api_key=KEY, shuffle=True) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("gemini-x", convo(prompts))
    assert texts(result) == [f"echo: {p}" for p in prompts]
    assert (stub.stats.creates, stub.stats.uploads, stub.stats.requests) == (1, 1, 10_000)


async def test_batch_embeddings_go_as_an_embeddings_batch(tmp_path: Path) -> None:
    with GeminiBatchStub(api_key=KEY, shuffle=True, refuse_match="BAD") as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_embeddings(
                "gemini-embedding-001", ["one text", "two texts here", "a BAD one", "four"]
            )
            again = await c.batch_embeddings("gemini-embedding-001", ["four"])
        assert stub.stats.uploads == 2 and stub.stats.creates == 2  # one file-based batch each
    vectors = result.embeddings
    assert [len(v) for v in vectors] == [8, 8, 0, 8]
    assert vectors[3] == again.embeddings[0]  # the same text, the same vector
    [(at, error)] = result.errors
    assert at == 2 and error.code == "invalid_request"
    # the first number of the stub's vector is the text's word count / 1,000: in order
    assert [round(v[0] * 1000) for i, v in enumerate(vectors) if i != 2] == [2, 3, 1]


def test_embedding_requests_one_text_each() -> None:
    from batchclient.batchapi._gemini_translate import Unsupported, embedding_request

    request = embedding_request({"model": "m", "input": ["hello"], "dimensions": 256})
    assert request == {"content": {"parts": [{"text": "hello"}]}, "outputDimensionality": 256}
    for body, param in (
        ({"model": "m", "input": ["a", "b"]}, "input"),
        ({"model": "m", "input": [1, 2, 3]}, "input"),
        ({"model": "m", "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m", "input": "a", "truncate": True}, "truncate"),
    ):
        with pytest.raises(Unsupported) as caught:
            embedding_request(body)
        assert caught.value.param == param
