"""``AnthropicBatchInference`` against the Message Batches stub, through the real ``anthropic``
SDK (a shape the SDK would not parse fails here): translation both ways, packing, per-item
errors, resubmission of only what needs it, 429 / 5xx on create and polling, a lost create
answer, cancel keeping what finished, ``anthropic-version`` and sampling fields, ids mapped and
back, and the CLI. Crash and resume: ``tests/batchapi/test_batch_api_resume.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import AnthropicBatchInference, ConfigurationError, make_client
from batchclient.batchapi._anthropic import AnthropicBackend
from batchclient.batchapi._anthropic_translate import error_of, to_completion, to_params
from batchclient.cli import main
from batchclient.remote import RetryPolicy
from batchclient.testing import AnthropicBatchStub, StubReply
from jobs_util import jsonl, line, read_jsonl, until

FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)
KEY = "sk-ant-test"
# one test process imports the anthropic SDK (seconds) for the module
pytestmark = pytest.mark.xdist_group("anthropic")


def client(stub: AnthropicBatchStub, state: Path, **kw: Any) -> AnthropicBatchInference:
    kw.setdefault("poll_interval_s", 0.02)
    return AnthropicBatchInference(stub.url, api_key=KEY, retry=FAST, state_dir=state, **kw)


def msgs(texts: list[str]) -> list[list[dict[str, Any]]]:
    return [[{"role": "user", "content": t}] for t in texts]


def contents(result: Any) -> list[str | None]:
    return [getattr(i.completion_message, "content", None) for i in result.batch]


# ---------------------------------------------------------------------------- translation


def test_translation_keeps_system_stop_sampling_tools_and_schema() -> None:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = {"type": "function", "function": {"name": "weather", "description": "w",
            "parameters": parameters}}  # fmt: skip
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {
        "model": "claude-x",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": [{"type": "text", "text": "and kind"}]},
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "cold"},
        ],
        "stop": "END",
        "temperature": 0.0,
        "n": 1,
        "tools": [tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }
    params = to_params(body, max_tokens=100)
    assert params == {
        "model": "claude-x",
        "max_tokens": 100,
        "system": "be brief\n\nand kind",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "cold"}],
            },
        ],
        "stop_sequences": ["END"],
        "temperature": 0.0,
        "tools": [{"name": "weather", "description": "w", "input_schema": parameters}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"seed": 7}, "seed"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"some_new_field": 1}, "some_new_field"),
    ],
)
def test_a_field_anthropic_cannot_honour_is_refused_never_dropped(
    extra: dict[str, Any], param: str
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
    refused = to_params(body, max_tokens=10)
    assert not isinstance(refused, dict) and refused.error is not None
    assert (refused.error.code, refused.error.param) == ("unsupported_parameter", param)


def test_sampling_fields_under_a_version_without_them_name_the_way_out() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 0.9}
    refused = to_params(body, max_tokens=10, api_version="2026-10-21")
    assert not isinstance(refused, dict) and refused.error is not None
    assert refused.error.code == "unsupported_parameter" and refused.error.param == "top_p"
    assert "2023-06-01" in refused.error.message
    late = {"model": "m", "messages": [{"role": "user", "content": "x"},
                                      {"role": "system", "content": "late"}]}  # fmt: skip
    assert not isinstance(to_params(late, max_tokens=10), dict)


def test_answers_come_back_as_openai_chat_completions() -> None:
    message = {
        "id": "msg_1", "model": "claude-x", "stop_reason": "tool_use",
        "content": [{"type": "text", "text": "let me see"},
                    {"type": "tool_use", "id": "tu", "name": "weather", "input": {"city": "Oslo"}}],
        "usage": {"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 4},
    }  # fmt: skip
    body = to_completion(message)
    choice = body["choices"][0]
    assert (body["object"], choice["finish_reason"]) == ("chat.completion", "tool_calls")
    assert choice["message"]["content"] == "let me see"
    call = choice["message"]["tool_calls"][0]
    assert (call["id"], call["function"]["name"]) == ("tu", "weather")
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert body["usage"] == {
        "prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11,
        # cache reads as OpenAI reports them, writes under Anthropic's name
        "prompt_tokens_details": {"cached_tokens": 2}, "cache_creation_input_tokens": 0,
    }  # fmt: skip
    assert to_completion({"stop_reason": "max_tokens"})["choices"][0]["finish_reason"] == "length"
    assert error_of({"type": "error", "error": {"type": "overloaded_error", "message": "o"}})[2]
    code, _, retry = error_of({"error": {"type": "invalid_request_error", "message": "bad"}})
    assert (code, retry) == ("invalid_request", False)


# ---------------------------------------------------------------------------- end to end


@pytest.mark.slow
async def test_a_call_is_packed_sent_through_the_sdk_and_answered_in_order(tmp_path: Path) -> None:
    texts = [f"q{i}" for i in range(30)]
    with AnthropicBatchStub(api_key=KEY) as stub:
        async with client(stub, tmp_path, max_lines=7) as c:
            result = await c.batch_chat_completion("claude-x", msgs(texts))
    assert contents(result) == [f"echo: {t}" for t in texts]  # results came back shuffled
    assert (stub.stats.creates, stub.stats.requests, stub.stats.results) == (5, 30, 5)
    assert set(stub.stats.versions) == {"2023-06-01"} and stub.stats.by_status[401] == 0
    assert all(p["max_tokens"] == 4096 and p["temperature"] == 0.0 for p in stub.seen_params)
    metrics = {m.metric: m.value for m in result.batch[0].metrics or []}
    assert metrics["prompt_tokens"] == 1.0


@pytest.mark.slow
async def test_byte_packing_fills_parts_under_max_bytes(tmp_path: Path) -> None:
    texts = [f"{i:03d}" + "x" * 300 for i in range(12)]
    with AnthropicBatchStub(api_key=KEY) as stub:
        async with client(stub, tmp_path, max_bytes=2048) as c:
            result = await c.batch_chat_completion("claude-x", msgs([*texts, "y" * 5000]))
    assert contents(result)[:12] == [f"echo: {t}" for t in texts]
    assert result.batch[12].error is not None and result.batch[12].error.code == "invalid_request"
    assert stub.stats.creates == 3  # about 400 bytes a request: 5 + 5 + 2


@pytest.mark.slow  # seconds of waiting: the full suite runs it
async def test_only_retryable_errors_are_resubmitted(tmp_path: Path) -> None:
    texts = ["ok0", "BAD1", "BUSY2", "ok3", "BUSY4"]
    with AnthropicBatchStub(error_match="BAD", overload_match="BUSY") as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("claude-x", msgs(texts))
    assert contents(result) == ["echo: ok0", None, "echo: BUSY2", "echo: ok3", "echo: BUSY4"]
    error = result.batch[1].error
    assert error is not None and error.code == "invalid_request"
    assert "invalid_request_error" in error.message
    assert (stub.stats.creates, stub.stats.requests) == (2, 7)  # the second: the two BUSY
    assert stub.seen["ok0"] == 1 and stub.seen["BUSY2"] == 2


async def test_retryable_errors_end_after_max_attempts(tmp_path: Path) -> None:
    with AnthropicBatchStub(overload_match="BUSY", overload_times=9) as stub:
        async with client(stub, tmp_path, max_attempts=2) as c:
            result = await c.batch_chat_completion("claude-x", msgs(["ok", "BUSY"]))
    error = result.batch[1].error
    assert error is not None and error.code == "server_error" and "overloaded" in error.message
    assert contents(result)[0] == "echo: ok" and stub.stats.creates == 2


async def test_a_batch_that_expired_with_partial_results_resubmits_the_rest(
    tmp_path: Path,
) -> None:
    texts = [f"e{i}" for i in range(10)]
    with AnthropicBatchStub(expire_first=1, expire_keep=3) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("claude-x", msgs(texts))
    assert contents(result) == [f"echo: {t}" for t in texts]
    assert (stub.stats.creates, stub.stats.requests) == (2, 17)  # 10, then the 7 expired
    assert all(stub.seen[t] == 1 for t in texts)


async def test_still_expired_after_max_attempts_is_batch_expired(tmp_path: Path) -> None:
    with AnthropicBatchStub(expire_first=5, expire_keep=1) as stub:
        async with client(stub, tmp_path, max_attempts=2) as c:
            result = await c.batch_chat_completion("claude-x", msgs(["a", "b", "c"]))
            job = (await c.batches.list())[0]
    # every batch expires after its first request: a, then b on the second attempt; c never
    assert contents(result)[:2] == ["echo: a", "echo: b"]
    error = result.batch[2].error
    assert error is not None and error.code == "batch_expired"
    assert job.status == "expired" and (stub.stats.creates, stub.stats.requests) == (2, 5)


async def test_a_malformed_result_fails_only_its_own_item(tmp_path: Path) -> None:
    texts = ["ok0", "INT1", "ok2", "HUGE3", "ODD4", "ok5"]
    kinds = {"INT": "content", "HUGE": "usage", "ODD": "result"}
    with AnthropicBatchStub(malformed=kinds) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("claude-x", msgs(texts))
    assert contents(result) == ["echo: ok0", None, "echo: ok2", None, None, "echo: ok5"]
    assert [i.error.code for i in result.batch if i.error] == ["bad_upstream_response"] * 3
    assert stub.stats.creates == 1


async def test_429_and_5xx_on_create_and_polling_back_off_and_create_once(tmp_path: Path) -> None:
    faults = [StubReply(status=429, headers={"Retry-After": "0.05"}), StubReply(status=529)]
    polls = [StubReply(status=500), StubReply(status=429, headers={"retry-after": "0"})]
    with AnthropicBatchStub(create_faults=faults, poll_faults=polls) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("claude-x", msgs(["a", "b"]))
    assert contents(result) == ["echo: a", "echo: b"]
    assert (stub.stats.creates, stub.stats.create_calls) == (1, 3)
    assert stub.stats.by_status[529] == 1 and stub.stats.by_status[500] == 1


async def test_a_lost_create_answer_is_found_not_made_twice(tmp_path: Path) -> None:
    with AnthropicBatchStub(lose_creates=1) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("claude-x", msgs(["a", "b", "c"]))
    assert contents(result) == ["echo: a", "echo: b", "echo: c"]
    assert (stub.stats.creates, stub.stats.create_calls, stub.stats.lists) == (1, 1, 1)


async def test_a_lost_create_among_parts_of_one_size_finds_its_own_batch(tmp_path: Path) -> None:
    texts = [f"s{i}" for i in range(6)]
    slow = RetryPolicy(backoff_initial_s=0.5, backoff_max_s=0.5)  # the other create answers first
    with AnthropicBatchStub(lose_creates=1) as stub:
        async with AnthropicBatchInference(
            stub.url, api_key=KEY, poll_interval_s=0.02, retry=slow, max_lines=3, state_dir=tmp_path
        ) as c:
            result = await c.batch_chat_completion("claude-x", msgs(texts))
    assert contents(result) == [f"echo: {t}" for t in texts]
    assert (stub.stats.creates, stub.stats.requests) == (2, 6)  # the other part's is not taken


async def test_under_the_sdk_version_sampling_is_a_per_item_error(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line("plain", "a"), line("warm", "b", temperature=0.7),
                           line("topk", "c", top_k=5)]))  # fmt: skip
    with AnthropicBatchStub() as stub:
        async with client(stub, tmp_path / "s", api_version="2026-10-21") as c:
            record = await c.files.create(str(inp))
            job = await c.schedule_batch(record.id)
            await c.batches.wait(job.job_id)
            result = await c.job_result(job.job_id)
    by_id = {i.custom_id: i for i in result.batch}
    assert by_id["plain"].error is None
    for cid, param in (("warm", "temperature"), ("topk", "top_k")):
        error = by_id[cid].error
        assert error is not None and (error.code, error.param) == ("unsupported_parameter", param)
    assert set(stub.stats.versions) == {"2026-10-21"}
    assert (stub.stats.creates, stub.stats.requests, stub.stats.by_status[400]) == (1, 1, 0)


async def test_custom_ids_any_string_are_sent_mapped_and_come_back(tmp_path: Path) -> None:
    ids = ["a b/ü", "x" * 100, "ok_id-1", "0"]
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line(cid, f"t{n}") for n, cid in enumerate(ids)]))
    with AnthropicBatchStub() as stub:
        async with client(stub, tmp_path / "s") as c:
            record = await c.files.create(str(inp))
            job = await c.schedule_batch(record.id)
            await c.batches.wait(job.job_id)
            result = await c.job_result(job.job_id)
    assert [i.custom_id for i in result.batch] == ids
    assert contents(result) == [f"echo: t{n}" for n in range(4)]


async def test_job_cancel_cancels_remotely_and_keeps_what_finished(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    lines = [line(f"r{i}", f"n{i}" + (" STUCK" if i >= 4 else "")) for i in range(8)]
    inp.write_bytes(jsonl(lines))
    with AnthropicBatchStub(stuck_match="STUCK") as stub:
        async with client(stub, tmp_path / "s", max_lines=4) as c:
            record = await c.files.create(str(inp))
            job = await c.schedule_batch(record.id)
            await until(lambda: stub.stats.results >= 1 and stub.stats.creates == 2)
            # the first part's answers are read: cancel once they are committed too (on a
            # loaded machine the commit can trail the read)
            for _ in range(600):
                counts = (await c.batches.retrieve(job.job_id)).request_counts
                if counts is not None and counts.completed >= 4:
                    break
                await anyio.sleep(0.05)
            await c.job_cancel(job.job_id)
            info = await c.batches.wait(job.job_id)
            result = await c.job_result(job.job_id)
    assert info.status == "cancelled" and stub.stats.cancels == 1
    codes = [i.error.code if i.error else "ok" for i in result.batch]
    assert codes == ["ok"] * 4 + ["batch_cancelled"] * 4
    assert stub.stats.creates == 2  # a cancel is not resubmitted


def test_cli_run_with_the_anthropic_batch_provider(tmp_path: Path) -> None:
    inp, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    inp.write_bytes(jsonl([line(f"r{i}", f"n{i}" + (" BAD" if i == 2 else "")) for i in range(5)]))
    args = [
        "run", str(inp), "-o", str(out), "--errors", str(err), "--provider", "anthropic-batch",
        "--api-key", KEY, "--poll-interval", "0.02", "--state-dir", str(tmp_path / "s"),
        "--no-progress",
    ]  # fmt: skip
    with AnthropicBatchStub(api_key=KEY, error_match="BAD") as stub:
        assert main([*args, "--base-url", stub.url]) == 0
        assert main([*args, "--base-url", stub.url]) == 0  # done: rebuilds, sends nothing
        assert stub.stats.creates == 1
    rows = read_jsonl(out)
    assert [r["custom_id"] for r in rows] == ["r0", "r1", "r3", "r4"]
    assert rows[0]["response"]["body"]["choices"][0]["message"]["content"] == "echo: n0"
    assert [r["custom_id"] for r in read_jsonl(err)] == ["r2"]


def test_the_key_comes_from_the_environment_or_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    built = make_client("anthropic-batch", state_dir=tmp_path)
    assert isinstance(built, AnthropicBatchInference)
    backend = built.provider.backend
    assert isinstance(backend, AnthropicBackend) and backend.api_key == "from-env"
    assert built.base_url == "https://api.anthropic.com"
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        AnthropicBatchInference(state_dir=tmp_path)
    with pytest.raises(ConfigurationError, match="max_lines"):
        AnthropicBatchInference(api_key="k", max_lines=200_000, state_dir=tmp_path)


def test_tool_calls_come_back_as_openai_tool_calls_in_the_output_file(tmp_path: Path) -> None:
    tool = {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(jsonl([line("t", "please call a tool", tools=[tool], tool_choice="auto")]))
    args = [
        "run", str(inp), "-o", str(out), "--provider", "anthropic-batch", "--api-key", KEY,
        "--poll-interval", "0.02", "--state-dir", str(tmp_path / "s"), "--no-progress",
    ]  # fmt: skip
    with AnthropicBatchStub() as stub:
        assert main([*args, "--base-url", stub.url]) == 0
    assert stub.seen_params[0]["tools"][0]["name"] == "weather"
    assert stub.seen_params[0]["tool_choice"] == {"type": "auto"}
    choice = read_jsonl(out)[0]["response"]["body"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("weather", {"city": "Paris"})


async def test_the_provider_interface_runs_one_request_as_a_one_request_batch() -> None:
    from batchclient import make_provider
    from batchclient._core.request import Request

    with AnthropicBatchStub() as stub:
        provider = make_provider("anthropic-batch", api_key=KEY, base_url=stub.url,
                                 poll_interval_s=0.02)  # fmt: skip
        async with provider:
            body = {"model": "claude-x", "messages": [{"role": "user", "content": "one"}]}
            result = await provider.execute(Request(index=0, body=body))
            refused = await provider.execute(Request(index=1, body={**body, "n": 3}))
    assert result.body is not None
    assert result.body["choices"][0]["message"]["content"] == "echo: one"
    assert refused.error is not None and refused.error.code == "unsupported_parameter"
    assert stub.stats.creates == 1


@pytest.mark.slow
@pytest.mark.heavy
async def test_ten_thousand_conversations_are_one_create(tmp_path: Path) -> None:
    texts = [f"Question {i}: " + " ".join(f"w{j}" for j in range(40)) for i in range(10_000)]
    with AnthropicBatchStub(process_s=0.0) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("claude-x", msgs(texts))
    assert sum(i.error is None for i in result.batch) == 10_000
    assert contents(result)[9_999] == f"echo: {texts[9_999]}"
    assert (stub.stats.creates, stub.stats.requests, stub.stats.results) == (1, 10_000, 1)
