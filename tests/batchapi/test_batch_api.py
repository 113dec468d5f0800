"""``BatchAPIBatchInference`` against the misbehaving Batch API stub on loopback
(``batchclient.testing.BatchAPIStub``): ordered results and per-item errors, splits by lines and
bytes, expiry with partial output (filled or re-run live), validation failures mapped to lines,
5xx / 429 / malformed answers on polling, lost create answers, cancel, keys, the model check."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from batchclient import BatchAPIBatchInference, BatchInference, ModelNotFoundError
from batchclient.remote import RemoteProvider, RetryPolicy
from batchclient.testing import BatchAPIStub, StubReply, StubServer
from batchclient.types import ToolPromptFormat
from jobs_util import jsonl, line, read_jsonl, until

FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)


def client(stub: BatchAPIStub, state: Path, **kwargs: Any) -> BatchAPIBatchInference:
    return BatchAPIBatchInference(
        stub.url, poll_interval_s=0.02, retry=FAST, state_dir=state, **kwargs
    )


def convo(texts: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": t}] for t in texts]


def texts(result: Any) -> list[str | None]:
    return [None if i.error else i.completion_message.content for i in result.batch]


async def test_results_in_input_order_with_per_item_errors(tmp_path: Path) -> None:
    with BatchAPIStub(error_match="BAD") as stub:
        async with client(stub, tmp_path) as c:
            assert isinstance(c, BatchInference)
            prompts = [f"q{i}" + (" BAD" if i in (2, 5) else "") for i in range(7)]
            seen: list[Any] = []
            result = await c.batch_chat_completion(
                "smollm2", convo(prompts), custom_ids=[f"c{i}" for i in range(7)],
                progress=seen.append,
            )  # fmt: skip
    assert [i.custom_id for i in result.batch] == [f"c{i}" for i in range(7)]
    for i, item in enumerate(result.batch):
        if i in (2, 5):
            assert item.error is not None and item.error.code == "invalid_request"
            assert item.error.status_code == 400
        else:
            assert item.error is None and item.completion_message is not None
            assert item.completion_message.content == f"echo: q{i}"
    assert stub.stats.creates == 1 and stub.stats.lines == 7
    assert seen and seen[-1].total == 7 and (seen[-1].completed, seen[-1].failed) == (5, 2)


async def test_malformed_conversation_is_an_item_error_and_never_sent(tmp_path: Path) -> None:
    with BatchAPIStub() as stub:
        async with client(stub, tmp_path) as c:
            messages: list[Any] = [*convo(["a"]), [{"role": "nobody"}], *convo(["c"])]
            result = await c.batch_chat_completion("smollm2", messages)
    assert texts(result) == ["echo: a", None, "echo: c"]
    assert result.batch[1].error is not None and result.batch[1].error.code == "invalid_request"
    assert stub.stats.lines == 2


async def test_split_by_max_lines_runs_several_remote_batches(tmp_path: Path) -> None:
    with BatchAPIStub(line_delay_s=0.05) as stub:
        async with client(stub, tmp_path, max_lines=4) as c:
            prompts = [f"p{i}" for i in range(10)]
            result = await c.batch_chat_completion("smollm2", convo(prompts))
            job = (await c.batches.list())[0]
    assert texts(result) == [f"echo: p{i}" for i in range(10)]
    assert stub.stats.creates == 3 and stub.stats.lines == 10
    sizes = sorted(len(b.lines) for b in stub.batches.values())
    assert sizes == [2, 4, 4]
    assert job.status == "completed"
    calls = stub.calls  # all three were submitted before the first one's results came back
    assert max(i for i, c in enumerate(calls) if c == "create") < calls.index("download")


async def test_split_by_max_bytes_and_a_line_over_the_limit(tmp_path: Path) -> None:
    with BatchAPIStub() as stub:
        async with client(stub, tmp_path, max_bytes=1024) as c:
            prompts = ["x" * 300, "y" * 300, "z" * 2000, "w" * 300]
            result = await c.batch_chat_completion("smollm2", convo(prompts))
    assert texts(result)[:2] == ["echo: " + "x" * 300, "echo: " + "y" * 300]
    too_big = result.batch[2].error
    assert too_big is not None and too_big.code == "invalid_request"
    assert "max_bytes" in too_big.message
    assert texts(result)[3] == "echo: " + "w" * 300
    assert stub.stats.creates == 2  # 2 lines of ~420 bytes fit 1024; the third starts another
    assert max(b.bytes_in for b in stub.batches.values()) <= 1024


async def test_what_an_expired_batch_did_not_run_goes_into_a_new_batch(tmp_path: Path) -> None:
    with BatchAPIStub(expire_after=3) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("smollm2", convo([f"e{i}" for i in range(6)]))
            job = (await c.batches.list())[0]
    assert texts(result) == [f"echo: e{i}" for i in range(6)]
    assert job.status == "completed" and stub.stats.creates == 2
    assert [len(b.lines) for b in stub.batches.values()] == [6, 3]  # only what did not run


async def test_expired_after_max_attempts_keeps_finished_lines_and_expires_the_rest(
    tmp_path: Path,
) -> None:
    with BatchAPIStub(expire_after=3) as stub:
        async with client(stub, tmp_path, max_attempts=1) as c:
            result = await c.batch_chat_completion("smollm2", convo([f"e{i}" for i in range(6)]))
            job = (await c.batches.list())[0]
    assert texts(result)[:3] == ["echo: e0", "echo: e1", "echo: e2"]
    assert [i.error.code for i in result.batch[3:] if i.error] == ["batch_expired"] * 3
    assert job.status == "expired" and stub.stats.creates == 1
    assert (job.request_counts.completed, job.request_counts.failed) == (3, 3)


async def test_expired_lines_rerun_live_with_on_expired(tmp_path: Path) -> None:
    with BatchAPIStub(expire_after=2) as stub, StubServer(record_bodies=True) as live:
        fallback = RemoteProvider(live.url, retry=FAST)
        async with client(stub, tmp_path, on_expired=fallback, max_attempts=1) as c:
            result = await c.batch_chat_completion("smollm2", convo([f"r{i}" for i in range(5)]))
            job = (await c.batches.list())[0]
    assert texts(result) == [f"echo: r{i}" for i in range(5)]
    sent_live = sorted(b["messages"][0]["content"] for b in live.stats.bodies)
    assert sent_live == ["r2", "r3", "r4"]  # only what the remote batch did not run
    assert job.status == "completed"


async def test_failed_validation_maps_errors_to_lines_and_resubmits_the_rest(
    tmp_path: Path,
) -> None:
    with BatchAPIStub(refuse_match="REFUSE") as stub:
        async with client(stub, tmp_path) as c:
            prompts = ["a", "b REFUSE", "c", "d", "e REFUSE"]
            result = await c.batch_chat_completion("smollm2", convo(prompts))
    assert texts(result) == ["echo: a", None, "echo: c", "echo: d", None]
    for i in (1, 4):
        error = result.batch[i].error
        assert error is not None and error.code == "invalid_request"
        assert error.param == "body.messages" and error.message == "refused by the stub"
    assert stub.stats.creates == 2
    assert sorted(len(b.lines) for b in stub.batches.values()) == [3, 5]


async def test_failed_again_fails_every_line_with_batch_failed(tmp_path: Path) -> None:
    with BatchAPIStub(refuse_match="q") as stub:  # every line is refused, every time
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("smollm2", convo(["q1", "q2"]))
    assert [i.error.code for i in result.batch if i.error] == ["invalid_request"] * 2
    assert stub.stats.creates == 1  # nothing left to resubmit


async def test_polling_survives_5xx_429_and_malformed_answers(tmp_path: Path) -> None:
    faults = [
        StubReply(status=503),
        StubReply(status=429, headers={"Retry-After": "1"}),
        StubReply(status=500),
        StubReply(status=200, raw=b"not json"),
        StubReply(status=200, body={"id": "x", "status": "no-such-status"}),
    ]
    with BatchAPIStub(poll_faults=faults) as stub:
        async with client(stub, tmp_path) as c:
            started = time.monotonic()
            result = await c.batch_chat_completion("smollm2", convo(["a", "b"]))
            took = time.monotonic() - started
    assert texts(result) == ["echo: a", "echo: b"]
    assert stub.stats.polls >= 6 and stub.stats.creates == 1
    gaps = [b - a for a, b in zip(stub.poll_times, stub.poll_times[1:], strict=False)]
    assert gaps[1] >= 0.95  # the poll after the 429 waited for its Retry-After
    assert took >= 1.0


@pytest.mark.slow
async def test_polling_outlasts_more_than_a_thousand_failed_polls(tmp_path: Path) -> None:
    # the backoff doubles per failure: past the 1,024th it must stay capped, not overflow
    tiny = RetryPolicy(backoff_initial_s=0.0001, backoff_max_s=0.0002)
    with BatchAPIStub(poll_faults=[StubReply(status=503)] * 1100) as stub:
        async with BatchAPIBatchInference(
            stub.url, poll_interval_s=0.02, retry=tiny, state_dir=tmp_path
        ) as c:
            result = await c.batch_chat_completion("smollm2", convo(["a", "b"]))
    assert texts(result) == ["echo: a", "echo: b"]
    assert stub.stats.polls > 1100 and stub.stats.creates == 1


async def test_a_lost_create_answer_never_submits_twice(tmp_path: Path) -> None:
    with BatchAPIStub(lose_creates=1) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("smollm2", convo(["a", "b", "c"]))
    assert texts(result) == ["echo: a", "echo: b", "echo: c"]
    assert stub.stats.creates == 1 and len(stub.batches) == 1
    assert stub.stats.lists >= 1  # it looked for the batch before creating another


async def test_missing_output_line_is_bad_upstream_response(tmp_path: Path) -> None:
    with BatchAPIStub(omit_match="GONE") as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("smollm2", convo(["a", "GONE", "c"]))
    assert texts(result) == ["echo: a", None, "echo: c"]
    error = result.batch[1].error
    assert error is not None and error.code == "bad_upstream_response"


async def test_malformed_output_lines_fail_only_their_own_items(tmp_path: Path) -> None:
    kinds = {"ARRAY": "object", "NOID": "custom_id", "BODY": "body", "TORN": "json"}
    kinds["HUGE"] = "usage"
    prompts = ["a", "b ARRAY", "c", "d NOID", "e BODY", "f TORN", "g HUGE", "h"]
    with BatchAPIStub(malformed=kinds) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("smollm2", convo(prompts))
    assert texts(result) == ["echo: a", None, "echo: c", None, None, None, None, "echo: h"]
    assert [i.error.code for i in result.batch if i.error] == ["bad_upstream_response"] * 5
    assert stub.stats.creates == 1  # a malformed answer is final: nothing is sent twice


async def test_schedule_batch_job_calls_and_openai_output(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line(f"r{i}", f"n{i}") for i in range(5)]))
    with BatchAPIStub(error_match="n3") as stub:
        async with client(stub, tmp_path / "state", max_lines=2) as c:
            record = await c.files.create(inp)
            job = await c.schedule_batch(record.id, metadata={"run": "t"})
            info = await c.batches.wait(job.job_id)
            assert await c.job_status(job.job_id) == "completed"
            result = await c.job_result(job.job_id)
            await c.batches.export(job.job_id, tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    assert info.status == "completed" and info.request_counts.total == 5
    assert (info.request_counts.completed, info.request_counts.failed) == (4, 1)
    assert [i.custom_id for i in result.batch] == [f"r{i}" for i in range(5)]
    out, err = read_jsonl(tmp_path / "out.jsonl"), read_jsonl(tmp_path / "err.jsonl")
    assert [r["custom_id"] for r in out] == ["r0", "r1", "r2", "r4"]
    assert err[0]["custom_id"] == "r3" and err[0]["response"]["status_code"] == 400
    assert stub.stats.creates == 3
    remote = [b.data["metadata"] for b in stub.batches.values()]
    assert {m["batchclient_job"] for m in remote} == {job.job_id}


async def test_cancel_cancels_remotely_and_keeps_what_finished(tmp_path: Path) -> None:
    with BatchAPIStub(line_delay_s=0.2) as stub:  # seconds left to cancel on a busy machine
        async with client(stub, tmp_path, max_lines=30) as c:
            record = await c.files.create(
                jsonl([line(f"r{i}", f"n{i}") for i in range(60)]), filename="in.jsonl"
            )
            job = await c.schedule_batch(record.id)

            async def some_done() -> bool:
                counts = (await c.batches.retrieve(job.job_id)).request_counts
                return counts.completed >= 5

            await until(some_done, within=10)
            await c.job_cancel(job.job_id)
            info = await c.batches.retrieve(job.job_id)
            result = await c.job_result(job.job_id)
    assert info.status == "cancelled" and stub.stats.cancels == 2
    assert all(b.data["status"] == "cancelled" for b in stub.batches.values())
    done = [i for i in result.batch if i.error is None]
    cancelled = [i for i in result.batch if i.error and i.error.code == "batch_cancelled"]
    assert len(done) >= 5 and len(done) + len(cancelled) == 60
    assert info.request_counts.completed == len(done)


async def test_api_key_is_sent_and_a_refusal_is_per_item(tmp_path: Path) -> None:
    with BatchAPIStub(api_key="sk-test") as stub:
        async with client(stub, tmp_path / "a", api_key="sk-test") as c:
            good = await c.batch_chat_completion("smollm2", convo(["a"]))
        async with client(stub, tmp_path / "b", api_key="wrong", check_model=False) as c:
            bad = await c.batch_chat_completion("smollm2", convo(["a", "b"]))
    assert texts(good) == ["echo: a"]
    assert [i.error.code for i in bad.batch if i.error] == ["authentication_error"] * 2
    assert bad.batch[0].error is not None and bad.batch[0].error.status_code == 401
    db = (tmp_path / "b" / "batchclient.sqlite3").read_bytes()
    assert b"wrong" not in db and b"sk-test" not in db  # the key is never stored


async def test_unknown_model_raises_before_anything_is_sent(tmp_path: Path) -> None:
    with BatchAPIStub() as stub:
        async with client(stub, tmp_path) as c:
            with pytest.raises(ModelNotFoundError):
                await c.batch_chat_completion("nope", convo(["a"]))
    assert stub.stats.uploads == 0


async def test_a_repeated_call_after_delivery_submits_again(tmp_path: Path) -> None:
    with BatchAPIStub() as stub:
        async with client(stub, tmp_path) as c:
            first = await c.batch_chat_completion("smollm2", convo(["a"]))
            second = await c.batch_chat_completion("smollm2", convo(["a"]))
    assert texts(first) == texts(second) == ["echo: a"]
    assert stub.stats.creates == 2  # a delivered call is not a cache


async def test_bad_arguments_are_configuration_errors(tmp_path: Path) -> None:
    from batchclient import ConfigurationError

    for kwargs in ({"max_lines": 0}, {"poll_interval": 0}, {"completion_window": "soon"}):
        with pytest.raises(ConfigurationError):
            BatchAPIBatchInference("http://127.0.0.1:1/v1", state_dir=tmp_path, **kwargs)
    with pytest.raises(ConfigurationError):
        BatchAPIBatchInference(
            "http://127.0.0.1:1/v1", api_key="key\r\nX-Evil: 1", state_dir=tmp_path
        )
    with pytest.raises(ConfigurationError):
        BatchAPIBatchInference("ftp://host/v1", state_dir=tmp_path)


async def test_scoring_text_without_a_tokenizer_says_what_works(tmp_path: Path) -> None:
    from batchclient import AnthropicBatchInference, ConfigurationError

    with BatchAPIStub() as stub:
        async with client(stub, tmp_path) as c:
            with pytest.raises(ConfigurationError, match="tokenizer=<local folder"):
                await c.batch_loglikelihood("smollm2", [("The capital is", " Paris")])
    assert stub.stats.uploads == 0  # refused before anything was sent
    chat_only = AnthropicBatchInference(api_key="k", state_dir=tmp_path / "a")
    with pytest.raises(ConfigurationError, match=r"cannot score: .* batch-api"):
        await chat_only.provider.tokenizer("claude-x")


async def test_output_lines_in_the_store_are_openai_batch_lines(tmp_path: Path) -> None:
    with BatchAPIStub() as stub:
        async with client(stub, tmp_path) as c:
            await c.batch_chat_completion("smollm2", convo(["a"]))
            job = (await c.batches.list())[0]
            path = await c.files.path(job.output_file_id or "")
            row = json.loads(path.read_text())
    assert row["custom_id"] == "0" and row["response"]["status_code"] == 200
    assert row["response"]["body"]["choices"][0]["message"]["content"] == "echo: a"


async def test_tools_in_the_prompt_are_written_into_each_line(tmp_path: Path) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    with BatchAPIStub() as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion(
                "smollm2",
                convo(["weather?"]),
                tools=[tool],
                tool_prompt_format=ToolPromptFormat.json,
            )
    body = next(iter(stub.batches.values())).lines[0]["body"]
    assert "tools" not in body and "get_weather" in json.dumps(body["messages"])
    assert texts(result) == ["echo: weather?"]  # a plain answer: no call in it


async def test_past_the_local_window_remote_batches_are_cancelled_and_kept(
    tmp_path: Path,
) -> None:
    with BatchAPIStub(line_delay_s=0.05) as stub:
        async with client(stub, tmp_path, completion_window="1s", expiry_grace_s=0) as c:
            result = await c.batch_chat_completion("smollm2", convo([f"w{i}" for i in range(60)]))
            job = (await c.batches.list())[0]
    done = [i for i in result.batch if i.error is None]
    expired = [i for i in result.batch if i.error and i.error.code == "batch_expired"]
    assert 0 < len(done) < 60 and len(done) + len(expired) == 60
    assert job.status == "expired" and stub.stats.cancels == 1
    assert [b.data["status"] for b in stub.batches.values()] == ["cancelled"]


async def test_the_provider_alone_runs_each_request_as_a_one_line_batch(tmp_path: Path) -> None:
    from batchclient import BatchClient
    from batchclient.batchapi import RemoteBatchProvider

    with BatchAPIStub(error_match="BAD") as stub:
        provider = RemoteBatchProvider.batch_api(stub.url, poll_interval_s=0.02, retry=FAST)
        async with BatchClient(provider, state_dir=tmp_path) as c:
            result = await c.batch_chat_completion("smollm2", convo(["a", "b BAD"]))
    assert texts(result) == ["echo: a", None]
    error = result.batch[1].error
    assert error is not None and error.status_code == 400
    assert stub.stats.creates == 2 and sorted(len(b.lines) for b in stub.batches.values()) == [1, 1]


async def test_an_abandoned_call_is_found_again_even_without_its_call_record(
    tmp_path: Path,
) -> None:
    import sqlite3

    import anyio

    prompts = convo([f"z{i}" for i in range(10)])
    with BatchAPIStub(line_delay_s=0.03) as stub:
        async with client(stub, tmp_path) as c, anyio.create_task_group() as tg:
            tg.start_soon(c.batch_chat_completion, "smollm2", prompts)
            await until(lambda: stub.stats.polls >= 1)
            tg.cancel_scope.cancel()  # the caller gives up while the batch runs
        assert stub.stats.creates == 1
        with sqlite3.connect(tmp_path / "batchclient.sqlite3") as db:  # as if it died unrecorded
            db.execute("DELETE FROM remote_calls")
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("smollm2", prompts)
    assert texts(result) == [f"echo: z{i}" for i in range(10)]
    assert stub.stats.creates == 1
